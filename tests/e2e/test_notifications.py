"""Outbound notifications end to end (SQLite and PostgreSQL): the real app POSTs to a
real HTTP receiver on a local socket. A landed request's notification arrives signed;
one answered 500 first is retried with the same delivery id and body; one answered 410
is not retried and sits parked in ``notify_dlq``, visible through the admin API; a
removed request reaches a Slack-format endpoint with its typed reason."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.extensions.builds.signature import SIGNATURE_HEADER, BadSignature, verify
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.support.receiver import Receiver, receiver

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

SECRET = "notify-test-secret"
TOKEN = "ops:s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def queues_yaml(base: str) -> str:
    return f"""
queues:
  - name: demo
    change_provider: {{type: fake}}
    build_runner: {{type: fake, delay_ms: 0}}
    merger: {{type: fake}}
    conflict_analyzer: {{type: none}}
    notify:
      - {{name: team, url: "{base}/ok", secret_env: SQ_TEST_NOTIFY_SECRET, events: [landed]}}
      - {{name: flaky, url: "{base}/flaky", secret_env: SQ_TEST_NOTIFY_SECRET,
         events: [landed]}}
      - {{name: gone, url: "{base}/gone", secret_env: SQ_TEST_NOTIFY_SECRET,
         events: [landed]}}
      - {{name: chat, url_env: SQ_TEST_NOTIFY_SLACK_URL, format: slack, events: [removed]}}
      - {{name: ops, url: "{base}/ops", secret_env: SQ_TEST_NOTIFY_SECRET,
         events: [needs_operator]}}
"""


async def until(what: str, check: Callable[[], Any], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def parked_notifications(server: Server) -> list[dict[str, Any]]:
    r = await server.client.get("/api/v1/admin/dlq/notify_dlq/messages", headers=AUTH)
    assert r.status_code == 200, r.text
    return [i for i in r.json()["items"] if i["parked"]]


async def test_signed_delivery_retry_after_500_and_dead_letter_after_410(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with receiver({"/ok": [200], "/flaky": [500, 200], "/gone": [410],
                   "/slack": [200], "/ops": [200]}) as rec:
        monkeypatch.setenv("SQ_TEST_NOTIFY_SECRET", SECRET)
        monkeypatch.setenv("SQ_TEST_NOTIFY_SLACK_URL", f"{rec.base_url}/slack")
        (tmp_path / "queues.yaml").write_text(queues_yaml(rec.base_url))
        async with serve(database_url, tmp_path, admin_token=TOKEN, queue_max_attempts=3,
                         public_url="https://sq.example.com") as server:
            sqid = await server.land(change("notify-ok", files="a/x.py"))
            assert await server.wait_terminal(sqid) == "landed"
            await check_signed(rec, sqid)
            await check_retried(rec, sqid)
            await check_dead_lettered(server, rec, sqid)
            failed = await server.land(change("notify-bad", files="b/y.py", fake="build-fail"))
            assert await server.wait_terminal(failed) == "error"
            await check_slack(rec, failed)
            assert rec.on("/ops") == []  # a build failure needs no operator
            dead = await server.land(change("notify-dead", files="c/z.py",
                                            fake="trigger-error"))
            assert await server.wait_terminal(dead) == "error"
            await check_needs_operator(rec, dead)
            # each removal went only to the endpoints subscribed to it
            assert all(json.loads(r.body)["sqid"] == sqid
                       for p in ("/ok", "/flaky", "/gone") for r in rec.on(p))
            assert sorted(json.loads(r.body)["text"].split()[0] for r in rec.on("/slack")) == \
                sorted([failed, dead])


async def check_signed(rec: Receiver, sqid: str) -> None:
    (got,) = await until("the landed notification", lambda: rec.on("/ok"))
    delivery = f"{sqid}/landed/team"
    assert got.headers["x-submitqueue-delivery"] == delivery
    assert got.headers["x-submitqueue-event"] == "landed"
    assert got.headers["content-type"] == "application/json"
    verify(SECRET.encode(), delivery, got.body, got.headers[SIGNATURE_HEADER.lower()],
           now_s=time.time())
    with pytest.raises(BadSignature, match="does not match"):  # bound to this delivery id
        verify(SECRET.encode(), f"{sqid}/landed/other", got.body,
               got.headers[SIGNATURE_HEADER.lower()], now_s=time.time())
    body = json.loads(got.body)
    number = sqid.rsplit("/", 1)[1]
    assert body == {**body, "schema": "submitqueue.notification/v1", "delivery_id": delivery,
                    "event": "landed", "queue": "demo", "sqid": sqid, "status": "landed",
                    "reason": None, "needs_operator": False,
                    "url": f"https://sq.example.com/queues/demo/requests/{number}"}
    assert body["text"].startswith(f"{sqid} landed in demo")


async def check_retried(rec: Receiver, sqid: str) -> None:
    first, second = await until("the retry after the 500",
                                lambda: rec.on("/flaky") if len(rec.on("/flaky")) >= 2 else None)
    assert first.headers["x-submitqueue-delivery"] == second.headers[
        "x-submitqueue-delivery"] == f"{sqid}/landed/flaky"
    assert first.body == second.body  # the same notification, signed again
    verify(SECRET.encode(), f"{sqid}/landed/flaky", second.body,
           second.headers[SIGNATURE_HEADER.lower()], now_s=time.time())
    await asyncio.sleep(0.5)
    assert len(rec.on("/flaky")) == 2  # the 200 settled it


async def check_dead_lettered(server: Server, rec: Receiver, sqid: str) -> None:
    (item,) = await until("the parked notification", lambda: parked_notifications(server))
    assert item["message_id"] == f"{sqid}/landed/gone"
    assert item["original_topic"] == "notify"
    assert item["attempts"] == 1  # a permanent answer is not retried
    assert "answered HTTP 410" in item["last_error"]
    assert "notification given up" in json.dumps(item["failure_detail"])
    assert len(rec.on("/gone")) == 1
    r = await server.client.get("/api/v1/admin/dlq", headers=AUTH)
    listed = {t["topic"]: t for t in r.json()["topics"]}
    assert listed["notify_dlq"]["parked"] == 1
    # the endpoint is fixed: an operator requeues it, and the same delivery is sent again
    rec.answers["/gone"] = [200]
    r = await server.client.post("/api/v1/admin/dlq/notify_dlq/drain", headers=AUTH, json={
        "mode": "requeue", "reason": "endpoint fixed", "message_ids": [str(item["id"])]})
    assert r.status_code == 200 and r.json()["counts"] == {"requeued": 1}, r.text
    again = await until("the requeued delivery",
                        lambda: rec.on("/gone") if len(rec.on("/gone")) == 2 else None)
    assert again[1].headers["x-submitqueue-delivery"] == f"{sqid}/landed/gone"
    assert again[1].body == again[0].body
    await until("nothing parked any more", lambda: _none_parked(server))


async def _none_parked(server: Server) -> bool:
    return not await parked_notifications(server)


async def check_slack(rec: Receiver, sqid: str) -> None:
    (got,) = await until("the slack notification", lambda: rec.on("/slack"))
    assert SIGNATURE_HEADER.lower() not in got.headers  # no secret configured
    assert got.headers["x-submitqueue-delivery"] == f"{sqid}/error/chat"
    body = json.loads(got.body)
    assert set(body) == {"text", "blocks"}
    assert body["text"].startswith(f"{sqid} was removed from demo: its builds failed")
    assert "reason `build_failed`" in json.dumps(body["blocks"])


async def check_needs_operator(rec: Receiver, sqid: str) -> None:
    """The build trigger kept failing: its dead letter's reconciler ended the request,
    and the endpoint subscribed to ``needs_operator`` hears it."""
    (got,) = await until("the needs-operator notification", lambda: rec.on("/ops"))
    body = json.loads(got.body)
    assert got.headers["x-submitqueue-event"] == "needs_operator"
    assert (body["event"], body["reason"], body["needs_operator"]) == (
        "needs_operator", "dead_lettered", True)
    assert body["last_error"].startswith("dead-lettered from build after 3 attempts")
    assert body["text"].startswith(f"{sqid} needs an operator")
    await until("the removal on the chat endpoint too", lambda: len(rec.on("/slack")) == 2)
