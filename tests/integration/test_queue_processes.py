"""The queue across real OS processes: shared serial consumption and crash redelivery.

Workers are ``python -m tests.integration.queue_worker`` child processes (see that
module); they report what they handled through an ``O_APPEND`` JSON-lines file.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest

from app.queue import Outgoing, TopicSpec, Topology
from tests.conftest import BACKENDS
from tests.integration.queue_support import drained, eventually, started_broker

REPO_ROOT = Path(__file__).resolve().parents[2]
POSTGRES_ONLY = [p for p in BACKENDS if p.id == "postgres"]


def topology(name: str, *, serial: bool, visibility_timeout_ms: int = 60_000) -> Topology:
    topo = Topology()
    topo.declare(TopicSpec(name, serial=serial, visibility_timeout_ms=visibility_timeout_ms))
    topo.subscribe(name, "g")
    return topo


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    ready: Path
    log_path: Path
    log: TextIO

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]


@contextmanager
def workers(tmp_path: Path, count: int, args: list[str]) -> Iterator[list[Worker]]:
    """Start ``count`` worker processes; always stop (and if need be kill) them."""
    started: list[Worker] = []
    try:
        for i in range(count):
            ready = tmp_path / f"ready-{i}"
            log_path = tmp_path / f"worker-{i}.log"
            log = open(log_path, "w")  # noqa: SIM115 - closed in the finally below
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.queue_worker", *args,
                 "--ready", str(ready)],
                cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
            started.append(Worker(proc, ready, log_path, log))
        yield started
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in started:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(timeout=5)
            w.log.close()


async def wait_ready(ws: list[Worker], timeout: float = 20.0) -> None:
    def check() -> bool:
        for w in ws:
            if w.proc.poll() is not None:
                raise AssertionError(
                    f"worker {w.pid} exited with {w.proc.returncode}:\n{w.output()}"
                )
        return all(w.ready.exists() for w in ws)

    await eventually(check, timeout=timeout, interval=0.05, what="workers to start")


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    # Only whole lines: a line is written with one write() call, ending in "\n".
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("database_url", POSTGRES_ONLY, indirect=True)
async def test_two_processes_share_a_serial_topic_in_order_without_overlap(
    database_url: str, tmp_path: Path,
) -> None:
    partitions, per_partition, run = 6, 12, 3
    total = partitions * per_partition
    out = tmp_path / "handled.jsonl"
    expected: dict[str, list[str]] = defaultdict(list)
    batch: list[Outgoing] = []
    # Runs of 3 consecutive messages per partition, the partitions taking turns: a
    # claim that ignored "serial" would take a run's messages together (oldest first).
    for r in range(0, per_partition, run):
        for p in range(partitions):
            for i in range(r, r + run):
                pk, mid = f"p{p}", f"m{p}-{i:02d}"
                batch.append(Outgoing("serialwork", {"i": i}, pk, mid))
                expected[pk].append(mid)

    # Each worker runs at most 2 handlers, so 2 of the 6 partitions are always free
    # and partitions keep moving between the two processes.
    args = ["--url", database_url, "--topic", "serialwork", "--serial", "--mode", "record",
            "--out", str(out), "--sleep-ms", "15", "--concurrency", "2", "--poll-ms", "50"]
    with workers(tmp_path, 2, args) as ws:
        await wait_ready(ws)
        async with started_broker(database_url, topology("serialwork", serial=True)) as broker:
            results = await broker.publish_many(batch)
            assert all(r.created for r in results)
            await eventually(lambda: len(read_lines(out)) >= total, timeout=30,
                             what=f"{total} handled messages")
            # Every delivery settled: a duplicate would already be among the records.
            await eventually(lambda: drained(broker, "serialwork"), timeout=30,
                             what="serialwork drained")
            records = read_lines(out)
            (stats,) = [s for s in await broker.stats() if s.topic == "serialwork"]
        for w in ws:
            assert w.proc.poll() is None, f"worker {w.pid} died:\n{w.output()}"

    handled = Counter((r["partition"], r["message_id"]) for r in records)
    assert sorted(handled) == sorted((pk, m) for pk, ms in expected.items() for m in ms)
    assert set(handled.values()) == {1}, f"handled more than once: {handled.most_common(3)}"
    assert {r["attempt"] for r in records} == {1}
    assert stats.groups[0].depth == 0

    by_partition: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_partition[r["partition"]].append(r)
    handoffs = 0
    for pk, recs in by_partition.items():
        recs.sort(key=lambda r: r["start_ns"])
        assert [r["message_id"] for r in recs] == expected[pk], f"order broken in {pk}"
        for a, b in itertools.pairwise(recs):
            assert a["end_ns"] <= b["start_ns"], (
                f"{pk}: {a['message_id']} (pid {a['pid']}) overlaps "
                f"{b['message_id']} (pid {b['pid']})"
            )
            handoffs += a["pid"] != b["pid"]

    per_pid = Counter(r["pid"] for r in records)
    assert set(per_pid) == {w.pid for w in ws}, f"work was not shared: {dict(per_pid)}"
    # The non-overlap check above must have covered partitions that moved between
    # the processes, or it would only prove that each process is serial on its own.
    assert handoffs > 0, "no partition ever moved between the two processes"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_message_of_a_killed_worker_comes_back_after_the_visibility_timeout(
    database_url: str, tmp_path: Path,
) -> None:
    visibility_ms = 1500
    out = tmp_path / "started.jsonl"
    topo = topology("crashy", serial=True, visibility_timeout_ms=visibility_ms)
    args = ["--url", database_url, "--topic", "crashy", "--serial", "--mode", "block",
            "--out", str(out), "--visibility-ms", str(visibility_ms), "--concurrency", "1"]
    async with started_broker(database_url, topo) as broker:
        await broker.publish_many([Outgoing("crashy", {"n": 1}, "p", "first"),
                                   Outgoing("crashy", {"n": 2}, "p", "second")])
        with workers(tmp_path, 1, args) as (w,):
            await wait_ready([w])
            await eventually(lambda: len(read_lines(out)) == 1, timeout=20,
                             what="the handler to start")
            # While the worker lives, its framework keeps extending the lease: the
            # message stays invisible for longer than the visibility timeout.
            t0 = time.monotonic()
            while time.monotonic() - t0 < visibility_ms / 1000 + 0.5:
                assert await broker.claim("g", "crashy", 10) == [], "the lease was not extended"
                await asyncio.sleep(0.1)
            assert w.proc.poll() is None, w.output()
            os.kill(w.pid, signal.SIGKILL)
            w.proc.wait(timeout=5)
            killed_at = time.monotonic()

        assert w.proc.returncode == -signal.SIGKILL
        got = []
        while not got and time.monotonic() - killed_at < 6:
            got = await broker.claim("g", "crashy", 10)
            if not got:
                await asyncio.sleep(0.05)
        after = time.monotonic() - killed_at

        assert got, "the message of the killed worker never came back"
        (cd,) = got
        assert (cd.message.message_id, cd.message.payload, cd.attempt) == ("first", {"n": 1}, 2)
        # The last extension was at most visibility/3 before the kill, so the lease
        # ran for at least ~1 s after it and at most the visibility timeout.
        assert after >= 0.9, f"redelivered {after:.2f}s after the kill, before the lease lapsed"
        assert after <= visibility_ms / 1000 + 1.5, f"redelivered only after {after:.2f}s"

        (started,) = read_lines(out)
        assert (started["message_id"], started["attempt"], started["pid"]) == ("first", 1, w.pid)
        # The partition stayed blocked behind the lost message (serial topic).
        assert await broker.claim("g", "crashy", 10) == []
        assert await broker.ack(cd)
        (nxt,) = await broker.claim("g", "crashy", 10)
        assert (nxt.message.message_id, nxt.attempt) == ("second", 1)
        assert await broker.ack(nxt)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_killed_worker_restarted_with_its_member_id_resumes_its_message_at_once(
    database_url: str, tmp_path: Path,
) -> None:
    visibility_ms = 30_000  # far longer than the test: only a resume can bring it back
    out = tmp_path / "started.jsonl"
    topo = topology("resumable", serial=True, visibility_timeout_ms=visibility_ms)
    args = ["--url", database_url, "--topic", "resumable", "--serial", "--mode", "block",
            "--out", str(out), "--visibility-ms", str(visibility_ms), "--concurrency", "1",
            "--member-id", "worker-a"]
    async with started_broker(database_url, topo) as broker:
        await broker.publish("resumable", {"n": 1}, partition_key="p", message_id="first")
        (tmp_path / "1").mkdir()
        with workers(tmp_path / "1", 1, args) as (w1,):
            await wait_ready([w1])
            await eventually(lambda: len(read_lines(out)) == 1, timeout=20,
                             what="the handler to start")
            os.kill(w1.pid, signal.SIGKILL)
            w1.proc.wait(timeout=5)
        assert w1.proc.returncode == -signal.SIGKILL
        restarted_at = time.monotonic()
        (tmp_path / "2").mkdir()
        with workers(tmp_path / "2", 1, args) as (w2,):
            await eventually(lambda: len(read_lines(out)) == 2, timeout=20,
                             what="the restarted worker to take its message back")
            after = time.monotonic() - restarted_at
            assert w2.proc.poll() is None, w2.output()
        first, again = read_lines(out)
        assert (first["message_id"], first["attempt"], first["pid"]) == ("first", 1, w1.pid)
        assert (again["message_id"], again["attempt"], again["pid"]) == ("first", 1, w2.pid)
        assert after < visibility_ms / 1000 / 2, f"resumed only after {after:.1f}s"
