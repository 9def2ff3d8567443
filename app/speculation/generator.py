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

Nothing is worked out before it is needed: a head's second path needs only its cheapest
flip (no sort), and a candidate's path - as long as the queue is deep - is built only
when asked for; allocators skip stored paths by the candidate's :data:`Key`. A plan of a
deep queue thus builds the paths it funds, plus one pass over each head's dependencies.

Order: non-increasing score; ties broken by fewer flips, then head order (input
order), then the flip indexes (positions in the head's cheapest-first flip order).
Every path is yielded exactly once.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from app.domain.entities import Batch, SpeculationPath
from app.domain.states import Assumption
from app.speculation.core import Resolution

DEFAULT_PROBABILITY = 0.95
_NONE: frozenset[str] = frozenset()


def sanitize(p: object) -> float:
    """A usable success probability: a real number strictly inside (0, 1), else 0.95."""
    if type(p) is float:  # the common case, first (NaN fails the comparison too)
        return p if 0.0 < p < 1.0 else DEFAULT_PROBABILITY
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


@functools.lru_cache(maxsize=4096)
def _log_kept(p: object) -> float:
    return math.log(sanitize(p))


def log_probability(p: object) -> float:
    """``ln(sanitize(p))``, kept per value (a deep queue's heads share a few)."""
    try:
        return _log_kept(p)
    except TypeError:  # unhashable: not kept
        return math.log(sanitize(p))


Key = tuple[str, frozenset[str]]
"""A path of a planned head, told apart without building it: the head and the
dependencies it assumes to fail. Two paths of one head with the head's current
dependency list are the same path exactly when their keys are equal."""


class Candidate:
    """One path of a head and its score. The path itself (a deep queue's is as long as
    the queue) is built only when it is asked for: an allocator skips most candidates by
    their :attr:`key` alone."""

    __slots__ = ("_path", "_plan", "flips", "head_index", "score")

    def __init__(self, plan: _HeadPlan, score: float, flips: tuple[int, ...],
                 head_index: int) -> None:
        self._plan = plan
        self._path: SpeculationPath | None = None
        self.score = score  # log-probability that every assumption holds (<= 0)
        self.flips = flips  # positions in the head's cheapest-first flip order
        self.head_index = head_index

    @property
    def path(self) -> SpeculationPath:
        if self._path is None:
            self._path = self._plan.path(self.flips)
        return self._path

    @property
    def key(self) -> Key:
        return self._plan.key(self.flips)

    @property
    def probability(self) -> float:
        return math.exp(self.score)

    def __repr__(self) -> str:
        return f"Candidate({self._plan.head.id!r}, score={self.score!r}, flips={self.flips!r})"


@dataclass(frozen=True, slots=True)
class _Dep:
    """What a dependency contributes to any head's paths (the same for every head that
    names it, so it is worked out once per generator)."""

    preferred: Assumption
    fixed: bool  # settled: its assumption is a fact, not a choice
    p: float = 0.0  # P(succeeds), when unresolved
    log_pref: float = 0.0  # ln P(preferred side), when unresolved
    cost: float = math.inf  # ln P(preferred) - ln P(other side), when unresolved


def _dep(r: Resolution, prob: object) -> _Dep:
    if r is Resolution.SUCCEEDED:
        return _Dep(Assumption.SUCCEEDS, True)
    if r is Resolution.FAILED:
        return _Dep(Assumption.FAILS, True)
    p = sanitize(prob)
    pref, opp = (p, 1.0 - p) if p >= 0.5 else (1.0 - p, p)
    return _Dep(Assumption.SUCCEEDS if p >= 0.5 else Assumption.FAILS, False, p,
                math.log(pref), math.log(pref) - math.log(opp))


@functools.lru_cache(maxsize=4096)
def _dep_kept(r: Resolution, prob: object) -> _Dep:
    return _dep(r, prob)


def _dep_for(r: Resolution, prob: object) -> _Dep:
    """``_dep``, kept per (resolution, probability): a deep queue's dependencies share
    a few probabilities, and every plan would otherwise work each one out again."""
    try:
        return _dep_kept(r, prob)
    except TypeError:  # an unhashable probability (the scorer's mistake): not kept
        return _dep(r, prob)


class _Table:
    """The per-dependency facts of one generator, and the same as flat lookups (C-level
    ``map`` over a head's dependency list is what keeps a deep queue's plan cheap).

    It starts with every batch the resolutions or probabilities know (far fewer than a
    deep queue's dependency edges, which a union over every head's list would walk); a
    head naming a batch neither knows adds it (:meth:`cover`)."""

    def __init__(self, res: Mapping[str, Resolution], probs: Mapping[str, float]) -> None:
        self._res = res
        self._probs = probs
        self.deps: dict[str, _Dep] = {}
        self.log_pref: dict[str, float] = {}
        self.cost: dict[str, float] = {}
        self.fails: set[str] = set()
        self._add(res.keys() | probs.keys())

    def _add(self, ids: Iterable[str]) -> None:
        res, probs = self._res, self._probs
        for d in ids:
            x = _dep_for(res.get(d, Resolution.UNRESOLVED), probs.get(d, DEFAULT_PROBABILITY))
            self.deps[d] = x
            self.log_pref[d] = 0.0 if x.fixed else x.log_pref
            self.cost[d] = x.cost
            if x.preferred is Assumption.FAILS:
                self.fails.add(d)

    def cover(self, names: Sequence[str]) -> None:
        """Add the batches of ``names`` not in the table yet."""
        self._add([d for d in names if d not in self.deps])


class _HeadPlan:
    """Everything needed to enumerate one head's paths, worked out as far as it is asked
    for: the most likely path's score in one pass over the head's dependencies (each
    looked up in the generator's per-dependency table); the cheapest flip (a second
    path's score) in another; the whole cheapest-first flip order only once that second
    path was taken; the path's assumptions only when a path is built or keyed."""

    def __init__(self, head: Batch, table: _Table, weight: float = 0.0) -> None:
        self.head = head
        self.weight = weight
        self._table = table
        # fsum is exactly rounded: the fixed dependencies' zeros change nothing
        try:
            self.base = math.fsum(map(table.log_pref.__getitem__, head.dependencies))
        except KeyError:  # it names a batch the table did not know
            table.cover(head.dependencies)
            self.base = math.fsum(map(table.log_pref.__getitem__, head.dependencies))
        self._first: tuple[float, int] | None = None  # (cost, dependency index)
        self._order: tuple[tuple[float, int], ...] | None = None
        self._dep_list: list[_Dep] | None = None
        self._fails: frozenset[str] | None = None
        self._is_unique: bool | None = None

    @property
    def _deps(self) -> list[_Dep]:
        if self._dep_list is None:
            self._dep_list = list(map(self._table.deps.__getitem__, self.head.dependencies))
        return self._dep_list

    @property
    def _pref_fails(self) -> frozenset[str]:
        """The dependencies whose preferred side is to fail."""
        if self._fails is None:
            fails = self._table.fails
            self._fails = frozenset(fails.intersection(self.head.dependencies)) \
                if fails else _NONE
        return self._fails

    @property
    def _unique(self) -> bool:
        if self._is_unique is None:
            deps = self.head.dependencies
            self._is_unique = len(set(deps)) == len(deps)
        return self._is_unique

    def _flip(self, pos: int) -> tuple[float, int]:
        """The ``pos``-th cheapest flip: (cost, dependency index); ties by index. The
        cheapest is found without sorting; cost ``inf``: nothing is unresolved."""
        if pos == 0 and self._order is None:
            if self._first is None:
                costs = list(map(self._table.cost.__getitem__, self.head.dependencies))
                cheapest = min(costs, default=math.inf)
                self._first = (cheapest, costs.index(cheapest) if costs else -1)
            return self._first
        return self._sorted()[pos]

    def _sorted(self) -> tuple[tuple[float, int], ...]:
        if self._order is None:
            self._order = tuple(sorted((d.cost, i) for i, d in enumerate(self._deps)
                                       if not d.fixed))
        return self._order

    def path(self, flip_positions: tuple[int, ...]) -> SpeculationPath:
        assumptions = [d.preferred for d in self._deps]
        for pos in flip_positions:
            i = self._flip(pos)[1]
            a = assumptions[i]
            assumptions[i] = Assumption.FAILS if a is Assumption.SUCCEEDS else Assumption.SUCCEEDS
        return SpeculationPath(head=self.head.id,
                               dependencies=tuple(zip(self.head.dependencies, assumptions,
                                                      strict=True)))

    def key(self, flip_positions: tuple[int, ...]) -> Key:
        if not self._unique:  # a dependency named twice: only the whole path tells
            return (self.path(flip_positions).id, frozenset())
        if not flip_positions:
            return (self.head.id, self._pref_fails)
        deps = self.head.dependencies
        flipped = frozenset(deps[self._flip(pos)[1]] for pos in flip_positions)
        return (self.head.id, self._pref_fails ^ flipped)

    def key_of(self, path: SpeculationPath) -> Key | None:
        """A stored path's key, if it is one of this head's current paths."""
        if path.head != self.head.id or path.names != self.head.dependencies:
            return None
        return (path.id, frozenset()) if not self._unique else (self.head.id, path.sides[1])

    def score_of(self, flip_positions: tuple[int, ...]) -> float:
        if not flip_positions:
            return self.base
        return self.base - math.fsum(self._flip(pos)[0] for pos in flip_positions) + \
            self.weight

    def enumerate(self, head_index: int) -> Iterator[Candidate]:
        """Flip subsets by (-score, size, positions); each child's key exceeds its parent's."""
        yield Candidate(self, self.base, (), head_index)
        if self._flip(0)[0] == math.inf:
            return
        heap: list[tuple[float, int, tuple[int, ...]]] = [(-self.score_of((0,)), 1, (0,))]
        while heap:
            neg, size, subset = heapq.heappop(heap)
            yield Candidate(self, -neg, subset, head_index)
            last = subset[-1]
            if last + 1 < len(self._sorted()):
                extended = (*subset, last + 1)
                heapq.heappush(heap, (-self.score_of(extended), size + 1, extended))
                swapped = (*subset[:-1], last + 1)
                heapq.heappush(heap, (-self.score_of(swapped), size, swapped))

    def score_path(self, path: SpeculationPath) -> float:
        """Score of any path of this head; ``-inf`` if malformed or contradicted."""
        if path.head != self.head.id or path.names != self.head.dependencies:
            return -math.inf
        logs: list[float] = []
        flipped = False
        for d, (_, a) in zip(self._deps, path.dependencies, strict=True):
            flipped = flipped or a is not d.preferred
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
        table = _Table(res, probs)
        self._plans = [_HeadPlan(h, table, weights.get(h.id, 0.0)) for h in heads]
        self._index = {p.head.id: i for i, p in reversed(list(enumerate(self._plans)))}

    def __iter__(self) -> Iterator[Candidate]:
        # Every head's most likely path enters the heap as a bare entry (one heapify, no
        # stream per head); a head's stream is started only once that path was taken.
        # A head has one entry in the heap at a time, so entries never tie past the
        # head index and the order is the module doc's.
        heap: list[tuple[float, int, int, tuple[int, ...], Candidate | None]] = [
            (-plan.base, 0, i, (), None) for i, plan in enumerate(self._plans)]
        heapq.heapify(heap)
        streams: dict[int, Iterator[Candidate]] = {}
        while heap:
            neg, _, i, _, cand = heapq.heappop(heap)
            if cand is None:
                cand = Candidate(self._plans[i], -neg, (), i)
                stream = streams[i] = self._plans[i].enumerate(i)
                next(stream)  # its first is the path just taken
            yield cand
            self._push(heap, streams[i])

    @staticmethod
    def _push(heap: list[tuple[float, int, int, tuple[int, ...], Candidate | None]],
              stream: Iterator[Candidate]) -> None:
        cand = next(stream, None)
        if cand is not None:
            heapq.heappush(heap, (-cand.score, len(cand.flips), cand.head_index, cand.flips,
                                  cand))

    def head_paths(self, head_id: str) -> Iterator[Candidate]:
        """One head's paths best-first (its ``head_index`` is its input position)."""
        i = self._index.get(head_id)
        return iter(()) if i is None else self._plans[i].enumerate(i)

    def first(self, head_id: str) -> Candidate | None:
        """A head's most likely path (its path built only if asked for)."""
        i = self._index.get(head_id)
        return None if i is None else Candidate(self._plans[i], self._plans[i].base, (), i)

    def firsts(self) -> list[Candidate]:
        """Each head's most likely path, in head order."""
        return [Candidate(p, p.base, (), i) for i, p in enumerate(self._plans)]

    def key_of(self, path: SpeculationPath) -> Key | None:
        """The key of a stored path that is one of a planned head's current paths (the
        key its candidate has); ``None`` for any other path."""
        i = self._index.get(path.head)
        return None if i is None else self._plans[i].key_of(path)

    def heads(self) -> tuple[str, ...]:
        return tuple(p.head.id for p in self._plans)

    def score(self, path: SpeculationPath) -> float:
        """Log-probability of a path under this snapshot; ``-inf`` when the path does not
        belong to a known head, does not match its dependencies, or is contradicted."""
        i = self._index.get(path.head)
        return -math.inf if i is None else self._plans[i].score_path(path)
