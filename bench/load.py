"""Load benchmark: accept latency at increasing concurrency, and sustained landed/s.

Real ``submitqueue serve`` processes on a ``demo`` queue of fakes (zero-delay builds,
``pathoverlap`` by directory, budget 4), driven over HTTP on 127.0.0.1 only:

1. **Accept latency.** For each concurrency level C, C clients each POST land
   requests back to back (closed loop) until ``--accept-requests`` were sent or
   ``--max-seconds`` passed; p50/p99 of the POST round trip and the accepted/s. The
   pipeline drains (every request terminal) before the next level, so each level
   starts from an idle server; its own requests flow through the pipeline while it runs.
2. **Sustained landing.** ``--land-requests`` requests over ``--folders`` folders,
   POSTed by 32 clients; landed/s = landed / (first POST -> last request terminal).

Set-ups: SQLite with one process (SQLite is single-process by design), PostgreSQL
with one process and with ``--processes`` processes sharing one database (the
clients spread their POSTs over them round-robin).

Usage (from the checkout)::

    .venv/bin/python -m bench.load [--only sqlite,pg1,pg3] [--levels 1,8,32,64] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._servers import (
    PG_ADMIN_DSN,
    TERMINAL,
    Cluster,
    create_pg_database,
    drop_pg_database,
    pct,
)

QUEUES = """\
queues:
  - name: demo
    change_provider: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    scorer: {type: constant, probability: 0.9}
    build_budget: 4
"""


@dataclass
class Level:
    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    accepted_per_s: float
    refused: int  # 503 answers, each retried after 50 ms (included in the latency)


@dataclass
class SetupResult:
    setup: str
    processes: int
    levels: list[Level] = field(default_factory=list)
    land_requests: int = 0
    landed: int = 0
    land_seconds: float = 0.0
    landed_per_s: float = 0.0
    not_terminal: int = 0
    land_refused: int = 0


def change_uri(tag: str, folder: int) -> str:
    sha = hashlib.sha1(tag.encode()).hexdigest()
    return f"git://demo.example.com/demo/refs%2Fheads%2F{tag}/{sha}?sq-files=f{folder}/{tag}.py"


class Load:
    def __init__(self, cluster: Cluster, client: httpx.AsyncClient, folders: int) -> None:
        self.urls = [s.url for s in cluster.servers]
        self.client = client
        self.folders = folders
        self.next_url = itertools.cycle(self.urls)
        self.counter = itertools.count()
        self.run = uuid.uuid4().hex[:6]
        self.refused = 0  # 503 answers (retried)

    async def land(self) -> tuple[str, float]:
        """One land request, retried on 503 ("try again") as a client should; the
        latency runs from the first attempt to the 202."""
        i = next(self.counter)
        body = {"change_uris": [change_uri(f"{self.run}-{i}", i % self.folders)]}
        t0 = time.perf_counter()
        for _ in range(100):
            r = await self.client.post(f"{next(self.next_url)}/api/v1/queues/demo/requests",
                                       json=body)
            if r.status_code == 202:
                return r.json()["sqid"], (time.perf_counter() - t0) * 1000
            if r.status_code != 503:
                break
            self.refused += 1
            await asyncio.sleep(0.05)
        raise RuntimeError(f"land answered {r.status_code}: {r.text}")

    async def clients(self, concurrency: int, total: int,
                      max_seconds: float) -> tuple[list[str], list[float], float]:
        """``concurrency`` closed-loop clients sharing a budget of ``total`` POSTs."""
        budget = itertools.count()
        sqids: list[str] = []
        latencies: list[float] = []
        t0 = time.perf_counter()
        deadline = time.monotonic() + max_seconds

        async def one_client() -> None:
            while next(budget) < total and time.monotonic() < deadline:
                sqid, ms = await self.land()
                sqids.append(sqid)
                latencies.append(ms)

        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return sqids, latencies, time.perf_counter() - t0

    async def statuses(self) -> dict[str, str]:
        out: dict[str, str] = {}
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
            r = await self.client.get(f"{self.urls[0]}/api/v1/queues/demo/requests",
                                      params=params)
            r.raise_for_status()
            body = r.json()
            out.update({i["sqid"]: i["status"] for i in body["items"]})
            cursor = body.get("next_cursor")
            if not cursor:
                return out

    async def drain(self, sqids: list[str], timeout: float) -> dict[str, str]:
        """Until every one of ``sqids`` is terminal, or ``timeout``; their statuses."""
        deadline = time.monotonic() + timeout
        while True:
            statuses = await self.statuses()
            mine = {s: statuses.get(s, "?") for s in sqids}
            if all(v in TERMINAL for v in mine.values()) or time.monotonic() > deadline:
                return mine
            await asyncio.sleep(0.2)


async def run_setup(label: str, database_url: str, processes: int, workdir: Path,
                    args: argparse.Namespace) -> SetupResult:
    (workdir / "queues.yaml").write_text(QUEUES)
    env = {"SQ_DATABASE_URL": database_url, "SQ_QUEUES_FILE": str(workdir / "queues.yaml"),
           "SQ_LOG_LEVEL": "WARNING", "SQ_HOST": "127.0.0.1"}
    cluster = Cluster(workdir, processes, env)
    result = SetupResult(setup=label, processes=processes)
    await cluster.start()
    try:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            load = Load(cluster, client, args.folders)
            await load.drain([(await load.land())[0]], 30)  # warm up every stage once
            for c in args.levels:
                load.refused = 0
                sqids, lat, secs = await load.clients(c, max(args.accept_requests, c),
                                                      args.max_seconds)
                result.levels.append(Level(c, len(lat), round(secs, 2), pct(lat, 0.5),
                                           pct(lat, 0.99), len(lat) / secs, load.refused))
                await load.drain(sqids, args.max_seconds * 4)
            load.refused = 0
            t0 = time.perf_counter()
            sqids, _, _ = await load.clients(32, args.land_requests, args.max_seconds)
            result.land_refused = load.refused
            final = await load.drain(sqids, args.max_seconds * 4)
            result.land_seconds = time.perf_counter() - t0
            result.land_requests = len(sqids)
            result.landed = sum(1 for v in final.values() if v == "landed")
            result.not_terminal = sum(1 for v in final.values() if v not in TERMINAL)
            result.landed_per_s = result.landed / result.land_seconds
    finally:
        cluster.stop()
    return result


def tables(results: list[SetupResult]) -> str:
    levels = sorted({lv.concurrency for r in results for lv in r.levels})
    head = "| set-up | " + " | ".join(f"C={c} p50 / p99 (accepted/s)" for c in levels) + " |"
    out = [head, "|---|" + "---|" * len(levels)]
    for r in results:
        cells = {lv.concurrency: f"{lv.p50_ms:.0f} / {lv.p99_ms:.0f} ms ({lv.accepted_per_s:.0f})"
                 + (f" [{lv.refused} x 503]" if lv.refused else "") for lv in r.levels}
        out.append(f"| {r.setup} | " + " | ".join(cells.get(c, "-") for c in levels) + " |")
    out += ["", "| set-up | land requests | 503s retried | landed | not terminal | seconds "
            "| landed/s |", "|---|---|---|---|---|---|---|"]
    out += [f"| {r.setup} | {r.land_requests} | {r.land_refused} | {r.landed} | "
            f"{r.not_terminal} | {r.land_seconds:.1f} | {r.landed_per_s:.1f} |" for r in results]
    return "\n".join(out)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="sqlite,pg1,pg3", help="set-ups: sqlite, pg1, pg3")
    ap.add_argument("--levels", default="1,8,32,64", help="client concurrency levels")
    ap.add_argument("--accept-requests", type=int, default=100,
                    help="POSTs per concurrency level (at least C)")
    ap.add_argument("--land-requests", type=int, default=200)
    ap.add_argument("--folders", type=int, default=20)
    ap.add_argument("--processes", type=int, default=3, help="processes of the pg3 set-up")
    ap.add_argument("--max-seconds", type=float, default=60.0,
                    help="bound of each phase (draining gets 4x)")
    ap.add_argument("--pg-url", default=PG_ADMIN_DSN)
    ap.add_argument("--keep", action="store_true", help="keep the work directories (logs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.levels = [int(c) for c in args.levels.split(",")]
    results = []
    for which in args.only.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"sq-load-{which}-"))
        try:
            if which == "sqlite":
                url = f"sqlite+aiosqlite:///{workdir}/load.db"
                results.append(await run_setup("SQLite, 1 process", url, 1, workdir, args))
                continue
            n = 1 if which == "pg1" else args.processes
            url = await create_pg_database(args.pg_url, prefix="sq_load")
            try:
                label = f"PostgreSQL, {n} process{'es' if n > 1 else ''}"
                results.append(await run_setup(label, url, n, workdir, args))
            finally:
                await drop_pg_database(url, args.pg_url)
        finally:
            if args.keep:
                print(f"work directory kept: {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(f"\nLoad: demo queue (fakes, zero-delay builds), {args.folders} folders; "
              f"accept latency of POST land with C closed-loop clients "
              f"({args.accept_requests} POSTs per level); sustained landing of "
              f"{args.land_requests} requests\n")
        print(tables(results))
    return 0 if all(r.not_terminal == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
