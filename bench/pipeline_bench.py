"""Pipeline depth benchmark: the real server (``python -m app.cli serve``, one process)
on SQLite and PostgreSQL, fed land requests on the demo queue (fake builds, budget 4).

Two workloads:

- ``--in-flight N``: N requests are kept in flight (each one that settles is replaced
  at once) until ``--requests`` were submitted (default 2N); the measurement window is
  that steady phase, from when the first N are in flight to the last submission, so it
  starts and ends with N in flight (neither the filling nor the drain is in it);
- ``--burst N``: N requests submitted at once; the window runs until all settled.

Each row reports, over its window: landed/s, land->landed p50/p99 (from the requests'
own histories), the server's CPU per landed request (``/proc/<pid>/stat``), speculate
run and planner p50/p99 (``/metrics`` histograms, interpolated inside their buckets),
and per landed request the queue messages, SQL statements, transactions and new
database connections (``/metrics`` counters; "n/a" for a server without them), plus
the load average. Settled requests are followed on the queue's event stream.

``--compare REV`` runs the same workloads against another commit (a git worktree of
it, served by the same Python) in the same run, and prints this/REV ratios.

Only 127.0.0.1 traffic; bounded in count and time. Usage::

    .venv/bin/python bench/pipeline_bench.py --in-flight 200 --folders 1
    .venv/bin/python bench/pipeline_bench.py --burst 200 --folders 20 --compare HEAD~5
        [--only sqlite,postgres] [--pg-url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._pipeline_run import Workload, run_workload

ROOT = Path(__file__).resolve().parents[1]
RATIOS = [("landed_per_s", "landed/s", True), ("l2l_p50_s", "land->landed p50", False),
          ("cpu_ms", "CPU ms/request", False), ("spec_p50_ms", "speculate p50", False),
          ("planner_p50_ms", "planner p50", False), ("msgs", "messages/request", False),
          ("stmts", "statements/request", False)]


def fmt(v: float | None, spec: str = ".1f", unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def row(r: dict[str, Any]) -> str:
    return (f"| {r['rev']} | {r['db']} | {r['mode']} {r['n']} / {r['folders']} | "
            f"{r['landed']}/{r['submitted']} | {fmt(r['landed_per_s'])} | "
            f"{fmt(r['l2l_p50_s'])} / {fmt(r['l2l_p99_s'])} s | {fmt(r['cpu_ms'], '.0f')} | "
            f"{fmt(r['spec_p50_ms'])} / {fmt(r['spec_p99_ms'])} ms | "
            f"{fmt(r['planner_p50_ms'], '.2f')} / {fmt(r['planner_p99_ms'], '.2f')} ms | "
            f"{fmt(r['msgs'])} | {fmt(r['stmts'], '.0f')} | {fmt(r['txns'], '.0f')} | "
            f"{fmt(r['conns'], '.2f')} | {r['load']} |")


HEADER = ("| rev | database | workload / folders | landed | landed/s | land->landed p50 / p99 "
          "| CPU ms/req | speculate run p50 / p99 | planner p50 / p99 | messages/req "
          "| statements/req | transactions/req | connections/req | load avg (start->end) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


@contextlib.contextmanager
def worktree(rev: str) -> Any:
    folder = Path(tempfile.mkdtemp(prefix="sq-bench-rev-"))
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(folder), rev], cwd=ROOT,
                   check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT,
                       check=False)


async def fresh_pg(admin_dsn: str) -> tuple[str, str]:
    import uuid

    import asyncpg

    name = f"bench_pipeline_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base = admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    return name, f"{base}/{name}"


async def drop_pg(admin_dsn: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def database(which: str, pg_url: str) -> AsyncIterator[str]:
    if which == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite+aiosqlite:///{tmp}/bench.db"
        return
    name, url = await fresh_pg(pg_url)
    try:
        yield url
    finally:
        await drop_pg(pg_url, name)


def ratio_lines(rows: list[dict[str, Any]], base_rev: str) -> list[str]:
    out = []
    here = [r for r in rows if r["rev"] != base_rev]
    for r in here:
        other = next((o for o in rows if o["rev"] == base_rev and o["db"] == r["db"]
                      and o["mode"] == r["mode"]), None)
        if other is None:
            continue
        parts = []
        for key, label, higher_better in RATIOS:
            a, b = r[key], other[key]
            if a is None or b is None or not a or not b:
                parts.append(f"{label} n/a")
                continue
            gain = a / b if higher_better else b / a
            parts.append(f"{label} {gain:.2f}x")
        out.append(f"- {r['db']}, {r['mode']} {r['n']} over {r['folders']} folder(s): "
                   + ", ".join(parts) + f" (better when > 1; {r['rev']} vs {base_rev})")
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--in-flight", type=int, help="requests kept in flight")
    mode.add_argument("--burst", type=int, help="requests submitted at once")
    ap.add_argument("--requests", type=int, help="in-flight mode: total submitted "
                                                 "(default 2 x --in-flight)")
    ap.add_argument("--folders", type=int, default=20)
    ap.add_argument("--only", default="sqlite,postgres")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--compare", metavar="REV", help="also run against this commit")
    ap.add_argument("--timeout", type=float, default=900, help="per run, seconds")
    ap.add_argument("--detail", action="store_true",
                    help="also print per-topic handler counts and times per request")
    args = ap.parse_args()
    if args.in_flight is not None:
        work = Workload("in-flight", args.in_flight, args.requests or 2 * args.in_flight,
                        args.folders, args.timeout)
    else:
        n = args.burst or 200
        work = Workload("burst", n, n, args.folders, args.timeout)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip() or "HEAD"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=ROOT, text=True, capture_output=True).stdout.strip()
    label = head + ("+changes" if dirty else "")
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        trees: list[tuple[str, Path]] = []
        if args.compare:
            trees.append((args.compare, stack.enter_context(worktree(args.compare))))
        trees.append((label, ROOT))
        for which in args.only.split(","):
            for rev, root in trees:
                async with database(which, args.pg_url) as url:
                    result = await run_workload(root, url, work, os.environ)
                result.update(rev=rev, db="SQLite" if which == "sqlite" else "PostgreSQL")
                rows.append(result)
                print(row(result), flush=True)
    print(f"\nPipeline benchmark ({work.mode}, one server process, fake builds, budget 4; "
          f"{os.cpu_count()} cores)\n")
    print(HEADER)
    for r in rows:
        print(row(r))
    if args.compare:
        print()
        print("\n".join(ratio_lines(rows, args.compare)))
    if args.detail:
        for r in rows:
            print(f"\n{r['rev']} {r['db']}: per landed request, by topic: handled, "
                  "handler wall ms")
            for topic, (count, seconds) in sorted(r.get("by_topic", {}).items()):
                print(f"  {topic:24} {fmt(count, '.2f'):>6}  {fmt(seconds and seconds * 1000)}")
            kinds = r.get("statements_by_kind", {})
            print("  statements by kind: " + ", ".join(
                f"{k} {fmt(v, '.1f')}" for k, v in sorted(kinds.items())))


if __name__ == "__main__":
    asyncio.run(main())
