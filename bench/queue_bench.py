"""Throughput and wake-up latency of the durable queue (``app/queue``) on SQLite and
PostgreSQL, next to pgqueuer and procrastinate on the same PostgreSQL.

A benchmark, not a test: it prints a table (``--json`` for machine-readable output).

Throughput: ``--messages`` messages over ``--partitions`` partitions, published one per
call by ``--publishers`` concurrent tasks (each owns a disjoint set of partitions, so the
publish order of a partition is defined), consumed by ``--consumers`` consumers; measured
from the first publish to the last ack. Then every partition's handled sequence is checked
against its publish sequence (count and order).

Latency: one message at a time at ``--latency-rate`` per second to idle consumers whose poll
interval is 5 s, so wake-ups are measured, not polling: publish() call -> handler start.

pgqueuer and procrastinate run the same workload (``bench/_competitors.py``), each on a fresh
database; "last ack" for them is when their job table has no unfinished job left. A system
slower than ``--timeout`` is stopped and reported with its partial rate.

    .venv/bin/python -m bench.queue_bench [--only sqlite,postgres,pgqueuer,procrastinate]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from app.db.migrate import upgrade_sync
from app.queue import (
    Broker,
    ConsumerService,
    ConsumerSpec,
    Delivery,
    TopicSpec,
    Topology,
    backend_for_url,
)
from app.queue.backends import postgres_dsn_from_url
from bench._queue_workload import OnStart, Workload

SYSTEMS = ("sqlite", "postgres", "pgqueuer", "procrastinate")
TOPIC, GROUP = "bench", "bench"
@dataclass
class Result:
    system: str
    variant: str
    messages: int = 0
    seconds: float = 0.0
    msgs_per_s: float = 0.0
    publish_per_s: float = 0.0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    exactly_once: bool | None = None
    in_order: bool | None = None
    order_promised: bool = False
    note: str = ""


class System(Protocol):
    name: str
    variant: str
    ordered: bool

    async def start(self, on_start: OnStart) -> None: ...

    async def publish(self, phase: str, p: int, i: int) -> None: ...

    async def settled(self, published: int) -> bool: ...

    def problems(self) -> str: ...

    async def close(self) -> None: ...


class Tracker:
    """What the handlers saw, in the order they started."""

    def __init__(self, expected: int) -> None:
        self.seen: dict[int, list[int]] = defaultdict(list)
        self.handled = 0
        self.expected = expected
        self.started_at = 0.0  # first publish (perf_counter)
        self.result: Result | None = None  # throughput, once measured
        self.all_started = asyncio.Event()
        self.latency_started: dict[int, float] = {}
        self.latency_event = asyncio.Event()

    def on_start(self, phase: str, p: int, i: int) -> None:
        if phase == "lat":
            self.latency_started.setdefault(i, time.perf_counter())
            self.latency_event.set()
            return
        self.seen[p].append(i)
        self.handled += 1
        if self.handled >= self.expected:
            self.all_started.set()

    def verify(self, w: Workload) -> tuple[bool, bool]:
        """(every message handled exactly once, every partition handled in publish order)."""
        counts = [len(range(p, w.messages, w.partitions)) for p in range(w.partitions)]
        once = self.handled == w.messages and all(
            sorted(self.seen[p]) == list(range(n)) for p, n in enumerate(counts)
        )
        ordered = all(self.seen[p] == list(range(n)) for p, n in enumerate(counts))
        return once, ordered

    def in_order_so_far(self) -> bool:
        return all(seen == list(range(len(seen))) for seen in self.seen.values())


async def _until(predicate: Callable[[], Any], interval: float = 0.005) -> None:
    while not await predicate():
        await asyncio.sleep(interval)


async def measure(system: System, w: Workload, tracker: Tracker) -> Result:
    """Throughput, then latency; ``tracker.result`` holds whatever is measured so far."""
    await system.start(tracker.on_start)

    async def publisher(items: list[tuple[int, int]]) -> None:
        for p, i in items:
            await system.publish("tput", p, i)

    t0 = tracker.started_at = time.perf_counter()
    await asyncio.gather(*(publisher(items) for items in w.plan()))
    published = time.perf_counter() - t0
    await tracker.all_started.wait()
    await _until(lambda: system.settled(w.messages))
    elapsed = time.perf_counter() - t0
    once, ordered = tracker.verify(w)
    result = tracker.result = Result(
        system=system.name, variant=system.variant, messages=w.messages,
        seconds=round(elapsed, 3), msgs_per_s=round(w.messages / elapsed, 1),
        publish_per_s=round(w.messages / published, 1),
        exactly_once=once, in_order=ordered, order_promised=system.ordered,
        note=system.problems(),
    )

    sent: dict[int, float] = {}
    start = time.perf_counter()
    for k in range(w.latency_messages):
        await asyncio.sleep(max(0.0, start + k / w.latency_rate - time.perf_counter()))
        sent[k] = time.perf_counter()
        await system.publish("lat", k % w.partitions, k)
    while len(tracker.latency_started) < w.latency_messages:
        tracker.latency_event.clear()
        await tracker.latency_event.wait()
    await _until(lambda: system.settled(w.messages + w.latency_messages))
    lat = sorted((tracker.latency_started[k] - t) * 1000 for k, t in sent.items())
    if lat:
        result.latency_p50_ms = round(statistics.median(lat), 2)
        result.latency_p99_ms = round(lat[int(0.99 * (len(lat) - 1))], 2)
    return result


class _Recorder:
    def __init__(self, on_start: OnStart) -> None:
        self.on_start = on_start

    async def process(self, delivery: Delivery) -> None:
        body = delivery.payload
        self.on_start(body["k"], body["p"], body["i"])


class SubmitQueue:
    """Our queue: a serial topic; on PostgreSQL one Broker (own pool) per consumer and one
    for the publishers, as separate processes would have; on SQLite one shared Broker."""

    ordered = True

    def __init__(self, name: str, url: str, w: Workload) -> None:
        self.name, self.url, self.w = name, url, w
        shared = url.startswith("sqlite")
        self.variant = (
            f"serial, {w.consumers} consumers x {w.concurrency}"
            + (" (one broker)" if shared else f", {w.consumers + 1} brokers")
        )
        self.brokers: list[Broker] = []
        self.services: list[ConsumerService] = []

    async def start(self, on_start: OnStart) -> None:
        upgrade_sync(self.url)
        topology = Topology()
        topology.declare(TopicSpec(TOPIC, serial=True))
        topology.subscribe(TOPIC, GROUP)
        shared = self.url.startswith("sqlite")
        for _ in range(1 if shared else self.w.consumers + 1):
            self.brokers.append(Broker(backend_for_url(self.url), topology))
            await self.brokers[-1].start()
        recorder = _Recorder(on_start)
        for n in range(self.w.consumers):
            broker = self.brokers[0 if shared else n + 1]
            spec = ConsumerSpec(TOPIC, GROUP, recorder, concurrency=self.w.concurrency)
            self.services.append(ConsumerService(broker, [spec], poll_interval_ms=5000))
        for service in self.services:
            await service.start()

    async def publish(self, phase: str, p: int, i: int) -> None:
        await self.brokers[0].publish(TOPIC, {"k": phase, "p": p, "i": i},
                                      partition_key=f"p{p}", message_id=f"{phase}-{i}")

    async def settled(self, published: int) -> bool:
        acked = sum(c.counters.acked for s in self.services for c in s.consumers)
        return acked >= published

    def problems(self) -> str:
        """Outcomes other than an ack (none are expected: every handler succeeds)."""
        outcomes: dict[str, int] = defaultdict(int)
        for service in self.services:
            for consumer in service.consumers:
                for outcome, n in consumer.counters.by_outcome.items():
                    outcomes[outcome] += n if outcome != "acked" else 0
        return ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()) if n)

    async def close(self) -> None:
        for service in self.services:
            await service.stop()
        for broker in self.brokers:
            await broker.close()


@contextlib.asynccontextmanager
async def scratch_database(admin_dsn: str, label: str) -> AsyncIterator[str]:
    """A fresh ``bench_*`` database on the admin connection's server, dropped afterwards."""
    import asyncpg

    name = f"bench_{label}_{os.getpid()}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlsplit(admin_dsn)._replace(path=f"/{name}").geturl()
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def run_one(system: System, w: Workload, label: str) -> Result:
    tracker = Tracker(w.messages)
    try:
        return await asyncio.wait_for(measure(system, w, tracker), w.timeout)
    except TimeoutError:  # report what was measured, else the rate of handlers so far
        if tracker.result is not None:
            tracker.result.note = f"latency phase timed out after {w.timeout:g}s"
            return tracker.result
        elapsed = time.perf_counter() - tracker.started_at if tracker.started_at else 0.0
        rate = round(tracker.handled / elapsed, 1) if elapsed else 0.0
        note = f"timed out after {w.timeout:g}s, {tracker.handled} handled: partial rate"
        return Result(system=system.name, variant=system.variant, messages=tracker.handled,
                      seconds=round(elapsed, 3), msgs_per_s=rate, note=note,
                      in_order=tracker.in_order_so_far(), order_promised=system.ordered)
    except Exception as exc:  # a benchmark reports a failed system and carries on
        note = f"failed: {type(exc).__name__}: {exc}"
        return Result(system=system.name, variant=system.variant, note=note)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(system.close(), 30)
        print(f"  done: {label}", file=sys.stderr)


async def run_all(args: argparse.Namespace, w: Workload) -> list[Result]:
    from bench._competitors import PgQueuerSystem, ProcrastinateSystem

    only = set(args.only.split(","))
    admin = postgres_dsn_from_url(args.pg_url)
    results: list[Result] = []
    if "sqlite" in only:
        with tempfile.TemporaryDirectory(prefix="bench_sq_") as tmp:
            url = f"sqlite+aiosqlite:///{tmp}/queue.db"
            results.append(await run_one(SubmitQueue("submitqueue/sqlite", url, w), w, "sqlite"))
    if "postgres" in only:
        async with scratch_database(admin, "sq") as dsn:
            url = dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
            system = SubmitQueue("submitqueue/postgres", url, w)
            results.append(await run_one(system, w, "postgres"))
    if "pgqueuer" in only:
        async with scratch_database(admin, "pgq") as dsn:
            results.append(await run_one(PgQueuerSystem(dsn, w), w, "pgqueuer"))
    if "procrastinate" in only:
        for lock in (True, False):
            async with scratch_database(admin, "proc") as dsn:
                results.append(await run_one(ProcrastinateSystem(dsn, w, lock=lock), w,
                                             f"procrastinate lock={lock}"))
    return results


def _rate(results: list[Result], name: str, variant: str = "") -> float | None:
    for r in results:
        if r.system == name and variant in r.variant and r.msgs_per_s:
            return r.msgs_per_s
    return None


def verdicts(results: list[Result]) -> list[dict[str, Any]]:
    lite, pg = _rate(results, "submitqueue/sqlite"), _rate(results, "submitqueue/postgres")
    pgq = _rate(results, "pgqueuer")
    proc = max((r.msgs_per_s for r in results if r.system == "procrastinate" and r.msgs_per_s),
               default=None)
    p50 = next((r.latency_p50_ms for r in results if r.system == "submitqueue/sqlite"), None)
    rows = [
        ("SQLite end to end >= 3,000 msg/s", lite, 3000.0, "msg/s"),
        ("PostgreSQL >= 1.0x pgqueuer end to end",
         pg / pgq if pg and pgq else None, 1.0, "x"),
        ("PostgreSQL >= 5x procrastinate (its faster variant)",
         pg / proc if pg and proc else None, 5.0, "x"),
    ]
    out = [{"target": t, "value": None if v is None else round(v, 2), "goal": g, "unit": u,
            "met": None if v is None else v >= g} for t, v, g, u in rows]
    out.append({"target": "SQLite publish -> handler p50 < 5 ms", "value": p50, "goal": 5.0,
                "unit": "ms", "met": None if p50 is None else p50 < 5.0})
    return out


def ratios(results: list[Result]) -> dict[str, float]:
    pg = _rate(results, "submitqueue/postgres")
    return {f"{r.system} ({r.variant})": round(pg / r.msgs_per_s, 2) for r in results
            if pg and r.msgs_per_s and not r.system.startswith("submitqueue")}


def print_table(results: list[Result], w: Workload, checks: list[dict[str, Any]]) -> None:
    print(f"\n{w.messages} messages over {w.partitions} partitions, published one per call by "
          f"{w.publishers} concurrent publishers, {w.consumers} consumers; SubmitQueue uses a "
          "SERIAL topic (per-partition order, at most one in flight per partition).")
    print(f"Latency: {w.latency_messages} messages one at a time at {w.latency_rate:g}/s, "
          "consumers idle (poll interval 5 s): publish() -> handler start.\n")
    head = ("system", "variant", "seconds", "msg/s e2e", "publish/s", "p50 ms", "p99 ms",
            "exactly once", "in order")
    rows = [head]
    notes: list[str] = []
    for r in results:
        order = "-" if r.in_order is None else ("yes" if r.in_order else "NO")
        if not r.order_promised and r.in_order is not None:
            order += " (not promised)"
        if r.note:
            notes.append(r.note)
            order += f" [{len(notes)}]"
        rows.append((r.system, r.variant, f"{r.seconds:.2f}", f"{r.msgs_per_s:,.0f}",
                     f"{r.publish_per_s:,.0f}", _fmt(r.latency_p50_ms), _fmt(r.latency_p99_ms),
                     "-" if r.exactly_once is None else ("yes" if r.exactly_once else "NO"),
                     order))
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * width for width in widths))
    for n, note in enumerate(notes, 1):
        print(f"[{n}] {note}")
    print("\nRatios (SubmitQueue/PostgreSQL end to end vs. each, same run):")
    for other, ratio in ratios(results).items():
        print(f"  vs {other}: {ratio:.2f}x")
    print("\nTargets:")
    for c in checks:
        met = {True: "MET", False: "NOT MET", None: "not measured"}[c["met"]]
        print(f"  {c['target']}: {_fmt(c['value'])} {c['unit']} -> {met}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def main(argv: list[str] | None = None) -> None:
    default_pg = os.environ.get("SQ_TEST_POSTGRES_URL",
                                "postgresql://postgres@127.0.0.1:5432/test")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=50)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=10,
                        help="handlers in flight per consumer (procrastinate: per worker)")
    parser.add_argument("--latency-messages", type=int, default=1000)
    parser.add_argument("--latency-rate", type=float, default=250.0)
    parser.add_argument("--only", default=",".join(SYSTEMS))
    parser.add_argument("--pg-url", default=default_pg,
                        help="admin connection used to create and drop bench_* databases")
    parser.add_argument("--timeout", type=float, default=150.0,
                        help="seconds per system; a slower one reports its partial rate")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {','.join(SYSTEMS)}")
    w = Workload(args.messages, args.partitions, args.publishers, args.consumers,
                 args.concurrency, args.latency_messages, args.latency_rate, args.timeout)
    results = asyncio.run(run_all(args, w))
    checks = verdicts(results)
    if args.json:
        print(json.dumps({"workload": asdict(w), "results": [asdict(r) for r in results],
                          "postgres_ratios": ratios(results), "targets": checks}, indent=2))
    else:
        print_table(results, w, checks)


if __name__ == "__main__":
    main()
