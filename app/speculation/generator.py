"""Best-first generator of speculation paths (pure, lazy, deterministic).

For every speculating head, each dependency gets an assumption. Settled
dependencies are fixed (succeeded -> ``succeeds``, failed/cancelled -> ``fails``);
each unresolved dependency has a success probability ``p`` (from the queue's
scorer; invalid values become :data:`DEFAULT_PROBABILITY`). A path's *score* is
the log-probability that all its assumptions hold: ``sum(ln P(assumption))``.

Per head, the *preferred* side of a dependency is its more likely outcome (tie ->
succeeds); assuming the other side is a *flip* costing ``ln(pref) - ln(opp) >= 0``.
Flips are sorted cheapest-first (ties by dependency order) and flip subsets are
enumerated best-first with a heap and the classic extend/swap successors, so the
first k paths of a head with n unresolved dependencies cost O(n log n + k log k),
never 2^n. Heads are merged with a second heap holding one candidate per head.

Order: non-increasing score; ties broken by fewer flips, then head order (input
order), then the flip indexes (positions in the head's cheapest-first flip order).
Every path is yielded exactly once.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from app.domain.entities import Batch, SpeculationPath
from app.domain.states import Assumption
from app.speculation.core import Resolution

DEFAULT_PROBABILITY = 0.95


def sanitize(p: object) -> float:
    """A usable success probability: a real number strictly inside (0, 1), else 0.95."""
    if isinstance(p, bool) or not isinstance(p, int | float):
        return DEFAULT_PROBABILITY
    value = float(p)
    if math.isnan(value) or not 0.0 < value < 1.0:
        return DEFAULT_PROBABILITY
    return value


def probabilities(deps: Iterable[str], score: Callable[[str], float]) -> dict[str, float]:
    """Score each unique dependency once; an error or invalid value gives 0.95."""
    out: dict[str, float] = {}
    for dep in deps:
        if dep in out:
            continue
        try:
            out[dep] = sanitize(score(dep))
        except Exception:
            out[dep] = DEFAULT_PROBABILITY
    return out


@dataclass(frozen=True, slots=True)
class Candidate:
    path: SpeculationPath
    score: float  # log-probability that every assumption holds (<= 0)
    flips: tuple[int, ...]  # positions in the head's cheapest-first flip order
    head_index: int

    @property
    def probability(self) -> float:
        return math.exp(self.score)


@dataclass(frozen=True, slots=True)
class _Flip:
    dep_index: int  # position in the head's dependency list
    cost: float


@dataclass(frozen=True, slots=True)
class _Dep:
    """What a dependency contributes to any head's paths (the same for every head that
    names it, so it is worked out once per generator)."""

    preferred: Assumption
    fixed: bool  # settled: its assumption is a fact, not a choice
    p: float = 0.0  # P(succeeds), when unresolved
    log_pref: float = 0.0  # ln P(preferred side), when unresolved
    cost: float = 0.0  # ln P(preferred) - ln P(other side), when unresolved


def _dep(r: Resolution, prob: object) -> _Dep:
    if r is Resolution.SUCCEEDED:
        return _Dep(Assumption.SUCCEEDS, True)
    if r is Resolution.FAILED:
        return _Dep(Assumption.FAILS, True)
    p = sanitize(prob)
    pref, opp = (p, 1.0 - p) if p >= 0.5 else (1.0 - p, p)
    return _Dep(Assumption.SUCCEEDS if p >= 0.5 else Assumption.FAILS, False, p,
                math.log(pref), math.log(pref) - math.log(opp))


class _HeadPlan:
    """Everything needed to enumerate one head's paths. Built in one pass over the
    head's dependencies (each looked up in the generator's per-dependency table); the
    flip order, needed only once a head's second path is asked for, is sorted then."""

    def __init__(self, head: Batch, deps: Sequence[_Dep], weight: float = 0.0) -> None:
        self.head = head
        self.weight = weight
        self._deps = deps
        self.preferred = tuple(d.preferred for d in deps)
        self.base = math.fsum([d.log_pref for d in deps if not d.fixed])
        self._flips: tuple[_Flip, ...] | None = None

    @property
    def flips(self) -> tuple[_Flip, ...]:
        if self._flips is None:
            flips = [_Flip(i, d.cost) for i, d in enumerate(self._deps) if not d.fixed]
            self._flips = tuple(sorted(flips, key=lambda f: (f.cost, f.dep_index)))
        return self._flips

    def path(self, flip_positions: tuple[int, ...]) -> SpeculationPath:
        assumptions = list(self.preferred)
        for pos in flip_positions:
            i = self.flips[pos].dep_index
            a = assumptions[i]
            assumptions[i] = Assumption.FAILS if a is Assumption.SUCCEEDS else Assumption.SUCCEEDS
        return SpeculationPath(head=self.head.id,
                               dependencies=tuple(zip(self.head.dependencies, assumptions,
                                                      strict=True)))

    def score_of(self, flip_positions: tuple[int, ...]) -> float:
        if not flip_positions:
            return self.base
        return self.base - math.fsum(self.flips[pos].cost for pos in flip_positions) + \
            self.weight

    def enumerate(self, head_index: int) -> Iterator[Candidate]:
        """Flip subsets by (-score, size, positions); each child's key exceeds its parent's."""
        n = len(self.flips)
        yield Candidate(self.path(()), self.score_of(()), (), head_index)
        if n == 0:
            return
        heap: list[tuple[float, int, tuple[int, ...]]] = [(-self.score_of((0,)), 1, (0,))]
        while heap:
            neg, size, subset = heapq.heappop(heap)
            yield Candidate(self.path(subset), -neg, subset, head_index)
            last = subset[-1]
            if last + 1 < n:
                extended = (*subset, last + 1)
                heapq.heappush(heap, (-self.score_of(extended), size + 1, extended))
                swapped = (*subset[:-1], last + 1)
                heapq.heappush(heap, (-self.score_of(swapped), size, swapped))

    def score_path(self, path: SpeculationPath) -> float:
        """Score of any path of this head; ``-inf`` if malformed or contradicted."""
        if path.head != self.head.id or tuple(d for d, _ in path.dependencies) != \
                self.head.dependencies:
            return -math.inf
        logs: list[float] = []
        flipped = False
        for i, (_, a) in enumerate(path.dependencies):
            flipped = flipped or a is not self.preferred[i]
            d = self._deps[i]
            if d.fixed:
                if d.preferred is not a:
                    return -math.inf
                continue
            logs.append(math.log(d.p if a is Assumption.SUCCEEDS else 1.0 - d.p))
        return math.fsum(logs) + (self.weight if flipped else 0.0)


class Generator:
    """Lazily yields candidate paths of all ``heads`` best-first (see module doc).

    ``heads``: speculating batches in queue order; ``res``: resolution of every
    dependency (missing = unresolved); ``probs``: success probability per unresolved
    dependency (missing or invalid = 0.95). Iterating twice gives the same sequence.

    ``alternative_weights`` (optional, per head, ``<= 0``): a log-weight added to the
    score of every path of that head except its most likely one. The planner passes
    ``ln P(head is good)``: the most likely path must be built either way (to land the
    head or to reject it), the alternatives only pay off if the head can land.
    """

    def __init__(self, heads: Sequence[Batch], res: Mapping[str, Resolution],
                 probs: Mapping[str, float],
                 alternative_weights: Mapping[str, float] | None = None) -> None:
        weights = alternative_weights or {}
        if any(w > 0 or math.isnan(w) for w in weights.values()):
            raise ValueError("alternative weights are log-probabilities: <= 0")
        named = {d for h in heads for d in h.dependencies}
        table = {d: _dep(res.get(d, Resolution.UNRESOLVED), probs.get(d, DEFAULT_PROBABILITY))
                 for d in named}
        self._plans = [_HeadPlan(h, list(map(table.__getitem__, h.dependencies)),
                                 weights.get(h.id, 0.0)) for h in heads]
        self._by_head = {p.head.id: p for p in self._plans}

    def __iter__(self) -> Iterator[Candidate]:
        streams = [plan.enumerate(i) for i, plan in enumerate(self._plans)]
        heap: list[tuple[float, int, int, tuple[int, ...], Candidate]] = []
        for stream in streams:
            self._push(heap, stream)
        while heap:
            *_, cand = heapq.heappop(heap)
            yield cand
            self._push(heap, streams[cand.head_index])

    @staticmethod
    def _push(heap: list[tuple[float, int, int, tuple[int, ...], Candidate]],
              stream: Iterator[Candidate]) -> None:
        cand = next(stream, None)
        if cand is not None:
            heapq.heappush(heap, (-cand.score, len(cand.flips), cand.head_index, cand.flips,
                                  cand))

    def head_paths(self, head_id: str) -> Iterator[Candidate]:
        """One head's paths best-first (its ``head_index`` is its input position)."""
        for i, plan in enumerate(self._plans):
            if plan.head.id == head_id:
                return plan.enumerate(i)
        return iter(())

    def heads(self) -> tuple[str, ...]:
        return tuple(p.head.id for p in self._plans)

    def score(self, path: SpeculationPath) -> float:
        """Log-probability of a path under this snapshot; ``-inf`` when the path does not
        belong to a known head, does not match its dependencies, or is contradicted."""
        plan = self._by_head.get(path.head)
        return -math.inf if plan is None else plan.score_path(path)
