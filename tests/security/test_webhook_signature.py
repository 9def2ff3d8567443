"""Forged, replayed and stale CI callbacks (issue #12, item 1).

The signature ``t=<unix s>,v1=<HMAC-SHA256 of "<t>.<build id>.<raw body>">`` binds a
report to one build and one moment: build 2's genuine "succeeded", sent to build 3's
callback URL, is refused (401) and build 3 does not land; so are a timestamp more than
300 s off, a tampered body, and the retired body-only ``sha256=`` header. A replay onto
the *same* build within the window repeats what it said (204); a contradicting verdict
stays 409. The pure checks first, then through the real app."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.domain.states import BuildStatus
from app.extensions.builds import signature
from app.extensions.builds.signature import (
    FORMAT,
    SIGNATURE_HEADER,
    TOLERANCE_S,
    BadSignature,
    sign,
    verify,
)
from tests.ci_standin import CI, SECRET, running_ci, signed, webhook_queues
from tests.conftest import BACKENDS
from tests.e2e.harness import change, serve

pytestmark = pytest.mark.timeout(60)

KEY = SECRET.encode()
NOW = 1_700_000_000
BODY = b'{"status":"succeeded"}'


def message(exc: pytest.ExceptionInfo[BadSignature]) -> str:
    return str(exc.value)


# ---------------------------------------------------------------- the pure check


def test_a_signature_verifies_only_for_its_build_body_secret_and_window() -> None:
    header = sign(KEY, "wh-2", BODY, t=NOW)
    assert verify(KEY, "wh-2", BODY, header, now_s=NOW) == NOW
    assert verify(KEY, "wh-2", BODY, header, now_s=NOW + TOLERANCE_S) == NOW  # the edge
    assert verify(KEY, "wh-2", BODY, header, now_s=NOW - TOLERANCE_S) == NOW
    with pytest.raises(BadSignature) as other_build:
        verify(KEY, "wh-3", BODY, header, now_s=NOW)
    assert "'wh-3'" in message(other_build) and "does not match" in message(other_build)
    with pytest.raises(BadSignature):
        verify(KEY, "wh-2", b'{"status":"failed"}', header, now_s=NOW)  # tampered body
    with pytest.raises(BadSignature):
        verify(b"another secret", "wh-2", BODY, header, now_s=NOW)
    with pytest.raises(BadSignature) as stale:
        verify(KEY, "wh-2", BODY, header, now_s=NOW + TOLERANCE_S + 1)
    assert "301 s old" in message(stale) and "300 s" in message(stale)
    with pytest.raises(BadSignature) as future:
        verify(KEY, "wh-2", BODY, header, now_s=NOW - TOLERANCE_S - 1)
    assert "301 s in the future" in message(future)


def test_the_mac_covers_t_build_id_and_the_raw_body() -> None:
    mac = hmac.new(KEY, f"{NOW}.wh-2.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(KEY, "wh-2", BODY, t=NOW) == f"t={NOW},v1={mac}"
    # a t moved to a fresh time without the secret no longer matches its mac
    with pytest.raises(BadSignature):
        verify(KEY, "wh-2", BODY, f"t={NOW + 100},v1={mac}", now_s=NOW + 100)


def test_the_retired_body_only_scheme_is_refused_with_what_to_send_instead() -> None:
    old = "sha256=" + hmac.new(KEY, BODY, hashlib.sha256).hexdigest()
    with pytest.raises(BadSignature) as info:
        verify(KEY, "wh-2", BODY, old, now_s=NOW)
    assert "no longer accepted" in message(info) and FORMAT in message(info)


@pytest.mark.parametrize("header", [
    None, "", "   ", "garbage", f"t={NOW}", "v1=" + "a" * 64, f"t=soon,v1={'a' * 64}",
    f"t=-5,v1={'a' * 64}", f"t={NOW},t={NOW},v1={'a' * 64}", f"t={NOW},v1=abc",
    f"t={NOW},v1={'g' * 64}", f"t={NOW},v1={'a' * 64},x=1", f"t={NOW},v1={'a' * 64}," + "x" * 2000,
])
def test_a_missing_or_malformed_header_names_the_expected_format(header: str | None) -> None:
    with pytest.raises(BadSignature) as info:
        verify(KEY, "wh-2", BODY, header, now_s=NOW)
    assert FORMAT in message(info)


def test_one_matching_v1_of_several_is_enough_and_each_is_compared_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(signature.hmac, "compare_digest", spy)
    good = sign(KEY, "wh-2", BODY, t=NOW)
    rotated = sign(b"the old secret", "wh-2", BODY, t=NOW)
    both = f"{rotated},v1={good.split('v1=')[1]}"
    assert verify(KEY, "wh-2", BODY, both, now_s=NOW) == NOW
    assert len(calls) == 2  # every entry compared, with compare_digest
    with pytest.raises(BadSignature):
        verify(KEY, "wh-2", BODY, rotated, now_s=NOW)


# ---------------------------------------------------------------- through the app


@pytest.fixture
async def ci() -> AsyncIterator[CI]:
    async with running_ci() as service:
        yield service


async def wait_jobs(ci: CI, n: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while len(ci.jobs) < n:
        assert time.monotonic() < deadline, f"{len(ci.jobs)} CI jobs, not {n}"
        await __import__("asyncio").sleep(0.02)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_build_2s_genuine_callback_replayed_to_build_3_is_refused_and_build_3_does_not_land(
    database_url: str, tmp_path: Path, ci: CI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SQ_WEBHOOK_SECRET_CIQ", SECRET)
    (tmp_path / "queues.yaml").write_text(webhook_queues(ci))
    async with serve(database_url, tmp_path) as server:
        two = await server.land(change("two", files="a/x.py"), queue="ciq")
        three = await server.land(change("three", files="b/y.py"), queue="ciq")
        await wait_jobs(ci, 2)
        ci.server = server  # for ci.post only: it was unset as the jobs came, so no reports
        builds = {("two" if any("two" in u for u in j["head_changes"]) else "three"):
                  j["build_id"] for j in ci.jobs.values()}
        b2, b3 = builds["two"], builds["three"]
        store = server.runtime.extensions.build_store

        async def post(build_id: str, body: bytes, headers: dict[str, str]) -> Any:
            return await server.client.post(f"/api/v1/builds/{build_id}/status",
                                            content=body, headers=headers)

        genuine = json.dumps({"status": "succeeded"}).encode()
        headers = signed(b2, genuine)
        assert (await post(b2, genuine, headers)).status_code == 204
        replay = await post(b3, genuine, headers)  # same bytes, same header, build 3's URL
        assert replay.status_code == 401, replay.text
        error = replay.json()["error"]
        assert error["code"] == "bad_signature" and repr(b3) in error["message"]
        run = await store.get(b3)
        assert run is not None and run.status is BuildStatus.ACCEPTED  # nothing written

        assert await server.wait_terminal(two) == "landed"
        # the same build, the same verdict, within the window: harmless
        assert (await post(b2, genuine, headers)).status_code == 204
        contra = await ci.post(b2, {"status": "failed"})
        assert contra.status_code == 409 and "already ended succeeded" in contra.text

        now = int(time.time())
        for t, why in ((now - TOLERANCE_S - 5, "s old"), (now + TOLERANCE_S + 5,
                                                           "in the future")):
            r = await ci.post(b3, {"status": "succeeded"}, t=t)
            assert r.status_code == 401 and why in r.json()["error"]["message"]
        tampered = await post(b3, genuine, signed(b3, b'{"status":"failed"}'))
        assert tampered.status_code == 401
        old = {"content-type": "application/json", SIGNATURE_HEADER:
               "sha256=" + hmac.new(KEY, genuine, hashlib.sha256).hexdigest()}
        r = await post(b3, genuine, old)
        assert r.status_code == 401 and "no longer accepted" in r.json()["error"]["message"]
        r = await post(b3, genuine, {"content-type": "application/json",
                                     SIGNATURE_HEADER: "t=now,v1=whatever"})
        assert r.status_code == 401 and FORMAT in r.json()["error"]["message"]
        run = await store.get(b3)
        assert run is not None and run.status is BuildStatus.ACCEPTED

        # a genuinely signed report whose text no database can store: 422, nothing kept
        for bad in ({"status": "failed", "detail": "red\u0000"},
                    {"status": "failed", "detail": "\ud800"},
                    {"status": "failed", "log_url": "https://ci.example/\u0000"}):
            body = json.dumps(bad).encode()
            r = await post(b3, body, signed(b3, body))
            assert r.status_code == 422, r.text
            assert r.json()["error"]["code"] == "invalid_request", r.text
        run = await store.get(b3)
        assert run is not None and run.status is BuildStatus.ACCEPTED

        # build 3's own CI verdict is what decides it
        assert (await ci.post(b3, {"status": "failed", "detail": "red"})).status_code == 204
        assert await server.wait_terminal(three) == "error"
