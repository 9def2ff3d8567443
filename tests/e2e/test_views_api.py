"""The status pages' JSON views, search and live event stream over HTTP, on SQLite and
PostgreSQL: what the pages read, bad input, stream bounds, a second gateway process
seeing the first one's changes, and a prompt Ctrl-C with a stream open."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.views.data import TimingCache
from app.views.events import EventHub
from tests.conftest import BACKENDS
from tests.e2e.harness import ROOT, Server, change, free_port, serve
from tests.support.procs import wait_healthy

pytestmark = [pytest.mark.timeout(90)]
both = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
postgres_only = pytest.mark.parametrize("database_url", BACKENDS[1:], indirect=True)


async def get(server: Server, path: str, status: int = 200, **kw: Any) -> Any:
    r = await server.client.get(path, **kw)
    assert r.status_code == status, r.text
    return r.json()


async def wait_overview(server: Server, ready: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        o = await get(server, "/api/v1/queues/demo/overview")
        if ready(o):
            return o
        assert time.monotonic() < deadline, o
        await asyncio.sleep(0.05)


@both
async def test_overview_and_request_view_explain_a_dependency_and_a_failure(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        server.runtime.view_timing = TimingCache(ttl_s=0)
        # the failing build outlasts the second request's planning even on a loaded
        # machine (at 2.5 s it could fail first, and its batch left the overview)
        bad = await server.land(change("bad", files="lib/a.py", fake="build-fail",
                                       build_ms=6000))
        await server.wait_status(bad, {"speculating"})
        good = await server.land(change("good", files="lib/b.py", build_ms=2500))
        await server.wait_status(good, {"speculating"})
        o = await wait_overview(server, lambda o: len(o["batches"]) == 2 and all(
            p["build"] for b in o["batches"] for p in b["paths"]) and all(
            b["paths"] for b in o["batches"]))
        assert o["queue"] == "demo" and o["build_budget"] == 4
        spec = next(g for g in o["stages"] if g["stage"] == "speculating")
        rows = {r["sqid"]: r for r in spec["requests"]}
        assert set(rows) == {bad, good}
        assert rows[good]["forecast"]["p_land"] == pytest.approx(0.9)
        batches = {b["id"]: b for b in o["batches"]}
        head = batches[rows[good]["batch_id"]]
        assert [d["id"] for d in head["dependencies"]] == [rows[bad]["batch_id"]]
        assert head["dependencies"][0]["requests"] == [bad]
        path = next(p for p in head["paths"] if p["assumptions"][0]["assumption"] == "succeeds")
        assert path["assumptions"] == [{"batch_id": rows[bad]["batch_id"],
                                        "assumption": "succeeds", "batch_state": "speculating"}]
        assert path["described"] == f"on top of {rows[bad]['batch_id']}"
        assert path["p_assumptions_hold"] == pytest.approx(0.9)
        assert path["build"]["id"].startswith("fake-") and path["build"]["log_url"] is None
        # the planner may fund the "without it" path too: the funded paths' odds add up
        funded = sum(p["p_assumptions_hold"] for p in head["paths"]
                     if p["status"] in ("pending", "building"))
        assert head["forecast"]["p_speculation_holds"] == pytest.approx(min(1.0, funded))
        assert o["counts"]["speculating"] == 2

        view = await get(server, f"/api/v1/queues/demo/requests/{good.split('/')[1]}/view")
        assert view["cancellable"] is True and view["removal"] is None
        assert [w["id"] for w in view["waits_on"]] == [rows[bad]["batch_id"]]
        assert view["request"]["stage"] == "speculating"

        assert await server.wait_terminal(bad) == "error"
        assert await server.wait_terminal(good) == "landed"
        failed = await get(server, f"/api/v1/queues/demo/requests/{bad.split('/')[1]}/view")
        assert failed["removal"]["kind"] == "build_failed"
        assert failed["removal"]["reason"] == "build_failed"  # the typed vocabulary
        assert "on the target branch alone" in failed["removal"]["text"]
        assert failed["batch"]["paths"][0]["build"]["status"] == "failed"
        assert failed["cancellable"] is False and failed["request"]["forecast"] is None
        labels = [s["status"] for s in failed["trail"]]
        assert labels[0] == "accepted" and labels[-1] == "error"
        assert failed["trail"][-1]["duration_ms"] is None
        o = await get(server, "/api/v1/queues/demo/overview")
        recent = {r["sqid"]: r for r in o["recent"]}
        assert recent[good]["status"] == "landed" and recent[good]["duration_ms"] > 0
        assert o["timing"]["build_samples"] >= 1 and o["timing"]["merge_samples"] == 1
        assert all(not g["requests"] for g in o["stages"])


@both
async def test_search_by_sqid_number_and_change_uri_and_bad_queries(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        uri = change("s", files="s/a.py")
        sqid = await server.land(uri)
        await server.wait_terminal(sqid)
        n = sqid.split("/")[1]
        hit = await get(server, "/api/v1/search", params={"q": sqid})
        assert hit["kind"] == "sqid" and hit["items"][0]["page"] == f"/queues/demo/requests/{n}"
        assert (await get(server, "/api/v1/search", params={"q": n, "queue": "demo"})
                )["items"][0]["sqid"] == sqid
        by_uri = await get(server, "/api/v1/search", params={"q": uri})
        assert by_uri["kind"] == "change_uri" and [i["sqid"] for i in by_uri["items"]] == [sqid]
        assert (await get(server, "/api/v1/search", params={"q": uri + "x"}))["items"] == []
        assert (await get(server, "/api/v1/search", params={"q": "nope/1"}))["items"] == []
        for q in ("", "   ", "x" * 1025, "hello world"):
            body = await get(server, "/api/v1/search", 400, params={"q": q})
            assert body["error"]["code"] == "validation_error" and body["error"]["message"]
        await get(server, "/api/v1/queues/nope/overview", 404)
        await get(server, "/api/v1/queues/demo/requests/999/view", 404)
        await get(server, "/api/v1/queues/demo/requests/0/view", 422)
        spec = await get(server, "/openapi.json")
        for path in ("/api/v1/queues/{queue}/overview", "/api/v1/search", "/api/v1/events",
                     "/api/v1/queues/{queue}/requests/{n}/view"):
            assert path in spec["paths"], path


async def read_events(resp: httpx.Response, want: Any, timeout: float = 30) -> list[dict]:
    """Parse SSE frames until ``want(events)`` is true."""
    events: list[dict[str, Any]] = []
    buf = ""

    async def pump() -> None:
        nonlocal buf
        async for chunk in resp.aiter_text():
            buf += chunk
            while "\n\n" in buf:
                block, buf = buf.split("\n\n", 1)
                fields: dict[str, Any] = {}
                for line in block.split("\n"):
                    key, _, value = line.partition(": ")
                    fields[key] = value
                if fields.get("event") == "request":
                    events.append({"id": int(fields["id"]), **json.loads(fields["data"])})
                if want(events):
                    return

    await asyncio.wait_for(pump(), timeout)
    return events


@both
async def test_event_stream_follows_a_request_to_landed_and_ends_on_disconnect(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        async with server.client.stream("GET", "/api/v1/events", params={"queue": "demo"}
                                        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            hub: EventHub = server.runtime.event_hub
            assert len(hub.subscribers) == 1
            sqid = await server.land(change("live", files="live/a.py", build_ms=1500))
            events = await read_events(resp, lambda ev: any(
                e["sqid"] == sqid and e["status"] == "landed" for e in ev))
        mine = [e for e in events if e["sqid"] == sqid]
        # one event per poll with the summary as it is then: a build longer than a poll
        # is seen speculating before it is seen landed
        seen = [e["status"] for e in mine]
        assert "speculating" in seen and seen[-1] == "landed", seen
        assert [e["id"] for e in events] == sorted(e["id"] for e in events)
        assert mine[-1]["stage"] == "landed" and mine[-1]["queue"] == "demo"
        deadline = time.monotonic() + 5
        while hub.subscribers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not hub.subscribers  # the disconnect ended the stream


@both
async def test_event_stream_bounds_and_bad_input(database_url: str, tmp_path: Path) -> None:
    async with serve(database_url, tmp_path) as server:
        server.runtime.event_hub = EventHub(server.runtime.db, max_streams=1)
        async with server.client.stream("GET", "/api/v1/events", params={"queue": "demo"}
                                        ) as first:
            assert first.status_code == 200
            r = await server.client.get("/api/v1/events", params={"queue": "demo"})
            assert r.status_code == 503 and r.headers["retry-after"] == "5"
            assert "no more live streams" in r.json()["error"]["message"]
        r = await server.client.get("/api/v1/events", params={"queue": "nope"})
        assert r.status_code == 404 and "not configured" in r.json()["error"]["message"]
        assert (await server.client.get("/api/v1/events")).status_code == 422


@postgres_only
async def test_a_second_gateway_streams_what_the_first_one_wrote(
    database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with serve(database_url, tmp_path / "a") as worker, \
            serve(database_url, tmp_path / "b", role="gateway") as gateway, \
            gateway.client.stream("GET", "/api/v1/events", params={"queue": "demo"}) as resp:
        sqid = await worker.land(change("other", files="o/a.py"))
        events = await read_events(resp, lambda ev: any(
            e["sqid"] == sqid and e["status"] == "landed" for e in ev))
        assert any(e["sqid"] == sqid for e in events)


@pytest.fixture
async def served(tmp_path: Path, sqlite_template: Path) -> AsyncIterator[tuple[str, Any]]:
    db = tmp_path / "sq.db"
    db.write_bytes(sqlite_template.read_bytes())
    port = free_port()
    env = {**os.environ, "SQ_DATABASE_URL": f"sqlite+aiosqlite:///{db}", "SQ_PORT": str(port),
           "SQ_QUEUES_FILE": str(ROOT / "queues.yaml"), "SQ_QUEUE_SHUTDOWN_GRACE_MS": "10000"}
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], cwd=tmp_path, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


async def test_ctrl_c_ends_open_streams_and_the_server_exits_promptly(
    served: tuple[str, Any]
) -> None:
    base, proc = served
    await asyncio.to_thread(wait_healthy, base, proc)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client, \
            client.stream("GET", "/api/v1/events", params={"queue": "demo"}) as resp:
        assert resp.status_code == 200
        chunks = resp.aiter_text()
        assert ": connected" in await chunks.__anext__()
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        async for _chunk in chunks:  # until the server ends the stream
            pass
        code = await asyncio.to_thread(proc.wait, 10)
        took = time.monotonic() - started
    assert code == 0
    # uvicorn alone would wait timeout_graceful_shutdown (15 s here) for the stream
    assert took < 8, f"exit took {took:.1f}s"


async def test_pages_are_served_with_their_security_headers(tmp_path: Path,
                                                            sqlite_template: Path) -> None:
    db = tmp_path / "sq.db"
    db.write_bytes(sqlite_template.read_bytes())
    async with serve(f"sqlite+aiosqlite:///{db}", tmp_path) as server:
        for path in ("/", "/queues/demo", "/queues/demo/requests/7", "/admin"):
            r = await server.client.get(path)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            assert r.headers["content-security-policy"].startswith("default-src 'self'")
            assert "script-src 'self';" in r.headers["content-security-policy"]
            assert r.headers["x-frame-options"] == "DENY"
            assert '<script type="module" src="/static/js/' in r.text
        js = await server.client.get("/static/js/queue.js")
        assert js.status_code == 200 and js.headers["x-content-type-options"] == "nosniff"
        missing = await server.client.get("/static/js/nope.js")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_the_frontend_never_writes_markup_from_strings() -> None:
    """Rendering goes through DOM text nodes: no innerHTML & co., no inline script or
    style the Content-Security-Policy would (rightly) refuse."""
    static = ROOT / "frontend-static"
    for js in static.glob("js/*.js"):
        text = js.read_text()
        for bad in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert bad not in text, f"{js.name} uses {bad}"
    for page in static.glob("*.html"):
        text = page.read_text()
        assert " style=" not in text and "<style" not in text, page.name
        assert text.count("<script") == text.count('<script type="module" src="/static/js/')
