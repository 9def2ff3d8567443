"""The gateway's REST API over HTTP (in process), on SQLite and PostgreSQL: land,
read, history, cancel, list, queues, and the error mapping."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.db.repos.request_log import persist_log
from app.db.tables import request_log as log_t
from app.domain.entities import RequestLog
from app.domain.messages import CANCEL, LOG, START, log_id
from app.domain.states import LogType
from tests.conftest import BACKENDS
from tests.support.gateway import (
    SHA,
    T0,
    URI_A,
    URI_B,
    URI_C,
    Env,
    error,
    finish,
    land,
    make_env,
)

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

async def test_land_is_accepted_visible_and_handed_to_start(env: Env) -> None:
    r = await env.client.post("/api/v1/queues/demo/requests",
                              json={"change_uris": [URI_A, URI_B], "strategy": "merge"})
    assert r.status_code == 202
    assert r.json() == {"sqid": "demo/1", "queue": "demo", "status": "accepted"}

    summary = (await env.client.get("/api/v1/queues/demo/requests/1")).json()
    assert summary["status"] == "accepted"
    assert summary["change_uris"] == [URI_A, URI_B]
    assert summary["sqid"] == "demo/1" and summary["queue"] == "demo"
    assert summary["received_at_ms"] > T0 and summary["last_error"] == ""

    history = (await env.client.get("/api/v1/queues/demo/requests/1/history")).json()
    assert history["sqid"] == "demo/1"
    assert [(e["type"], e["status"], e["event"]) for e in history["events"]] == [
        ("status", "accepted", None)]
    assert history["events"][0]["timestamp_ms"] == summary["received_at_ms"]

    [msg] = await env.runtime.broker.find_messages(START, "demo/1")
    assert msg.partition_key == "demo"
    assert msg.payload == {"id": "demo/1", "queue": "demo", "change_uris": [URI_A, URI_B],
                           "strategy": "merge", "received_at_ms": summary["received_at_ms"],
                           "submitted_by": "anonymous", "priority": "normal"}
    assert summary["submitted_by"] == "anonymous"  # SQ_AUTH=open, no token
    assert history["events"][0]["metadata"] == {"actor": "anonymous"}
    assert await land(env, URI_C) == "demo/2"


async def test_a_null_strategy_takes_the_queue_default(env: Env) -> None:
    await land(env, URI_A)
    await land(env, URI_A, queue="squashy", strategy=None)
    [demo] = await env.runtime.broker.find_messages(START, "demo/1")
    [squashy] = await env.runtime.broker.find_messages(START, "squashy/1")
    assert demo.payload["strategy"] == "rebase"
    assert squashy.payload["strategy"] == "squash_rebase"


async def test_an_unknown_queue_is_404_before_an_id_is_minted(env: Env) -> None:
    r = await env.client.post("/api/v1/queues/nope/requests", json={"change_uris": [URI_A]})
    assert r.status_code == 404
    err = error(r)
    assert err["code"] == "not_found" and "'nope'" in err["message"]
    assert "demo" in err["message"]  # names the queues that exist
    await env.assert_nothing_written()


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"change_uris": ["https://example.com/x"]}, 400, "unknown scheme"),
    ({"change_uris": [f"github://GitHub.com/a/b/pull/1/{SHA}"]}, 400, "canonical github://"),
    ({"change_uris": [URI_A, URI_A]}, 400, "appears twice"),
    ({"change_uris": []}, 422, "change_uris"),
    ({"change_uris": [URI_A], "strategy": "promote"}, 422, "strategy"),
    ({"change_uris": [URI_A], "extra": 1}, 422, "extra"),
    ({}, 422, "change_uris: Field required"),
])
async def test_invalid_land_bodies_are_rejected_and_nothing_is_written(
    env: Env, body: dict[str, Any], status: int, needle: str
) -> None:
    r = await env.client.post("/api/v1/queues/demo/requests", json=body)
    assert r.status_code == status, r.text
    err = error(r)
    assert needle in err["message"], err
    assert err["code"] == ("validation_error" if status == 400 else "invalid_request")
    await env.assert_nothing_written()


async def test_a_stack_over_the_limit_is_400(env: Env) -> None:
    uris = [f"phab://phab.example.com/D{n}/1" for n in range(1, 102)]
    r = await env.client.post("/api/v1/queues/demo/requests", json={"change_uris": uris})
    assert r.status_code == 400 and "at most 100 changes" in error(r)["message"]
    await env.assert_nothing_written()


async def test_oversize_non_json_and_broken_json_bodies(env: Env) -> None:
    url = "/api/v1/queues/demo/requests"
    big = {"change_uris": [URI_A], "strategy": "rebase", "pad": "x" * 70_000}
    r = await env.client.post(url, json=big)
    assert r.status_code == 413
    assert error(r) == {"code": "payload_too_large",
                        "message": "request body is larger than 65536 bytes"}

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(20):
            yield b" " * 4096

    r = await env.client.post(url, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and error(r)["code"] == "payload_too_large"

    r = await env.client.post(url, content=json.dumps({"change_uris": [URI_A]}),
                              headers={"content-type": "text/plain"})
    assert r.status_code == 415
    assert error(r)["code"] == "unsupported_media_type"
    assert "text/plain" in error(r)["message"]

    r = await env.client.post(url, content=b'{"change_uris": [',
                              headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not valid JSON" in error(r)["message"]
    await env.assert_nothing_written()


async def test_a_failed_start_publish_is_503_and_the_receipt_stays_invisible(
    database_url: str,
) -> None:
    env = await make_env(database_url, topics=(CANCEL, LOG))  # no `start` topic: publish fails
    try:
        r = await env.client.post("/api/v1/queues/demo/requests", json={"change_uris": [URI_A]})
        assert r.status_code == 503
        assert error(r)["code"] == "unavailable" and "try again" in error(r)["message"]
        assert (await env.client.get("/api/v1/queues/demo/requests/1")).status_code == 404
        listed = (await env.client.get("/api/v1/queues/demo/requests")).json()
        assert listed == {"items": [], "next_cursor": None}
        assert await env.count(log_t) == 0  # `accepted` is never recorded
    finally:
        await env.client.aclose()
        await env.runtime.broker.close()
        await env.runtime.db.dispose()


# --- reading ---------------------------------------------------------------------------


async def test_unknown_requests_and_queues_are_404(env: Env) -> None:
    await land(env, URI_A)
    for path in ("/api/v1/queues/demo/requests/2", "/api/v1/queues/demo/requests/2/history",
                 "/api/v1/queues/squashy/requests/1", "/api/v1/queues/nope/requests/1",
                 "/api/v1/queues/nope/requests"):
        r = await env.client.get(path)
        assert r.status_code == 404, path
        assert error(r)["code"] == "not_found"
    r = await env.client.post("/api/v1/queues/demo/requests/9/cancel", json={"reason": "x"})
    assert r.status_code == 404
    r = await env.client.get("/api/v1/queues/demo/requests/zero")
    assert r.status_code == 422 and "path parameter 'n'" in error(r)["message"]
    r = await env.client.get("/api/v1/nowhere")
    assert r.status_code == 404 and error(r) == {"code": "not_found", "message": "Not Found"}


async def test_history_shows_statuses_and_events_oldest_first(env: Env) -> None:
    sqid = await land(env, URI_A)
    base = (await env.client.get("/api/v1/queues/demo/requests/1")).json()["received_at_ms"]
    for e in [
        RequestLog(queue="demo", request_id=sqid, timestamp_ms=base + 20, type=LogType.EVENT,
                   event="building", metadata={"build_id": "b1"},
                   log_id=log_id(sqid, "building", "b1")),
        RequestLog(queue="demo", request_id=sqid, timestamp_ms=base + 10, type=LogType.STATUS,
                   status="started", request_version=1, log_id=log_id(sqid, "started")),
    ]:
        await persist_log(env.runtime.db, e)
    events = (await env.client.get("/api/v1/queues/demo/requests/1/history")).json()["events"]
    assert [(e["status"], e["event"]) for e in events] == [
        ("accepted", None), ("started", None), (None, "building")]
    assert events[2]["metadata"] == {"build_id": "b1"}
    assert (await env.client.get("/api/v1/queues/demo/requests/1")).json()["status"] == "started"


# --- cancel ----------------------------------------------------------------------------


async def test_cancel_records_cancelling_and_publishes_cancel(env: Env) -> None:
    sqid = await land(env, URI_A)
    r = await env.client.post("/api/v1/queues/demo/requests/1/cancel",
                              json={"reason": "wrong branch"})
    assert r.status_code == 202
    assert r.json() == {"sqid": sqid, "status": "cancelling"}
    [msg] = await env.runtime.broker.find_messages(CANCEL, f"{sqid}/cancel")
    assert msg.partition_key == sqid
    assert msg.payload == {"id": sqid, "queue": "demo", "reason": "wrong branch",
                           "actor": "anonymous"}
    summary = (await env.client.get("/api/v1/queues/demo/requests/1")).json()
    assert summary["status"] == "cancelling"
    assert summary["metadata"] == {"reason": "wrong branch", "actor": "anonymous"}
    history = (await env.client.get("/api/v1/queues/demo/requests/1/history")).json()
    assert [e["status"] for e in history["events"]] == ["accepted", "cancelling"]

    again = await env.client.post("/api/v1/queues/demo/requests/1/cancel", json={"reason": "!"})
    assert again.status_code == 202 and again.json()["status"] == "cancelling"
    assert len(await env.messages(CANCEL)) == 1
    assert await env.count(log_t) == 2


async def test_cancelling_a_terminal_request_is_a_no_op(env: Env) -> None:
    sqid = await land(env, URI_A)
    await persist_log(env.runtime.db, RequestLog(
        queue="demo", request_id=sqid, timestamp_ms=T0 + 1_000, type=LogType.STATUS,
        status="landed", request_version=3, log_id=log_id(sqid, "landed")))
    r = await env.client.post("/api/v1/queues/demo/requests/1/cancel", json={"reason": "late"})
    assert r.status_code == 202
    assert r.json() == {"sqid": sqid, "status": "landed"}
    assert await env.messages(CANCEL) == []
    history = (await env.client.get("/api/v1/queues/demo/requests/1/history")).json()
    assert [e["status"] for e in history["events"]] == ["accepted", "landed"]


async def test_cancel_validates_its_body(env: Env) -> None:
    await land(env, URI_A)
    r = await env.client.post("/api/v1/queues/demo/requests/1/cancel", content="stop",
                              headers={"content-type": "text/plain"})
    assert r.status_code == 415 and error(r)["code"] == "unsupported_media_type"
    r = await env.client.post("/api/v1/queues/demo/requests/1/cancel",
                              json={"reason": "x" * 1001})
    assert r.status_code == 422 and "reason" in error(r)["message"]
    assert await env.messages(CANCEL) == []
    r = await env.client.post("/api/v1/queues/demo/requests/1/cancel")  # no body: no reason
    assert r.status_code == 202 and r.json()["status"] == "cancelling"
    [msg] = await env.messages(CANCEL)
    assert msg.payload["reason"] == ""


# --- listing ---------------------------------------------------------------------------


async def test_list_pages_newest_first_and_filters(env: Env) -> None:
    await land(env, URI_A)
    await finish(env, "demo/1", "error")  # gives URI_A back: it may be landed again
    for uri in (URI_B, URI_C, URI_A, "phab://phab.example.com/D13/1"):
        await land(env, uri)
    await env.client.post("/api/v1/queues/demo/requests/2/cancel", json={"reason": "r"})
    url = "/api/v1/queues/demo/requests"

    seen: list[list[str]] = []
    params: dict[str, Any] = {"limit": 2}
    while True:
        page = (await env.client.get(url, params=params)).json()
        seen.append([item["sqid"] for item in page["items"]])
        if page["next_cursor"] is None:
            break
        params = {"limit": 2, "cursor": page["next_cursor"]}
    assert seen == [["demo/5", "demo/4"], ["demo/3", "demo/2"], ["demo/1"]]

    only = (await env.client.get(url, params={"status": "cancelling"})).json()
    assert [i["sqid"] for i in only["items"]] == ["demo/2"]
    by_uri = (await env.client.get(url, params={"change_uri": URI_A})).json()
    assert [i["sqid"] for i in by_uri["items"]] == ["demo/4", "demo/1"]

    first = (await env.client.get(url, params={"limit": 1, "change_uri": URI_A})).json()
    assert first["next_cursor"]
    nxt = (await env.client.get(url, params={"limit": 1, "change_uri": URI_A,
                                             "cursor": first["next_cursor"]})).json()
    assert [i["sqid"] for i in nxt["items"]] == ["demo/1"] and nxt["next_cursor"] is None

    received = [i["received_at_ms"] for i in
                (await env.client.get(url, params={"limit": 10})).json()["items"]]
    window = (await env.client.get(url, params={"since_ms": received[3],
                                                 "until_ms": received[0]})).json()
    assert [i["sqid"] for i in window["items"]] == ["demo/4", "demo/3", "demo/2"]


async def test_list_rejects_mismatched_cursors_and_bad_filters(env: Env) -> None:
    for n in range(3):
        await land(env, f"phab://phab.example.com/D12/{n + 1}")
    url = "/api/v1/queues/demo/requests"
    cursor = (await env.client.get(url, params={"limit": 1})).json()["next_cursor"]

    r = await env.client.get(url, params={"limit": 1, "cursor": cursor, "status": "accepted"})
    assert r.status_code == 400
    assert error(r)["message"].startswith("cursor does not match this query")
    r = await env.client.get("/api/v1/queues/squashy/requests", params={"cursor": cursor})
    assert r.status_code == 400 and "does not match" in error(r)["message"]
    forged = base64.urlsafe_b64encode(b"not json").decode().rstrip("=")
    for bad in (forged, "!!!", "e30"):
        r = await env.client.get(url, params={"cursor": bad})
        assert r.status_code == 400 and "malformed" in error(r)["message"], bad

    r = await env.client.get(url, params={"status": "accepting"})
    assert r.status_code == 400 and "internal" in error(r)["message"]
    r = await env.client.get(url, params={"status": "frozen"})
    assert r.status_code == 422 and "query parameter 'status'" in error(r)["message"]
    for limit in (0, 201):
        r = await env.client.get(url, params={"limit": limit})
        assert r.status_code == 422 and "'limit'" in error(r)["message"]
    r = await env.client.get(url, params={"since_ms": 5, "until_ms": 5})
    assert r.status_code == 400 and "since_ms" in error(r)["message"]


async def test_queues_lists_config_and_counts(env: Env) -> None:
    await land(env, URI_A)
    await land(env, URI_B)
    await land(env, URI_C, queue="squashy")
    await env.client.post("/api/v1/queues/demo/requests/1/cancel", json={"reason": "r"})
    r = await env.client.get("/api/v1/queues")
    assert r.status_code == 200
    items = {q["name"]: q for q in r.json()["items"]}
    assert list(items) == ["demo", "squashy"]
    demo = items["demo"]
    assert (demo["description"], demo["build_budget"]) == ("the demo queue", 3)
    assert {k: v for k, v in demo["counts"].items() if v} == {"accepted": 1, "cancelling": 1}
    assert "accepting" not in demo["counts"] and demo["counts"]["landed"] == 0
    assert {k: v for k, v in items["squashy"]["counts"].items() if v} == {"accepted": 1}


# --- error mapping ---------------------------------------------------------------------


async def test_unexpected_errors_are_a_generic_500_and_domain_errors_map(env: Env) -> None:
    r = await env.client.get("/boom")
    assert r.status_code == 500
    assert error(r) == {"code": "internal_error", "message": "internal error; it has been logged"}
    assert "secret" not in r.text and "Traceback" not in r.text
    r = await env.client.get("/conflict")
    assert r.status_code == 409 and error(r)["code"] == "invalid_state"
    r = await env.client.delete("/api/v1/queues")
    assert r.status_code == 405 and error(r)["code"] == "method_not_allowed"
