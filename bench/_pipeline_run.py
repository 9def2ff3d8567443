"""One run of the pipeline benchmark (``bench/pipeline_bench.py``): serve a checkout on
a database, warm it up, submit the workload, follow it on the event stream, and read
the server's counters, histograms and CPU time at the window's two ends."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import _prom

TERMINAL = {"landed", "error", "cancelled"}
SUBMIT_CONCURRENCY = 32
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Workload:
    mode: str  # "in-flight" | "burst"
    n: int  # kept in flight, or submitted at once
    total: int  # submitted in all
    folders: int
    timeout_s: float


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def uri(tag: str, folder: int) -> str:
    sha = hashlib.sha1(tag.encode()).hexdigest()
    return (f"git://demo.example.com/demo/refs%2Fheads%2F{tag}/{sha}"
            f"?sq-files=f{folder}/{tag}.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


@contextlib.asynccontextmanager
async def server(root: Path, database_url: str, env: Mapping[str, str]
                 ) -> AsyncIterator[tuple[str, int]]:
    workdir = Path(tempfile.mkdtemp(prefix="sq-bench-"))
    port = free_port()
    shutil.copyfile(root / "queues.yaml", workdir / "queues.yaml")
    run_env = {**env, "SQ_DATABASE_URL": database_url, "SQ_PORT": str(port),
               "SQ_QUEUES_FILE": str(workdir / "queues.yaml"), "SQ_LOG_LEVEL": "WARNING",
               "PYTHONPATH": str(root)}
    run_env.pop("SQ_ADMIN_TOKEN", None)
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], cwd=root, env=run_env,
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as c:
            for _ in range(600):
                with contextlib.suppress(httpx.TransportError):
                    if (await c.get(f"{base}/readyz")).status_code == 200:
                        break
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited; see {workdir}/server.log")
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("server did not become ready")
        yield base, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Tracker:
    """Our requests' statuses, from the event stream (and a list read to catch up)."""

    status: dict[str, str] = field(default_factory=dict)
    landed_at: dict[str, float] = field(default_factory=dict)  # perf_counter time
    settled: asyncio.Event = field(default_factory=asyncio.Event)

    def saw(self, sqid: str, status: str) -> None:
        if sqid not in self.status or self.status[sqid] in TERMINAL:
            return
        self.status[sqid] = status
        if status in TERMINAL:
            if status == "landed":
                self.landed_at[sqid] = time.perf_counter()
            self.settled.set()

    def live(self) -> int:
        return sum(1 for s in self.status.values() if s not in TERMINAL)


async def follow(c: httpx.AsyncClient, tracker: Tracker) -> None:
    """Read the queue's events until cancelled; after a reset or a lost stream, read
    the list once to catch up, then reconnect."""
    while True:
        try:
            async with c.stream("GET", "/api/v1/events", params={"queue": "demo"},
                                timeout=None) as r:
                event = ""
                async for line in r.aiter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "request":
                        body = json.loads(line[5:])
                        tracker.saw(body["sqid"], body["status"])
                    elif line.startswith("data:") and event == "reset":
                        break
        except (httpx.HTTPError, json.JSONDecodeError):
            await asyncio.sleep(0.5)
        await catch_up(c, tracker)


async def catch_up(c: httpx.AsyncClient, tracker: Tracker) -> None:
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        body = (await c.get("/api/v1/queues/demo/requests", params=params)).json()
        for item in body["items"]:
            tracker.saw(item["sqid"], item["status"])
        cursor = body.get("next_cursor")
        if not cursor:
            return


async def land(c: httpx.AsyncClient, change: str) -> str:
    for _ in range(20):
        r = await c.post("/api/v1/queues/demo/requests", json={"change_uris": [change]})
        if r.status_code in (429, 503):  # overloaded: as a client would, wait and retry
            await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
            continue
        r.raise_for_status()
        return str(r.json()["sqid"])
    raise RuntimeError("the server refused the land request 20 times")


async def land_to_landed_s(c: httpx.AsyncClient, sqid: str) -> float | None:
    n = sqid.rsplit("/", 1)[1]
    events = (await c.get(f"/api/v1/queues/demo/requests/{n}/history")).json()["events"]
    at = {e["status"]: e["timestamp_ms"] for e in events if e["type"] == "status"}
    if "landed" not in at or "accepted" not in at:
        return None
    return float(at["landed"] - at["accepted"]) / 1000


async def submit(c: httpx.AsyncClient, tracker: Tracker, tags: list[str], folders: int,
                 offset: int) -> None:
    gate = asyncio.Semaphore(SUBMIT_CONCURRENCY)

    async def one(i: int, tag: str) -> None:
        async with gate:
            sqid = await land(c, uri(tag, (offset + i) % folders))
        tracker.status.setdefault(sqid, "accepted")

    await asyncio.gather(*(one(i, t) for i, t in enumerate(tags)))


async def drive(c: httpx.AsyncClient, tracker: Tracker, work: Workload,
                start_window: Callable[[], Awaitable[None]],
                end_window: Callable[[], Awaitable[None]]) -> None:
    """Submit the workload and wait until every request settled. The window starts
    before the burst and ends when it settled, or (in-flight) starts once the first N
    are in flight and ends at the last submission, so that it starts and ends with N
    in flight: the work it counts (CPU, counters, histograms) is the work of a steady
    queue, not of one filling up or draining."""
    tag = uuid.uuid4().hex[:8]
    deadline = time.monotonic() + work.timeout_s
    if work.mode != "in-flight":
        await start_window()
    await submit(c, tracker, [f"{tag}-{i}" for i in range(work.n)], work.folders, 0)
    sent = work.n
    if work.mode == "in-flight":
        await start_window()
        while sent < work.total and time.monotonic() < deadline:
            tracker.settled.clear()
            gap = min(work.n - tracker.live(), work.total - sent)
            if gap > 0:
                await submit(c, tracker, [f"{tag}-{sent + i}" for i in range(gap)],
                             work.folders, sent)
                sent += gap
                continue
            try:
                await asyncio.wait_for(tracker.settled.wait(), 5)
            except TimeoutError:  # an event we missed (e.g. before the sqid was known)
                await catch_up(c, tracker)
        await end_window()
    while tracker.live() and time.monotonic() < deadline:
        tracker.settled.clear()
        try:
            await asyncio.wait_for(tracker.settled.wait(), 5)
        except TimeoutError:  # quiet for 5 s: read the list in case an event was missed
            await catch_up(c, tracker)
    if work.mode != "in-flight":
        await end_window()


async def run_workload(root: Path, database_url: str, work: Workload,
                       env: Mapping[str, str]) -> dict[str, Any]:
    async with server(root, database_url, env) as (base, pid), \
            httpx.AsyncClient(base_url=base, timeout=120) as c:
        tracker = Tracker()
        follower = asyncio.create_task(follow(c, tracker))
        try:
            for i in range(3):  # warm-up: imports, caches, the scorer's first history
                sqid = await land(c, uri(f"warm-{uuid.uuid4().hex[:8]}-{i}", 999))
                tracker.status[sqid] = "accepted"
                while tracker.live():
                    await asyncio.sleep(0.05)
                    await catch_up(c, tracker)
            tracker = Tracker()
            follower.cancel()
            follower = asyncio.create_task(follow(c, tracker))
            await asyncio.sleep(0.3)  # the stream is open before the window starts
            start: dict[str, Any] = {}
            end: dict[str, Any] = {}

            async def mark(into: dict[str, Any]) -> None:
                into.update(cpu=cpu_s(pid), load=load(), at=time.perf_counter())
                into["metrics"] = _prom.parse((await c.get("/metrics")).text)

            await drive(c, tracker, work, lambda: mark(start), lambda: mark(end))
            before, cpu0, load0, t0 = start["metrics"], start["cpu"], start["load"], start["at"]
            after, cpu1, load1, t1 = end["metrics"], end["cpu"], end["load"], end["at"]
        finally:
            follower.cancel()
        landed = [s for s, v in tracker.status.items() if v == "landed"]
        in_window = [s for s in landed if t0 <= tracker.landed_at.get(s, t1 + 1) <= t1]
        window = t1 - t0
        count = len(in_window) or 1
        sample = landed if len(landed) <= 400 else landed[:: len(landed) // 400 + 1]
        latencies = [v for v in await asyncio.gather(*(land_to_landed_s(c, s) for s in sample))
                     if v is not None]

    def per(name: str, **want: str) -> float | None:
        d = _prom.delta(before, after, name, **want)
        return None if d is None else d / count

    def ms(q: float | None) -> float | None:
        return None if q is None else q * 1000

    txns = per("submitqueue_db_transactions_total")
    topics = sorted({dict(labels).get("topic", "") for (n, labels) in after
                     if n == "submitqueue_queue_handler_duration_seconds_count"})
    by_topic = {topic: (per("submitqueue_queue_handler_duration_seconds_count", topic=topic),
                        per("submitqueue_queue_handler_duration_seconds_sum", topic=topic))
                for topic in topics}
    return {
        "mode": work.mode, "n": work.n, "folders": work.folders,
        "submitted": len(tracker.status), "landed": len(landed),
        "landed_per_s": len(in_window) / window if window > 0 else None,
        "l2l_p50_s": pct(latencies, 0.5), "l2l_p99_s": pct(latencies, 0.99),
        "cpu_ms": (cpu1 - cpu0) * 1000 / count,
        "spec_p50_ms": ms(_prom.quantile(before, after,
                                         "submitqueue_speculation_run_duration_seconds", 0.5)),
        "spec_p99_ms": ms(_prom.quantile(before, after,
                                         "submitqueue_speculation_run_duration_seconds", 0.99)),
        "planner_p50_ms": ms(_prom.quantile(before, after,
                                            "submitqueue_planner_duration_seconds", 0.5)),
        "planner_p99_ms": ms(_prom.quantile(before, after,
                                            "submitqueue_planner_duration_seconds", 0.99)),
        "msgs": per("submitqueue_queue_published_total"),
        "stmts": per("submitqueue_db_statements_total"),
        "txns": txns,
        "conns": per("submitqueue_db_connections_opened_total"),
        "load": f"{load0}->{load1}",
        "by_topic": by_topic,
        "statements_by_kind": {dict(labels)["kind"]: per("submitqueue_db_statements_total",
                                                          kind=dict(labels)["kind"])
                               for (n, labels) in after
                               if n == "submitqueue_db_statements_total"},
    }
