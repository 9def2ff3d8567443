"""Allocators: spend a queue's build budget on the generator's stream (pure).

The budget counts *live* entries (pending, building, cancelling) across every
supplied path set, whatever the head's state, entry by entry (:func:`live_slots`),
exactly as the planner's invariant and the controller's check count them. Allocators
only propose; the controller checks and dispatches.

A stored path with a verdict (``passed``/``failed``) is never proposed again, nor is a
live one. A ``cancelled`` path that the generator still yields (its head is planned,
its assumptions are not contradicted and match the head's dependencies) may be
proposed again: it was stopped for a reason that no longer holds (preempted, or its
build was cancelled outside SubmitQueue), and it may be the very path that must land;
refusing it could leave the head waiting forever. The planner records it as a new
attempt of the same path.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from app.domain.entities import PathEntry, SpeculationPath
from app.domain.states import PathStatus
from app.speculation.generator import Candidate, Generator, Key

Action = Literal["build", "cancel"]
AllocatorName = Literal["sticky", "preempting"]


@dataclass(frozen=True, slots=True)
class Proposal:
    action: Action
    path: SpeculationPath


def _index(entries: Mapping[str, Sequence[PathEntry]]) -> dict[str, PathEntry]:
    return {e.id: e for es in entries.values() for e in es}


def _keyed(generator: Generator, entries: Mapping[str, Sequence[PathEntry]]
           ) -> dict[Key, PathEntry]:
    """The stored entries that are current paths of planned heads, by candidate key: a
    candidate is looked up without building its path (any other stored path has an id
    no candidate can have)."""
    out: dict[Key, PathEntry] = {}
    for es in entries.values():
        for e in es:
            key = generator.key_of(e.path)
            if key is not None:
                out[key] = e
    return out


def live_slots(entries: Mapping[str, Sequence[PathEntry]]) -> int:
    """Build slots held: every live entry of every path set. Counted entry by entry,
    never per distinct path id, so it is the very number the invariant checks."""
    return sum(1 for es in entries.values() for e in es if e.status.live)


def fundable(e: PathEntry | None) -> bool:
    """Not stored, or stored ``cancelled`` (a new attempt; see the module doc)."""
    return e is None or e.status is PathStatus.CANCELLED


def sticky(generator: Generator, entries: Mapping[str, Sequence[PathEntry]], budget: int,
           *, stream: Iterable[Candidate] | None = None,
           skip: Callable[[SpeculationPath], bool] | None = None) -> list[Proposal]:
    """Fill free slots from ``stream`` (the generator's, by default), skipping paths stored live or
    with a verdict, and paths already proposed; never cancels. Pulls only as much of the
    stream as it needs, and builds only the paths it proposes."""
    free = budget - live_slots(entries)
    out: list[Proposal] = []
    if free <= 0:
        return out
    stored = _keyed(generator, entries)
    seen: set[Key] = set()
    for cand in generator if stream is None else stream:
        key = cand.key
        if not fundable(stored.get(key)) or key in seen:
            continue
        seen.add(key)
        if skip is not None and skip(cand.path):  # built only when it may be funded
            continue
        out.append(Proposal("build", cand.path))
        free -= 1
        if free <= 0:
            break
    return out


def bounded(generator: Generator, floor: float) -> Iterator[Candidate]:
    """The generator's stream without the paths scoring below ``floor``, except each head's
    most likely path, which always stays in (after every path above the floor): it has
    to be built either way, to land the head or to reject it."""
    if floor == -math.inf:
        yield from generator
        return
    yield from itertools.takewhile(lambda c: c.score >= floor, generator)
    below = [c for c in generator.firsts() if c.score < floor]
    yield from sorted(below, key=lambda c: (-c.score, c.head_index))


def prioritized(generator: Generator, stream: Iterable[Candidate],
                ranks: Mapping[str, int] | None) -> Iterator[Candidate]:
    """``stream`` with the most likely path of every head of a higher priority (``ranks``:
    head id -> ``Priority.rank``, missing = 0) first, highest rank first, then head
    order; each such path is not yielded again. With no head above rank 0 it is
    ``stream`` itself, unchanged."""
    if not ranks or not any(ranks.get(h, 0) > 0 for h in generator.heads()):
        yield from stream
        return
    firsts = sorted(((-ranks.get(h, 0), i, c) for i, (h, c) in
                     enumerate(zip(generator.heads(), generator.firsts(), strict=True))
                     if ranks.get(h, 0) > 0), key=lambda x: (x[0], x[1]))
    keys = {c.key for *_, c in firsts}
    for *_, c in firsts:
        yield c
    for c in stream:
        if c.key not in keys:
            yield c


def preempting(generator: Generator, entries: Mapping[str, Sequence[PathEntry]],
               budget: int, *, floor: float = -math.inf,
               stream: Iterable[Candidate] | None = None,
               skip: Callable[[SpeculationPath], bool] | None = None) -> list[Proposal]:
    """Like :func:`sticky`, but also cancels live funded paths that fell below the funded set.

    The funded set is the best ``capacity`` non-terminal paths of the stream, where
    ``capacity`` is the budget minus slots nobody can reclaim now (cancelling paths and
    live paths of heads the generator does not plan). A pending/building path of a
    planned head whose score is strictly below the weakest funded path is cancelled; so is
    one that no longer belongs to the stream at all (score ``-inf``) or, unless it is its
    head's most likely path, scores below ``floor`` (see :func:`bounded`). Passed (or any
    terminal) paths are never cancelled. Cancels free their slot only
    when the build ends, so builds are proposed for currently free slots only: the
    budget is never exceeded, counting cancelling paths.
    """
    stored = _index(entries)
    keyed = _keyed(generator, entries)
    planned = set(generator.heads())
    movable = [e for e in stored.values()
               if e.status in (PathStatus.PENDING, PathStatus.BUILDING) and e.path.head in planned]
    capacity = budget - (live_slots(entries) - len(movable))
    funded: list[Candidate] = []
    if capacity > 0:
        for cand in bounded(generator, floor) if stream is None else stream:
            e = keyed.get(cand.key)
            if e is not None and e.status.terminal and not fundable(e):
                continue  # never rebuilt, so it cannot hold a slot
            if skip is not None and skip(cand.path):
                continue  # never funded: it cannot hold a slot either
            funded.append(cand)
            if len(funded) >= capacity:
                break
    # Fewer candidates than slots: everything reachable is funded; only unreachable
    # (malformed or contradicted) live paths fall below the set.
    threshold = funded[-1].score if len(funded) >= max(capacity, 1) else -math.inf
    funded_ids = {c.path.id for c in funded}
    out: list[Proposal] = []
    firsts = {e.id for e in movable if floor > -math.inf and _first(generator, e)}
    scored = sorted((generator.score(e.path), e.id, e) for e in movable if e.id not in funded_ids)
    for s, _, e in scored:  # worst first
        if s < threshold or (s < floor and e.id not in firsts) or s == -math.inf:
            out.append(Proposal("cancel", e.path))
    free = budget - live_slots(entries)
    for cand in funded:
        if free <= 0:
            break
        if not fundable(keyed.get(cand.key)):
            continue
        out.append(Proposal("build", cand.path))
        free -= 1
    return out


def _first(generator: Generator, e: PathEntry) -> bool:
    """``e`` is its head's most likely path."""
    first = generator.first(e.path.head)
    return first is not None and generator.key_of(e.path) == first.key


def allocate(kind: AllocatorName, generator: Generator,
             entries: Mapping[str, Sequence[PathEntry]], budget: int, *,
             floor: float = -math.inf, ranks: Mapping[str, int] | None = None,
             skip: Callable[[SpeculationPath], bool] | None = None,
             ) -> list[Proposal]:
    """Run the named allocator (a queue's configuration picks one). Paths scoring below
    ``floor`` (a log-probability) are not funded, but for each head's most likely one.
    ``ranks`` (head id -> ``Priority.rank``): the most likely path of each head of a
    higher priority is funded before anything else (:func:`prioritized`). ``skip``:
    paths never funded (the planner's doomed ones, :mod:`app.speculation.doom`), tested
    only for candidates that could be funded; the preempting allocator does not count
    them in its funded set either."""
    stream = prioritized(generator, bounded(generator, floor), ranks)
    if kind == "sticky":
        return sticky(generator, entries, budget, stream=stream, skip=skip)
    if kind == "preempting":
        return preempting(generator, entries, budget, floor=floor, stream=stream, skip=skip)
    raise ValueError(f"unknown allocator {kind!r}")
