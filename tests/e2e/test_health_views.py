"""Honest status over HTTP, on SQLite and PostgreSQL: a request whose stage is retrying or
dead-lettered says so in the request view and the queue overview (stage, attempts, last
error, whether it needs an operator and where), and its forecast stops claiming what the
planner alone would; the stall detector flags a queue whose oldest request has not moved
(with an injected clock), on the views and in ``/metrics``; an unknown queue is a 404."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.views.data import TimingCache
from app.views.stalls import StallDetector
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.e2e.test_cli import run_cli

pytestmark = [pytest.mark.timeout(90)]
both = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

TOKEN = "ops:health-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def wait_view(server: Server, sqid: str, ready: Callable[[Any], bool],
                    timeout: float = 30) -> Any:
    queue, n = sqid.rsplit("/", 1)
    deadline = time.monotonic() + timeout
    while True:
        r = await server.client.get(f"/api/v1/queues/{queue}/requests/{n}/view")
        assert r.status_code == 200, r.text
        v = r.json()
        if ready(v):
            return v
        assert time.monotonic() < deadline, v["request"]
        await asyncio.sleep(0.1)


async def overview_row(server: Server, sqid: str) -> dict[str, Any]:
    r = await server.client.get("/api/v1/queues/demo/overview")
    assert r.status_code == 200, r.text
    rows = [x for g in r.json()["stages"] for x in g["requests"] if x["sqid"] == sqid]
    assert len(rows) == 1, r.json()["stages"]
    return rows[0]


@both
async def test_a_dead_lettered_stage_says_so_and_needs_an_operator(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, admin_token=TOKEN, queue_max_attempts=2) as server:
        server.runtime.view_timing = TimingCache(ttl_s=0)
        r = await server.client.post("/api/v1/admin/consumers/build_dlq/pause", headers=AUTH,
                                     json={"reason": "look first"})
        assert r.status_code == 200, r.text
        sqid = await server.land(change("stuck", files="stuck/a.py", fake="trigger-error"))
        v = await wait_view(server, sqid, lambda v: v["request"]["health"]["state"]
                            == "dead_lettered")
        h = v["request"]["health"]
        assert h["topic"] == "build" and h["attempts"] == 2 and h["max_attempts"] == 2
        assert "ConnectionError" in h["last_error"] and "trigger" in h["last_error"]
        assert h["needs_operator"] is True and h["admin_url"] == "/admin"
        assert h["operator_reason"] == "its reconciler is paused"
        assert h["subject"] == v["request"]["batch_id"]
        assert "dead-lettered at build after 2 attempts" in h["text"]
        f = v["request"]["forecast"]
        assert f["p_land"] == 0.0 and f["eta_at_ms"] is None and f["eta_ms"] is None
        assert "dead-lettered at build" in f["basis"] and "/admin" in f["basis"]
        assert v["request"]["status"] not in ("error", "landed")  # still waiting: honest
        assert v["batch"]["health"]["state"] == "dead_lettered"
        assert v["batch"]["forecast"]["p_land"] == 0.0
        row = await overview_row(server, sqid)
        assert row["health"] == h and row["forecast"]["p_land"] == 0.0
        out = await run_cli("status", sqid, "--url", server.base_url)
        assert out.exit_code == 0, out.output
        lines = out.output.splitlines()
        assert lines[1].startswith("  dead-lettered at build after 2 attempts — needs an "
                                   "operator (its reconciler is paused)"), out.output
        assert f"  needs an operator: {server.base_url}/admin" in lines
        assert lines[3].startswith("  chance to land 0 %, ETA unknown: 0 %: dead-lettered"), \
            out.output

        # the operator resumes the reconciler: the request ends error and health is ok
        r = await server.client.post("/api/v1/admin/consumers/build_dlq/resume", headers=AUTH,
                                     json={})
        assert r.status_code == 200, r.text
        done = await wait_view(server, sqid, lambda v: v["request"]["status"] == "error")
        assert done["request"]["health"]["state"] == "ok"
        assert done["removal"]["kind"] == "dead_lettered"
        assert done["removal"]["reason"] == "dead_lettered"


@both
async def test_a_retrying_stage_says_which_attempt_and_why(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, queue_max_attempts=50) as server:
        server.runtime.view_timing = TimingCache(ttl_s=0)
        sqid = await server.land(change("flaky", files="flaky/a.py", fake="trigger-error"))
        v = await wait_view(server, sqid, lambda v: v["request"]["health"]["attempts"] >= 2)
        h = v["request"]["health"]
        assert h["state"] == "retrying" and h["topic"] == "build"
        assert h["max_attempts"] == 50 and h["needs_operator"] is False
        assert h["admin_url"] is None
        assert "ConnectionError" in h["last_error"]
        assert h["attempt_running"] or h["next_attempt_at_ms"] > 0
        assert h["text"].startswith("retrying at build (")
        assert "retrying" in v["request"]["forecast"]["basis"]
        assert (await overview_row(server, sqid))["health"]["state"] == "retrying"


@both
async def test_the_stall_detector_flags_the_oldest_unmoved_request_on_views_and_metrics(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        rt = server.runtime
        rt.view_timing = TimingCache(ttl_s=0)
        sqid = await server.land(change("slow", files="slow/a.py", build_ms=60_000))
        await server.wait_status(sqid, {"speculating"})
        await asyncio.sleep(0.5)  # let the build's 'building' event be logged
        now = {"ms": rt.broker.clock()}
        detector = StallDetector(rt.db, ["demo"], threshold_ms=10 * 60_000,
                                 clock=lambda: now["ms"])
        rt.stalls = detector
        fresh = (await detector.run())["demo"]
        assert fresh.request_id == sqid and not fresh.stalled
        assert fresh.last_moved_at_ms is not None
        assert now["ms"] - fresh.last_moved_at_ms < 10_000
        metrics = (await server.client.get("/metrics")).text
        assert 'submitqueue_queue_stalled{queue="demo"} 0.0' in metrics

        now["ms"] = fresh.last_moved_at_ms + 10 * 60_000 + 1  # one ms past the threshold
        again = (await detector.run())["demo"]
        assert again.stalled and again.request_id == sqid
        assert (await detector.run())["demo"] == again  # idempotent: same verdict
        metrics = (await server.client.get("/metrics")).text
        assert 'submitqueue_queue_stalled{queue="demo"} 1.0' in metrics
        unmoved = next(line for line in metrics.splitlines()
                       if line.startswith('submitqueue_queue_unmoved_seconds{queue="demo"}'))
        assert float(unmoved.split()[-1]) >= 600
        o = (await server.client.get("/api/v1/queues/demo/overview")).json()
        assert o["stall"]["stalled"] is True and o["stall"]["request"] == sqid
        assert o["stall"]["threshold_ms"] == 600_000
        assert "has not moved for" in o["stall"]["text"]
        v = await wait_view(server, sqid, lambda v: True)
        assert v["request"]["health"]["state"] == "stalled"
        assert v["request"]["forecast"]["eta_at_ms"] is None
        assert "stalled" in v["request"]["forecast"]["basis"]


async def test_an_unknown_queue_is_a_404_page_and_a_404_json(tmp_path: Path,
                                                             database_url: str) -> None:
    async with serve(database_url, tmp_path) as server:
        page = await server.client.get("/queues/nope")
        assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
        for path in ("/api/v1/queues/nope/overview", "/api/v1/queues/nope/requests/1/view",
                     "/api/v1/events?queue=nope"):
            r = await server.client.get(path)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["error"]["code"] == "not_found", path
            assert "'nope' is not configured" in r.json()["error"]["message"], path
