"""What will happen next to a batch, from the speculation planner's own numbers (pure).

**The model** is the planner's: every batch ``B`` is *good* with probability
``p(B)``, the queue's scorer (the same number the best-first generator ranks paths
with; an error or a value outside (0, 1) counts as 0.95), independently of the
others. A build of a path passes iff the head and every dependency the path assumes
to land (built underneath) are good. A good batch eventually lands: the path whose
assumptions come true gets funded and passes, and the planner merges on it.

**P(land)** of a live batch is ``P(head good | what its builds showed)``:

- a passed build proves the head good under the model: 1;
- each failed build of a path with base ``S`` says "not (head good and all of ``S``
  good)"; with ``q = P(every failed-build statement holds | head good)`` (exact
  enumeration over the dependencies involved, at most :data:`MAX_EXACT` of them;
  beyond that the statements are treated as independent), the posterior is
  ``p q / (p q + 1 - p)``. A failed build on top of landed dependencies only gives 0.
- no finished build: the prior ``p(head)``.

A batch being cancelled gets 0; a landed one 1; a failed or cancelled one 0. The
model does not include merge conflicts, cancels that have not happened yet, or dead
letters: P(land) is the planner's belief, not a promise.

**P(speculation holds)** is the probability that the build work already funded for
the head counts: the sum, over its live and passed paths not yet contradicted, of the
probability that the path's assumptions about unsettled dependencies all come true
(``exp`` of the generator's path score; distinct paths of one head are disjoint
events). With nothing funded it is the probability of the path the planner would
fund first (the generator's best candidate).

**ETA** is the expected time to land *if it lands*, from this queue's recent median
build duration ``b`` and median merge duration ``m`` (speculated -> landed):
``max(own build done, every unsettled dependency landed) + (1 - P(holds)) * b + m``,
where the own build is done now (a passed path), at ``now + b`` (nothing built yet)
or, for a build under way for ``e`` ms, at ``start +`` the median of the recent
builds that lasted at least ``e`` (none did: unknown); a merging batch likewise
lands at ``merging since +`` the median of the merges at least as long as this one.
Dependencies are forecast first, in queue order. With no finished build or no merge
in the recent history the ETA is unknown (``None``).

A batch with nothing funded cannot start its build before a **build slot** frees
(``build_budget`` slots; every live path holds one, as the planner counts them): the
unfunded batches take the slots in queue order, the ``i``-th at the ``i mod budget``-th
earliest slot release plus ``i div budget`` median builds; a slot held by a pending
path frees after one median build, one held by a build under way when that build is
expected to end — and when it has run longer than every recent build, the ETA of
every batch waiting for that slot is unknown rather than a guess that ignores it.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from app.domain.entities import Batch, PathEntry
from app.domain.states import BatchState, PathStatus
from app.speculation import core
from app.speculation.core import Resolution
from app.speculation.generator import DEFAULT_PROBABILITY, Generator, sanitize

MAX_EXACT = 12  # dependencies enumerated exactly (2**12 combinations)


@dataclass(frozen=True, slots=True)
class Timing:
    """The queue's recent durations (sorted) and their medians (``None``: no sample)."""

    build_ms: int | None
    merge_ms: int | None
    build_samples: int = 0
    merge_samples: int = 0
    builds: tuple[int, ...] = ()
    merges: tuple[int, ...] = ()


def timing(build_durations: Iterable[int], merge_durations: Iterable[int]) -> Timing:
    builds = sorted(d for d in build_durations if d >= 0)
    merges = sorted(d for d in merge_durations if d >= 0)
    return Timing(
        build_ms=round(statistics.median(builds)) if builds else None,
        merge_ms=round(statistics.median(merges)) if merges else None,
        build_samples=len(builds), merge_samples=len(merges),
        builds=tuple(builds), merges=tuple(merges),
    )


def expected_total(samples: Sequence[int], elapsed_ms: int) -> int | None:
    """How long something that has run ``elapsed_ms`` will take in all: the median of
    the samples that lasted at least that long; ``None`` when none did."""
    longer = [d for d in samples if d >= elapsed_ms]
    return round(statistics.median(longer)) if longer else None


@dataclass(frozen=True, slots=True)
class Forecast:
    """``p_land_from``: what ``p_land`` rests on — ``prior`` (the scorer's number for
    the change: nothing built yet), ``builds`` (a finished build of its batch moved it),
    ``state`` (its state decides it: landed, failed, cancelling, merging) or ``health``
    (a dead letter makes it 0)."""

    p_land: float | None
    p_speculation_holds: float | None
    eta_at_ms: int | None
    basis: str
    p_land_from: str = "prior"

    def remaining_ms(self, now_ms: int) -> int | None:
        return None if self.eta_at_ms is None else max(0, self.eta_at_ms - now_ms)


def posterior_good(prior: float, dep_priors: Mapping[str, float],
                   failed_bases: Sequence[frozenset[str]], passed: bool) -> float:
    """``P(head good | evidence)``; ``failed_bases`` are the not-known-good dependencies
    under each failed build (landed ones removed by the caller)."""
    if passed:
        return 1.0
    p = sanitize(prior)
    if not failed_bases:
        return p
    if any(not base for base in failed_bases):
        return 0.0  # a build with only the head's own changes (and landed ones) failed
    q = _all_statements_hold(dep_priors, failed_bases)
    denominator = p * q + (1.0 - p)
    return 0.0 if denominator <= 0 else (p * q) / denominator


def _all_statements_hold(priors: Mapping[str, float], bases: Sequence[frozenset[str]]) -> float:
    """P(for every base, some dependency in it is bad), dependencies independent."""
    deps = sorted(set().union(*bases))
    prob = {d: sanitize(priors.get(d, DEFAULT_PROBABILITY)) for d in deps}
    if len(deps) > MAX_EXACT:
        return math.prod(1.0 - math.prod(prob[d] for d in base) for base in bases)
    total = 0.0
    for goods in itertools.product((True, False), repeat=len(deps)):
        world = dict(zip(deps, goods, strict=True))
        if all(not all(world[d] for d in base) for base in bases):
            total += math.prod(prob[d] if world[d] else 1.0 - prob[d] for d in deps)
    return total


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """What the forecast reads: every active batch and each dependency they name
    (``batches``), path entries per head already folded with their builds, the start
    time of the build behind each live path (by path id), scorer probabilities by batch
    id, and the queue's timing."""

    batches: Mapping[str, Batch]
    entries: Mapping[str, Sequence[PathEntry]]
    build_started_ms: Mapping[str, int]
    probs: Mapping[str, float]
    timing: Timing
    now_ms: int
    build_budget: int = 0  # 0: slots not modelled (a build starts at once)


class _Forecaster:
    def __init__(self, snap: QueueSnapshot) -> None:
        self.snap = snap
        self.res = {bid: core.resolution(b.state) for bid, b in snap.batches.items()}
        self.memo: dict[str, Forecast] = {}
        self._slot_starts: dict[str, int | None] | None = None

    def slot_start(self, batch_id: str) -> tuple[bool, int | None]:
        """(waits for a slot, when its build can start) for a batch with nothing funded."""
        if self._slot_starts is None:
            self._slot_starts = self._plan_slots()
        if batch_id not in self._slot_starts:
            return False, self.snap.now_ms
        return True, self._slot_starts[batch_id]

    def _plan_slots(self) -> dict[str, int | None]:
        snap, t = self.snap, self.snap.timing
        budget, now = snap.build_budget, snap.now_ms
        if budget <= 0 or t.build_ms is None:
            return {}
        releases: list[int | None] = []
        unfunded: list[Batch] = []
        for bid, es in snap.entries.items():
            b = snap.batches.get(bid)
            live = [e for e in es if e.status.live]
            for e in live:
                if e.status is PathStatus.BUILDING and e.id in snap.build_started_ms:
                    start = snap.build_started_ms[e.id]
                    total = expected_total(t.builds, now - start)
                    releases.append(None if total is None else max(now, start + total))
                else:
                    releases.append(now + t.build_ms)
            if (b is not None and b.state is BatchState.SPECULATING and not any(
                    e.status in (PathStatus.PENDING, PathStatus.BUILDING, PathStatus.PASSED)
                    and not core.broken(e.path, self.res) for e in es)):
                unfunded.append(b)
        for bid, b in snap.batches.items():
            if b.state is BatchState.SPECULATING and bid not in snap.entries:
                unfunded.append(b)
        if len(releases) < budget:
            return {}  # a slot is free: a build can start now (the planner funds it)
        known = sorted(r for r in releases if r is not None)
        slots: list[int | None] = [*known, *[None] * (len(releases) - len(known))][:budget]
        unfunded.sort(key=lambda b: (b.created_at_ms, b.id))
        out: dict[str, int | None] = {}
        for i, b in enumerate(unfunded):
            free = slots[i % budget]
            out[b.id] = None if free is None else free + (i // budget) * t.build_ms
        return out

    def of(self, batch_id: str, depth: int = 0) -> Forecast:
        if batch_id in self.memo:
            return self.memo[batch_id]
        batch = self.snap.batches.get(batch_id)
        if batch is None or depth > 200:
            return Forecast(None, None, None, "unknown batch")
        out = self._forecast(batch, depth)
        self.memo[batch_id] = out
        return out

    def _forecast(self, b: Batch, depth: int) -> Forecast:
        if b.state is BatchState.SUCCEEDED:
            return Forecast(1.0, None, None, "landed", "state")
        if b.state in (BatchState.FAILED, BatchState.CANCELLED):
            return Forecast(0.0, None, None, f"batch {b.state.value}", "state")
        if b.state is BatchState.CANCELLING:
            return Forecast(0.0, None, None, "a cancel is under way", "state")
        entries = list(self.snap.entries.get(b.id, ()))
        p_land = self._p_land(b, entries)
        t = self.snap.timing
        now = self.snap.now_ms
        if b.state is BatchState.MERGING:
            basis = "merging: a passed build's assumptions came true"
            total = expected_total(t.merges, now - b.updated_at_ms)
            if total is None:
                return Forecast(p_land, 1.0, None, f"{basis}; ETA unknown: it has taken "
                                "longer than every recent merge", "state")
            return Forecast(p_land, 1.0, max(now, b.updated_at_ms + total), basis, "state")
        return replace(self._live(b, entries, p_land, depth),
                       p_land_from="builds" if any(
                           e.status in (PathStatus.PASSED, PathStatus.FAILED)
                           for e in entries) else "prior")

    def _live(self, b: Batch, entries: Sequence[PathEntry], p_land: float,
              depth: int) -> Forecast:
        t = self.snap.timing
        now = self.snap.now_ms
        p_hold, hold_basis = self._p_hold(b, entries)
        if t.build_ms is None or t.merge_ms is None:
            return Forecast(p_land, p_hold, None,
                            f"{hold_basis}; ETA unknown: no finished build and merge in this "
                            "queue's recent history")
        own = self._own_build_done(b, entries, t)
        if own is None:
            return Forecast(p_land, p_hold, None, f"{hold_basis}; ETA unknown: its build has "
                            "run longer than every recent build")
        waits, slot_at = self.slot_start(b.id)
        if waits:
            if slot_at is None:
                return Forecast(p_land, p_hold, None, f"{hold_basis}; ETA unknown: it waits "
                                "for a build slot held by a build that has run longer than "
                                "every recent build")
            own = max(own, slot_at + t.build_ms)
            hold_basis = f"{hold_basis}; waiting for a build slot"
        deps_done = now
        for dep in b.dependencies:
            if self.res.get(dep, Resolution.UNRESOLVED) is not Resolution.UNRESOLVED:
                continue
            dep_eta = self.of(dep, depth + 1).eta_at_ms
            dep_state = self.snap.batches[dep].state if dep in self.snap.batches else None
            if dep_eta is None and dep_state is not BatchState.CANCELLING:
                return Forecast(p_land, p_hold, None,
                                f"{hold_basis}; ETA unknown: dependency {dep} has none")
            deps_done = max(deps_done, dep_eta or now)
        rebuild = (1.0 - (p_hold or 0.0)) * t.build_ms
        eta = round(max(own, deps_done) + rebuild + t.merge_ms)
        return Forecast(p_land, p_hold, eta, hold_basis)

    def _p_land(self, b: Batch, entries: Sequence[PathEntry]) -> float:
        passed = any(e.status is PathStatus.PASSED for e in entries)
        failed = [
            frozenset(d for d in e.path.base
                      if self.res.get(d, Resolution.UNRESOLVED) is not Resolution.SUCCEEDED)
            for e in entries if e.status is PathStatus.FAILED
        ]
        return posterior_good(self.snap.probs.get(b.id, DEFAULT_PROBABILITY), self.snap.probs,
                              failed, passed)

    def _p_hold(self, b: Batch, entries: Sequence[PathEntry]) -> tuple[float, str]:
        gen = Generator([b], self.res, self.snap.probs)
        funded = [e for e in entries
                  if e.status in (PathStatus.PENDING, PathStatus.BUILDING, PathStatus.PASSED)
                  and not core.broken(e.path, self.res)]
        if funded:
            p = math.fsum(math.exp(gen.score(e.path)) for e in funded)
            n = len(funded)
            return min(1.0, p), f"{n} funded path{'s' if n != 1 else ''}"
        best = next(iter(gen.head_paths(b.id)), None)
        if best is None:
            return 0.0, "no path possible"
        return best.probability, "nothing funded yet; the planner's best path"

    def _own_build_done(self, b: Batch, entries: Sequence[PathEntry],
                        t: Timing) -> int | None:
        now = self.snap.now_ms
        assert t.build_ms is not None
        live = [e for e in entries if not core.broken(e.path, self.res)]
        if any(e.status is PathStatus.PASSED for e in live):
            return now
        starts = [self.snap.build_started_ms[e.id] for e in live
                  if e.status is PathStatus.BUILDING and e.id in self.snap.build_started_ms]
        if not starts:
            return now + t.build_ms
        start = min(starts)
        total = expected_total(t.builds, now - start)
        return None if total is None else max(now, start + total)


def forecast_batches(snap: QueueSnapshot, batch_ids: Iterable[str]) -> dict[str, Forecast]:
    """A forecast for each named batch (dependencies are forecast along the way)."""
    f = _Forecaster(snap)
    return {bid: f.of(bid) for bid in batch_ids}


def forecast_unbatched(prior: float, timing_: Timing, now_ms: int) -> Forecast:
    """A request not in a batch yet: its prior, and at least one build and one merge."""
    p = sanitize(prior)
    if timing_.build_ms is None or timing_.merge_ms is None:
        return Forecast(p, None, None, "not batched yet; ETA unknown: no recent history")
    return Forecast(p, None, now_ms + timing_.build_ms + timing_.merge_ms,
                    "not batched yet: at least one build and one merge")
