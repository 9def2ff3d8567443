"""A queue worker run as a separate OS process by ``test_queue_processes.py``.

Run from the repository root::

    python -m tests.integration.queue_worker --url URL --topic T [--serial] \
        --mode record|block --out FILE --ready FILE [...]

``record``: each handled message appends one JSON line ``{partition, message_id, pid,
attempt, start_ns, end_ns}`` to ``--out`` (one ``write`` on an ``O_APPEND`` descriptor,
so lines from several processes never interleave), after sleeping ``--sleep-ms``.
Times are ``CLOCK_MONOTONIC``, which is system-wide on Linux and so comparable
between processes.

``block``: the handler appends a line ``{message_id, pid, attempt, start_ns}`` to
``--out`` and then blocks forever (until the process is killed), while the consumer
framework keeps extending its lease.

``--member-id``: the broker's member id (a restart with the same one resumes its claims).

The worker touches ``--ready`` once it is consuming, stops on SIGTERM/SIGINT, and
exits on its own after ``--lifetime-s`` or when its parent process goes away.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
from typing import Any

from app.queue import (
    Broker,
    Consumer,
    ConsumerSpec,
    Delivery,
    TopicSpec,
    Topology,
    backend_for_url,
)


def clock_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class LineLog:
    """Append whole JSON lines to a file shared with other processes."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        written = os.write(self.fd, data)
        assert written == len(data), "short write to the shared log"

    def close(self) -> None:
        os.close(self.fd)


class RecordingController:
    def __init__(self, log: LineLog, sleep_ms: int) -> None:
        self.log = log
        self.sleep_s = sleep_ms / 1000

    async def process(self, delivery: Delivery) -> None:
        start = clock_ns()
        await asyncio.sleep(self.sleep_s)
        end = clock_ns()
        # Written before the framework acks, so the next message of this partition
        # (claimable only after the ack) must start after ``end``.
        self.log.append({
            "partition": delivery.partition_key,
            "message_id": delivery.message_id,
            "pid": os.getpid(),
            "attempt": delivery.attempt,
            "start_ns": start,
            "end_ns": end,
        })


class BlockingController:
    def __init__(self, log: LineLog) -> None:
        self.log = log

    async def process(self, delivery: Delivery) -> None:
        self.log.append({
            "partition": delivery.partition_key,
            "message_id": delivery.message_id,
            "pid": os.getpid(),
            "attempt": delivery.attempt,
            "start_ns": clock_ns(),
        })
        await asyncio.Event().wait()  # hangs until the process is killed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="g")
    p.add_argument("--serial", action="store_true")
    p.add_argument("--visibility-ms", type=int, default=60_000)
    p.add_argument("--mode", choices=["record", "block"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--sleep-ms", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--poll-ms", type=int, default=50)
    p.add_argument("--lifetime-s", type=float, default=60.0)
    p.add_argument("--member-id", default=None)
    return p.parse_args(argv)


async def _watch_parent(stop: asyncio.Event) -> None:
    parent = os.getppid()
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            return
        await asyncio.sleep(0.2)


async def run(args: argparse.Namespace) -> None:
    topology = Topology()
    topology.declare(TopicSpec(args.topic, serial=args.serial,
                               visibility_timeout_ms=args.visibility_ms))
    topology.subscribe(args.topic, args.group)
    log = LineLog(args.out)
    controller: Any = (
        RecordingController(log, args.sleep_ms) if args.mode == "record"
        else BlockingController(log)
    )
    broker = Broker(backend_for_url(args.url), topology, member_id=args.member_id)
    await broker.start()
    consumer = Consumer(
        broker,
        ConsumerSpec(args.topic, args.group, controller, concurrency=args.concurrency),
        poll_interval_ms=args.poll_ms,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(_watch_parent(stop))
    consumer.start()
    try:
        with open(args.ready, "w") as fh:
            fh.write(str(os.getpid()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=args.lifetime_s)
    finally:
        stop.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await consumer.stop(grace_ms=1000)
        await broker.close()
        log.close()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
