"""Pipeline benchmark: the real server (``submitqueue serve``) on SQLite and PostgreSQL.

Measures, per database:
- accept latency of ``POST /api/v1/queues/demo/requests`` (p50/p99) while N requests
  are submitted concurrently;
- sustained landed/s for N requests over F folders (first POST to last landing);
- land -> landed latency (p50/p99) of those requests, from their own histories;
- land -> landed of a single isolated request (p50 over a few sequential ones).

Only 127.0.0.1 traffic; bounded in count and time. Usage::

    .venv/bin/python bench/pipeline_bench.py [--requests 200] [--folders 20]
        [--only sqlite,postgres] [--pg-url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
TERMINAL = {"landed", "error", "cancelled"}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
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


@contextlib.asynccontextmanager
async def server(database_url: str, workdir: Path) -> AsyncIterator[str]:
    port = free_port()
    shutil.copyfile(ROOT / "queues.yaml", workdir / "queues.yaml")
    env = {**os.environ, "SQ_DATABASE_URL": database_url, "SQ_PORT": str(port),
           "SQ_QUEUES_FILE": str(workdir / "queues.yaml"), "SQ_LOG_LEVEL": "WARNING"}
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as c:
            for _ in range(300):
                with contextlib.suppress(httpx.TransportError):
                    if (await c.get(f"{base}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("server did not become ready")
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def land(c: httpx.AsyncClient, change: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    r = await c.post("/api/v1/queues/demo/requests", json={"change_uris": [change]})
    r.raise_for_status()
    return r.json()["sqid"], (time.perf_counter() - t0) * 1000


async def land_to_landed_ms(c: httpx.AsyncClient, sqid: str) -> float | None:
    n = sqid.rsplit("/", 1)[1]
    events = (await c.get(f"/api/v1/queues/demo/requests/{n}/history")).json()["events"]
    at = {e["status"]: e["timestamp_ms"] for e in events if e["type"] == "status"}
    if "landed" not in at or "accepted" not in at:
        return None
    return float(at["landed"] - at["accepted"])


async def wait_all(c: httpx.AsyncClient, sqids: list[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    wanted = set(sqids)
    while True:
        statuses: dict[str, str] = {}
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
            body = (await c.get("/api/v1/queues/demo/requests", params=params)).json()
            statuses.update({i["sqid"]: i["status"] for i in body["items"]})
            cursor = body.get("next_cursor")
            if not cursor:
                break
        mine = {s: statuses.get(s, "?") for s in wanted}
        if all(v in TERMINAL for v in mine.values()) or time.monotonic() > deadline:
            return mine
        await asyncio.sleep(0.2)


async def run_one(label: str, database_url: str, n: int, folders: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with server(database_url, Path(tmp)) as base, \
                httpx.AsyncClient(base_url=base, timeout=60) as c:
            isolated = []
            for i in range(5):
                sqid, _ = await land(c, uri(f"iso-{uuid.uuid4().hex[:8]}-{i}", 999))
                await wait_all(c, [sqid], 30)
                ms = await land_to_landed_ms(c, sqid)
                if ms is not None:
                    isolated.append(ms)
            tag = uuid.uuid4().hex[:8]
            t0 = time.perf_counter()
            results = await asyncio.gather(*(land(c, uri(f"{tag}-{i}", i % folders))
                                             for i in range(n)))
            sqids = [s for s, _ in results]
            accept = [ms for _, ms in results]
            final = await wait_all(c, sqids, timeout=600)
            elapsed = time.perf_counter() - t0
            landed = [s for s, v in final.items() if v == "landed"]
            latencies = [ms for ms in await asyncio.gather(
                *(land_to_landed_ms(c, s) for s in landed)) if ms is not None]
    return {
        "db": label, "requests": n, "folders": folders, "landed": len(landed),
        "accept_p50_ms": pct(accept, 0.5), "accept_p99_ms": pct(accept, 0.99),
        "landed_per_s": len(landed) / elapsed,
        "l2l_p50_ms": pct(latencies, 0.5), "l2l_p99_ms": pct(latencies, 0.99),
        "isolated_l2l_p50_ms": statistics.median(isolated) if isolated else float("nan"),
    }


async def fresh_pg(admin_dsn: str) -> tuple[str, str]:
    name = f"bench_pipeline_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base = admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    return name, f"{base}/{name}"


async def drop_pg(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--folders", type=int, default=20)
    ap.add_argument("--only", default="sqlite,postgres")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    rows = []
    for which in args.only.split(","):
        if which == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                url = f"sqlite+aiosqlite:///{tmp}/bench.db"
                rows.append(await run_one("SQLite", url, args.requests, args.folders))
        elif which == "postgres":
            name, url = await fresh_pg(args.pg_url)
            try:
                rows.append(await run_one("PostgreSQL", url, args.requests, args.folders))
            finally:
                await drop_pg(args.pg_url, name)
    print(f"\nPipeline benchmark: {args.requests} land requests over {args.folders} folders "
          "on the demo queue (fake builds, budget 4), one server process\n")
    print("| database | landed | accept p50 / p99 | landed/s | land->landed p50 / p99 "
          "| isolated land->landed p50 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['db']} | {r['landed']}/{r['requests']} | {r['accept_p50_ms']:.0f} / "
              f"{r['accept_p99_ms']:.0f} ms | {r['landed_per_s']:.1f} | "
              f"{r['l2l_p50_ms'] / 1000:.1f} / {r['l2l_p99_ms'] / 1000:.1f} s | "
              f"{r['isolated_l2l_p50_ms']:.0f} ms |")


if __name__ == "__main__":
    asyncio.run(main())
