"""Merge on full coverage ("bypass"): when a head may land before its dependencies settle.

A head ``H`` whose dependencies ``U`` are still unsettled is *covered* when, for every
combination of outcomes of ``U`` (``2**len(U)`` of them), ``H`` has a passed path whose
assumptions match that combination (dependencies that already settled are fixed by
how they ended). Whatever ``U`` does, some passed build contained exactly ``H`` and the
``U`` members that will land, so ``H`` is proven good independently of ``U``. ``H`` then
lands on the trunk as it is now (the covering path in which every member of ``U``
fails), and each overtaken ``D`` in ``U`` must from then on count ``H`` as one of its
dependencies: none of ``D``'s paths contains ``H``, so all of them are invalid and ``D``
builds again.

A bypass therefore trades ``H``'s wait for ``D``'s rebuild. It *pays* only when ``D``
would not have landed soon anyway; :func:`remaining_ms` estimates how long each batch
still needs and :class:`CoveragePolicy` sets the bar.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from app.domain.entities import PathEntry
from app.domain.states import Assumption, PathStatus
from app.speculation import core
from app.speculation.core import Resolution


@dataclass(frozen=True, slots=True)
class CoveragePolicy:
    """When the planner may merge a head on full coverage.

    ``max_unsettled``: bypass over at most this many unsettled dependencies (needs
    ``2**max_unsettled`` passed paths of the head).

    ``min_remaining``: bypass only when every overtaken dependency is expected to need
    at least this long before it could land, in units of the recent mean build time
    (see :func:`remaining_ms`). At 1.0 the overtaken batch would have needed a whole
    new build anyway, so rebuilding it with the head costs it (in expectation) no extra
    time; 0.0 is the naive rule "bypass as soon as covered".

    ``complements``: when true, the planner funds the complementary paths of heads that
    could then merge on coverage (:mod:`app.speculation.complements`) in at most
    ``complement_slots`` of the slots best-first funding left free. Off by default.
    """

    max_unsettled: int = 2
    min_remaining: float = 1.0
    complements: bool = False
    complement_slots: int = 2

    def __post_init__(self) -> None:
        if self.max_unsettled < 1:
            raise ValueError(f"max_unsettled must be at least 1, got {self.max_unsettled}")
        if self.min_remaining < 0:
            raise ValueError(f"min_remaining must be >= 0, got {self.min_remaining}")
        if self.complement_slots < 0:
            raise ValueError(f"complement_slots must be >= 0, got {self.complement_slots}")


Combo = tuple[Assumption, ...]


def combos(n: int) -> list[Combo]:
    """Every outcome combination of ``n`` dependencies."""
    return list(itertools.product((Assumption.SUCCEEDS, Assumption.FAILS), repeat=n))


def cover(entries: Sequence[PathEntry], unsettled: Sequence[str],
          res: Mapping[str, Resolution]) -> dict[Combo, str] | None:
    """Passed, unbroken ``entries`` (already checked valid for the head) that cover every
    outcome combination of ``unsettled``: combination -> the first such path id.
    ``None`` when some combination has no passed path."""
    found: dict[Combo, str] = {}
    for e in entries:
        if e.status is not PathStatus.PASSED or core.broken(e.path, res):
            continue
        assumed = dict(e.path.dependencies)
        key = tuple(assumed[d] for d in unsettled)
        found.setdefault(key, e.id)
    if len(found) < 2 ** len(unsettled):
        return None
    return found


@dataclass(frozen=True, slots=True)
class Progress:
    """What :func:`remaining_ms` needs to know about the queue."""

    res: Mapping[str, Resolution]
    merging: frozenset[str]
    deps: Mapping[str, Sequence[str]]  # current dependency list per batch
    entries: Mapping[str, Sequence[PathEntry]]
    valid: Callable[[str, PathEntry], bool]  # does the entry match the batch's dependencies
    now_ms: int
    mean_build_ms: float


def remaining_ms(batch: str, p: Progress, _memo: dict[str, float] | None = None) -> float:
    """Optimistic estimate of how long ``batch`` still needs before it could land.

    Settled or merging: 0. Otherwise the larger of its *own* need and what its unsettled
    dependencies need: own need is 0 with a passed unbroken path, else the soonest end of
    a live unbroken path (started at ``updated_at_ms``, lasting ``mean_build_ms``), else one
    whole build (nothing useful runs, it must build again).
    """
    memo: dict[str, float] = {} if _memo is None else _memo
    if batch in memo:
        return memo[batch]
    memo[batch] = 0.0  # cycle guard: a batch never waits on itself
    if p.res.get(batch, Resolution.UNRESOLVED) is not Resolution.UNRESOLVED \
            or batch in p.merging:
        return 0.0
    usable = [e for e in p.entries.get(batch, ()) if p.valid(batch, e)
              and not core.broken(e.path, p.res)]
    if any(e.status is PathStatus.PASSED for e in usable):
        own = 0.0
    else:
        ends = [e.updated_at_ms + p.mean_build_ms - p.now_ms for e in usable
                if e.status in (PathStatus.PENDING, PathStatus.BUILDING)]
        own = max(0.0, min(ends)) if ends else p.mean_build_ms
    wait = max((remaining_ms(d, p, memo) for d in p.deps.get(batch, ())
                if p.res.get(d, Resolution.UNRESOLVED) is Resolution.UNRESOLVED), default=0.0)
    memo[batch] = max(own, wait)
    return memo[batch]
