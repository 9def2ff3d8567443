"""Pure rules of speculation: refutation, settlement, verdicts, folding build results,
and the first (simple) speculator with a sticky budget. No I/O.

A *path* assumes, for each dependency of its head batch, that the dependency
``succeeds`` (built on top of it) or ``fails`` (built without it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from app.domain.entities import Batch, Build, PathEntry, SpeculationPath
from app.domain.removals import NO_PATH_PASSED as NO_PATH_PASSED  # the one text
from app.domain.states import Assumption, BatchState, BuildStatus, PathStatus


class Resolution(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # failed or cancelled: it will not land
    UNRESOLVED = "unresolved"


def _resolution(state: BatchState) -> Resolution:
    if state is BatchState.SUCCEEDED:
        return Resolution.SUCCEEDED
    if state in (BatchState.FAILED, BatchState.CANCELLED):
        return Resolution.FAILED
    return Resolution.UNRESOLVED


_RESOLUTIONS = {state: _resolution(state) for state in BatchState}


def resolution(state: BatchState) -> Resolution:
    """How a batch in ``state`` resolved (a table lookup: a deep queue's plan asks it for
    every batch)."""
    return _RESOLUTIONS[state]


class Facts(dict[str, Resolution]):
    """Resolutions by batch id that also keep the settled ones as sets, so checking a
    path against them costs about the number of settled outcomes it could contradict
    rather than its length (a deep queue's paths name every batch ahead). Kept up to
    date by item assignment (the only way the planner changes it)."""

    def __init__(self, items: Mapping[str, Resolution]) -> None:
        super().__init__(items)
        self.failed = {d for d, r in self.items() if r is Resolution.FAILED}
        self.succeeded = {d for d, r in self.items() if r is Resolution.SUCCEEDED}

    def __setitem__(self, key: str, value: Resolution) -> None:
        super().__setitem__(key, value)
        self.failed.discard(key)
        self.succeeded.discard(key)
        if value is Resolution.FAILED:
            self.failed.add(key)
        elif value is Resolution.SUCCEEDED:
            self.succeeded.add(key)

    def __delitem__(self, key: str) -> None:
        raise TypeError("facts are never forgotten")

    def update(self, *_: object, **__: object) -> None:
        raise TypeError("assign facts one by one")

    def setdefault(self, *_: object, **__: object) -> Resolution:
        raise TypeError("assign facts one by one")


def broken(path: SpeculationPath, res: Mapping[str, Resolution]) -> bool:
    """A settled dependency contradicts one of the path's assumptions."""
    if isinstance(res, Facts):
        succeeds, fails = path.sides
        return not res.failed.isdisjoint(succeeds) or not res.succeeded.isdisjoint(fails)
    for dep, assumption in path.dependencies:
        r = res.get(dep, Resolution.UNRESOLVED)
        if assumption is Assumption.SUCCEEDS and r is Resolution.FAILED:
            return True
        if assumption is Assumption.FAILS and r is Resolution.SUCCEEDED:
            return True
    return False


def settled(path: SpeculationPath, res: Mapping[str, Resolution]) -> bool:
    """Every assumption came true: the path is exactly what trunk will contain."""
    if isinstance(res, Facts):
        succeeds, fails = path.sides
        return succeeds <= res.succeeded and fails <= res.failed
    return not broken(path, res) and all(
        res.get(dep, Resolution.UNRESOLVED) is not Resolution.UNRESOLVED
        for dep, _ in path.dependencies
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: str  # "merge" | "fail" | "wait"
    path_id: str | None = None
    reason: str = ""


WAIT = Verdict("wait")


def decide(head: Batch, entries: Sequence[PathEntry], res: Mapping[str, Resolution]) -> Verdict:
    """Merge on a passed path whose assumptions all came true; fail when every
    dependency is settled and every unbroken path failed; otherwise wait."""
    unbroken = [e for e in entries if not broken(e.path, res)]
    for e in unbroken:
        if e.status is PathStatus.PASSED and settled(e.path, res):
            return Verdict("merge", e.id)
    if unbroken and all(e.status is PathStatus.FAILED for e in unbroken) and all(
            res.get(d, Resolution.UNRESOLVED) is not Resolution.UNRESOLVED
            for d in head.dependencies):
        return Verdict("fail", reason=NO_PATH_PASSED)
    return WAIT


MAX_BUILD_ATTEMPTS = 5


def fold(entry: PathEntry, build: Build | None, linked: bool, now: int,
         retries: int = 0) -> PathEntry:
    """Fold what the builds say into a path entry's status (observations only).

    A build that ended ``errored`` (infrastructure failure, or lost when its runner
    restarted) gave no verdict: the path gets a new attempt (``pending``, attempt + 1,
    no link yet) up to :data:`MAX_BUILD_ATTEMPTS`; after that it counts as failed. A
    rebuild after the target moved (``rebuilds``, see :func:`rebuild`) is not counted.
    A build that ended ``failed`` gets a new attempt too while the path was retried
    fewer than ``retries`` times (``retried`` + 1; the queue's ``speculation.retries``);
    those attempts are not errored ones either.
    """
    status = entry.status
    if status is PathStatus.CANCELLING:
        if not linked or (build is not None and build.status.terminal):
            status = PathStatus.CANCELLED
    elif status in (PathStatus.PENDING, PathStatus.BUILDING) and build is not None:
        if build.status is BuildStatus.FAILED and entry.retried < retries:
            return replace(entry, status=PathStatus.PENDING, attempt=entry.attempt + 1,
                           retried=entry.retried + 1, updated_at_ms=now)
        if build.status is BuildStatus.ERRORED:
            if entry.attempt - entry.rebuilds - entry.retried < MAX_BUILD_ATTEMPTS:
                return replace(entry, status=PathStatus.PENDING, attempt=entry.attempt + 1,
                               updated_at_ms=now)
            status = PathStatus.FAILED
        else:
            status = _BUILD_TO_PATH.get(build.status, PathStatus.BUILDING)
    return entry if status is entry.status else replace(entry, status=status, updated_at_ms=now)


def outdated(entry: PathEntry, build: Build | None, epoch: int) -> bool:
    """The entry's verdict (passed) or build in progress is of a trunk epoch older than
    ``epoch``: it was built on a tip the target no longer has (it moved outside the
    queue), so it proves nothing about what would land now."""
    return (build is not None and build.epoch < epoch
            and entry.status in (PathStatus.PASSED, PathStatus.BUILDING, PathStatus.PENDING))


def rebuild(entry: PathEntry, now: int) -> PathEntry:
    """A new attempt of an outdated entry, on the trunk as it is now. Not an errored
    attempt: it spends none of :data:`MAX_BUILD_ATTEMPTS`."""
    return replace(entry, status=PathStatus.PENDING, attempt=entry.attempt + 1,
                   rebuilds=entry.rebuilds + 1, updated_at_ms=now)


_BUILD_TO_PATH = {
    BuildStatus.ACCEPTED: PathStatus.BUILDING,
    BuildStatus.RUNNING: PathStatus.BUILDING,
    BuildStatus.SUCCEEDED: PathStatus.PASSED,
    BuildStatus.FAILED: PathStatus.FAILED,
    BuildStatus.CANCELLED: PathStatus.CANCELLED,
}


def cancel(entry: PathEntry, *, linked: bool, now: int) -> PathEntry:
    """Stop a live path: ``cancelling`` until its build ends (``cancelled`` if none). An
    entry already ``cancelling`` is returned as it is (not re-stamped: a cancelling
    batch waiting for its builds is not rewritten by every run)."""
    if entry.status.terminal:
        return entry
    status = PathStatus.CANCELLING if linked else PathStatus.CANCELLED
    return entry if status is entry.status else replace(entry, status=status,
                                                        updated_at_ms=now)


def likely_path(head: Batch, res: Mapping[str, Resolution]) -> SpeculationPath:
    """The simple speculator's one candidate: settled dependencies as they ended,
    unsettled ones assumed to land."""
    return SpeculationPath(head=head.id, dependencies=tuple(
        (d, Assumption.FAILS if res.get(d) is Resolution.FAILED else Assumption.SUCCEEDS)
        for d in head.dependencies))


def sticky_fund(
    heads: Sequence[Batch],
    entries: Mapping[str, Sequence[PathEntry]],
    res: Mapping[str, Resolution],
    budget: int,
    skip: Callable[[SpeculationPath], bool] | None = None,
) -> list[SpeculationPath]:
    """Fill free build slots, oldest head first; never preempt a funded path, never
    fund one ``skip`` refuses."""
    funded = sum(1 for es in entries.values() for e in es if e.status.live)
    free = budget - funded
    out: list[SpeculationPath] = []
    for head in heads:
        if free <= 0:
            break
        path = likely_path(head, res)
        if any(e.id == path.id for e in entries.get(head.id, ())) or \
                (skip is not None and skip(path)):
            continue
        out.append(path)
        free -= 1
    return out


def live(entries: Iterable[PathEntry]) -> list[PathEntry]:
    return [e for e in entries if e.status.live]
