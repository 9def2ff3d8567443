"""The notify webhook sink against a real HTTP receiver on a local socket: the headers
and signature it sends, and how each answer is classified for the queue."""

from __future__ import annotations

import pytest

from app.domain.errors import NotificationFailed
from app.extensions.builds.signature import SIGNATURE_HEADER, verify
from app.extensions.notify.webhook import WebhookSink, host_of
from app.queue import classify
from tests.support.procs import free_port
from tests.support.receiver import receiver

pytestmark = pytest.mark.timeout(30)


def sink(url: str, secret: str = "k", timeout_s: float = 5) -> WebhookSink:
    return WebhookSink(queue="demo", name="team", url=url, secret=secret,
                       events=frozenset({"landed"}), fmt="json", timeout_s=timeout_s,
                       clock=lambda: 1_700_000_000.4)


async def test_a_delivery_is_signed_for_its_delivery_id() -> None:
    with receiver({"/hook?token=t0p": [202]}) as rec:
        code = await sink(f"{rec.base_url}/hook?token=t0p").send(
            delivery_id="demo/1/landed/team", event="landed", body=b'{"a":1}')
        assert code == 202
        (got,) = rec.on("/hook?token=t0p")
    assert got.body == b'{"a":1}'
    assert got.headers["x-submitqueue-delivery"] == "demo/1/landed/team"
    assert got.headers["x-submitqueue-event"] == "landed"
    assert got.headers[SIGNATURE_HEADER.lower()].startswith("t=1700000000,v1=")
    assert verify(b"k", "demo/1/landed/team", b'{"a":1}',
                  got.headers[SIGNATURE_HEADER.lower()], now_s=1_700_000_010) == 1_700_000_000


async def test_an_unsigned_endpoint_sends_no_signature() -> None:
    with receiver({"/slack": [200]}) as rec:
        await sink(f"{rec.base_url}/slack", secret="").send(
            delivery_id="d", event="removed", body=b"{}")
        (got,) = rec.on("/slack")
    assert SIGNATURE_HEADER.lower() not in got.headers


@pytest.mark.parametrize(("code", "retryable"), [
    (500, True), (502, True), (503, True), (408, True), (429, True),
    (501, False), (505, False), (400, False), (401, False), (404, False), (410, False),
    (302, False),
])
async def test_each_answer_is_classified(code: int, retryable: bool) -> None:
    with receiver({"/h/s3cret-path": [code]}) as rec, pytest.raises(NotificationFailed) as err:
        await sink(f"{rec.base_url}/h/s3cret-path").send(delivery_id="d", event="landed",
                                                          body=b"{}")
    assert err.value.retryable is retryable
    assert classify(err.value) is retryable  # what the queue decides from it
    text = str(err.value)
    assert f"answered HTTP {code}" in text and "s3cret-path" not in text
    assert ("sent again" in text) is retryable


async def test_an_unreachable_endpoint_is_retryable() -> None:
    url = f"http://127.0.0.1:{free_port()}/hook/s3cret"
    with pytest.raises(NotificationFailed) as err:
        await sink(url, timeout_s=2).send(delivery_id="d", event="landed", body=b"{}")
    assert err.value.retryable and classify(err.value)
    assert "could not be reached" in str(err.value) and "s3cret" not in str(err.value)


def test_host_of_hides_the_path() -> None:
    assert host_of("https://hooks.slack.com/services/T/B/x?y=1") == "https://hooks.slack.com/…"
    assert host_of("http://127.0.0.1:9000/a") == "http://127.0.0.1:9000/…"
