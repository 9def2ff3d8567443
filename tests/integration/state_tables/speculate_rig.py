"""The vocabulary of ``speculate``'s state tables (test_speculate.py) and its run tests
(test_speculate_runs.py): a small queue seeded directly (batch ``n`` holds request
``n``), the messages a case expects, and checks on what the run wrote."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.db.repos import epochs as epoch_repo
from app.domain.entities import PathEntry, SpeculationPath
from app.domain.queue_config import SpeculationConfig
from app.domain.states import Assumption, BatchState, BuildStatus, PathStatus, RequestState
from tests.support.controllers import (
    NOW_MS,
    Check,
    Rig,
    Seed,
    batch_id,
    path,
    unique,
)

T0 = NOW_MS - 120_000  # when the seeded queue was written
URL = "https://ci.example/1"
S, F = Assumption.SUCCEEDS, Assumption.FAILS
SPEC, CREATED, MERGING = BatchState.SPECULATING, BatchState.CREATED, BatchState.MERGING
CANCELLING = BatchState.CANCELLING
PENDING, BUILDING, PASSED = PathStatus.PENDING, PathStatus.BUILDING, PathStatus.PASSED
P1 = path(1)
P2 = path(2)
P2S, P2F = path(2, (1, S)), path(2, (1, F))


@dataclass(frozen=True)
class E:
    """A path entry, and the build linked to its attempt (``build-<head>``), if any."""

    path: SpeculationPath
    status: PathStatus
    build: BuildStatus | None = None
    attempt: int = 1
    build_id: str = ""
    detail: str = ""  # the runner's last words on the build


@dataclass(frozen=True)
class B:
    """Batch ``n`` (v2) holding request ``n`` in ``member`` (v3)."""

    n: int
    state: BatchState
    deps: tuple[int, ...] = ()
    entries: tuple[E, ...] = ()
    member: RequestState = RequestState.BATCHED
    reason: str = ""


def msg(n: int) -> dict[str, Any]:
    return {"id": batch_id(n), "queue": "demo"}


def queue(*batches: B, budget: int | None = None, coverage: bool = False,
          moved: bool = False, written_ms: int = T0) -> Seed:
    """The batches, written at ``written_ms``; with ``moved``, the merger found the
    target moved outside the queue once (trunk epoch 1), after every seeded build was
    triggered (epoch 0)."""
    async def seed(rig: Rig) -> None:
        if moved:
            async with rig.db.write() as s:
                await epoch_repo.record(s, queue="demo", tip_sha="f" * 40,
                                        batch_id=batch_id(9), now_ms=T0)
        if budget is not None:
            rig.configure(build_budget=budget)
        if coverage:
            rig.configure(speculation=SpeculationConfig(coverage=True,
                                                        coverage_min_remaining=0))
        rig.broker.now_ms = written_ms
        for b in batches:
            req = await rig.request(b.n, b.member, version=3)
            await rig.batch(b.n, b.state, [req], version=2, failure_reason=b.reason,
                            dependencies=tuple(batch_id(d) for d in b.deps))
            if b.entries:
                await rig.path_set(b.n, [stored(e) for e in b.entries])
            for e in b.entries:
                if e.build is not None:
                    await rig.build(e.build_id or f"build-{b.n}", b.n, e.build,
                                    path_id=e.path.id, attempt=e.attempt, log_url=URL,
                                    detail=e.detail)
        rig.broker.now_ms = NOW_MS
    return seed


def stored(e: E) -> PathEntry:
    return PathEntry(path=e.path, status=e.status, attempt=e.attempt, created_at_ms=T0,
                     updated_at_ms=T0)


# -- expected messages --------------------------------------------------------------

def build(p: SpeculationPath, attempt: int = 1) -> tuple[str, str, str]:
    return ("build", p.head, f"{p.head}/build/{p.id}/{attempt}")


def log(n: int, name: str, occurrence: str | None = None) -> tuple[str, str, str]:
    return ("log", f"demo/{n}", f"demo/{n}/{name}/{occurrence or batch_id(n)}")


def merged(n: int) -> list[tuple[str, str, str]]:
    """A merge decision's dispatch, published in the plan's transaction."""
    return [log(n, "speculated"), ("merge", "demo", f"{batch_id(n)}/merge-dispatch")]


def concluded(n: int) -> list[tuple[str, str, str]]:
    return [("conclude", "demo", f"{batch_id(n)}/conclude/speculate")]


def replayed_log(n: int) -> list[str]:
    """A merge's ``speculated`` log, replayed by the pre-step with only the batch named
    (a redelivery's, or the recovery wake-up's)."""
    return [f"demo/{n}/speculated/{batch_id(n)}"]


def repair(n: int) -> tuple[str, str, str]:
    return ("conclude", "demo", unique(f"{batch_id(n)}/conclude/repair"))


# -- checks -------------------------------------------------------------------------

def batch_is(n: int, state: BatchState, version: int, *, deps: tuple[int, ...] = (),
             reason: str = "") -> Check:
    async def check(rig: Rig) -> None:
        b = await rig.get_batch(n)
        assert (b.state, b.version, b.dependencies, b.failure_reason) == (
            state, version, tuple(batch_id(d) for d in deps), reason)
    return check


def entries_are(n: int, *expected: tuple[SpeculationPath, PathStatus, int]) -> Check:
    """Batch ``n``'s stored path entries; a changed one is stamped with the run's time."""
    async def check(rig: Rig) -> None:
        async with rig.db.read() as s:
            from app.db.repos import speculation as spec_repo
            ps = (await spec_repo.path_sets(s, queue="demo", heads=[batch_id(n)]))[batch_id(n)]
        assert [(e.path, e.status, e.attempt) for e in ps.entries] == list(expected)
    return check


def rebuilt_counted(n: int) -> Check:
    """The move's epoch counts ``n`` rebuilt paths, and so does the metric."""
    async def check(rig: Rig) -> None:
        async with rig.db.read() as s:
            latest = await epoch_repo.latest(s, queue="demo")
        assert latest is not None and (latest.epoch, latest.rebuilt) == (1, n)
        assert rig.metrics.rebuilt == [("demo", n)]
    return check


def payloads(rig: Rig, topic: str) -> list[Any]:
    return [p.payload for p in rig.broker.published if p.topic == topic]


def builds_named(rig: Rig) -> None:
    for p in rig.broker.published:
        if p.topic == "build":
            head, _, rest = p.message_id.partition("/build/")
            pid, _, attempt = rest.partition("/")
            assert p.payload == {"id": head, "queue": "demo", "path_id": pid,
                                 "attempt": int(attempt)}


def dispatched(n: int, p: SpeculationPath | None, **extra: Any) -> Check:
    """``speculated`` (naming the batch and the path it merges on) and ``merge``."""
    async def check(rig: Rig) -> None:
        md = {"batch_id": batch_id(n), **({"path_id": p.id} if p else {}), **extra}
        speculated = rig.broker.payload("log", f"demo/{n}/speculated/{batch_id(n)}")
        assert (speculated["status"], speculated["metadata"]) == ("speculated", md)
        assert rig.broker.payload("merge", f"{batch_id(n)}/merge-dispatch") == msg(n)
    return check


def conclusion(n: int, reason: str) -> Check:
    async def check(rig: Rig) -> None:
        assert payloads(rig, "conclude") == [{**msg(n), "failure_reason": reason}]
    return check


def admitted(n: int, deps: tuple[int, ...] = ()) -> Check:
    async def check(rig: Rig) -> None:
        p = rig.broker.payload("log", f"demo/{n}/speculating/{batch_id(n)}")
        assert (p["status"], p["metadata"]) == (
            "speculating", {"batch_id": batch_id(n), "dependencies": [batch_id(d)
                                                                      for d in deps]})
    return check


def event(n: int, name: str, p: SpeculationPath) -> Check:
    async def check(rig: Rig) -> None:
        e = rig.broker.payload("log", f"demo/{n}/{name}/{p.id}")
        assert (e["type"], e["event"], e["metadata"]) == ("event", name, {
            "batch_id": batch_id(n), "path_id": p.id,
            "assumptions": {d: a.value for d, a in p.dependencies}})
    return check


def both(*checks: Check) -> Check:
    async def check(rig: Rig) -> None:
        builds_named(rig)
        assert set(rig.calls()) <= {"scorer"}  # builds are build's to trigger
        for c in checks:
            await c(rig)
    return check


RUNNING_1 = B(1, SPEC, entries=(E(P1, BUILDING, BuildStatus.RUNNING),))
