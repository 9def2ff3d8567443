"""Allocators: spend a queue's build budget on the generator's stream (pure).

The budget counts *live* entries (pending, building, cancelling) across every
supplied path set, whatever the head's state. Allocators only propose; the
controller checks and dispatches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from app.domain.entities import PathEntry, SpeculationPath
from app.domain.states import PathStatus
from app.speculation.generator import Candidate, Generator

Action = Literal["build", "cancel"]
AllocatorName = Literal["sticky", "preempting"]


@dataclass(frozen=True, slots=True)
class Proposal:
    action: Action
    path: SpeculationPath


def _index(entries: Mapping[str, Sequence[PathEntry]]) -> dict[str, PathEntry]:
    return {e.id: e for es in entries.values() for e in es}


def _live_count(stored: Mapping[str, PathEntry]) -> int:
    return sum(1 for e in stored.values() if e.status.live)


def sticky(stream: Iterable[Candidate], entries: Mapping[str, Sequence[PathEntry]],
           budget: int) -> list[Proposal]:
    """Fill free slots from the stream, skipping paths already stored (any status) or
    already proposed; never cancels. Pulls only as much of the stream as it needs."""
    stored = _index(entries)
    free = budget - _live_count(stored)
    out: list[Proposal] = []
    if free <= 0:
        return out
    seen: set[str] = set()
    for cand in stream:
        pid = cand.path.id
        if pid in stored or pid in seen:
            continue
        seen.add(pid)
        out.append(Proposal("build", cand.path))
        free -= 1
        if free <= 0:
            break
    return out


def preempting(generator: Generator, entries: Mapping[str, Sequence[PathEntry]],
               budget: int) -> list[Proposal]:
    """Like :func:`sticky`, but also cancels live funded paths that fell below the funded set.

    The funded set is the best ``capacity`` non-terminal paths of the stream, where
    ``capacity`` is the budget minus slots nobody can reclaim now (cancelling paths and
    live paths of heads the generator does not plan). A pending/building path of a
    planned head whose score is strictly below the weakest funded path is cancelled.
    Passed (or any terminal) paths are never cancelled. Cancels free their slot only
    when the build ends, so builds are proposed for currently free slots only: the
    budget is never exceeded, counting cancelling paths.
    """
    stored = _index(entries)
    planned = set(generator.heads())
    movable = [e for e in stored.values()
               if e.status in (PathStatus.PENDING, PathStatus.BUILDING) and e.path.head in planned]
    capacity = budget - (_live_count(stored) - len(movable))
    funded: list[Candidate] = []
    if capacity > 0:
        for cand in generator:
            e = stored.get(cand.path.id)
            if e is not None and e.status.terminal:
                continue  # never rebuilt, so it cannot hold a slot
            funded.append(cand)
            if len(funded) >= capacity:
                break
    # Fewer candidates than slots: everything reachable is funded; only unreachable
    # (malformed or contradicted) live paths fall below the set.
    threshold = funded[-1].score if len(funded) >= max(capacity, 1) else -math.inf
    funded_ids = {c.path.id for c in funded}
    out: list[Proposal] = []
    scored = sorted((generator.score(e.path), e.id, e) for e in movable if e.id not in funded_ids)
    for s, _, e in scored:  # worst first
        if s < threshold or s == -math.inf:
            out.append(Proposal("cancel", e.path))
    free = budget - _live_count(stored)
    for cand in funded:
        if free <= 0:
            break
        if cand.path.id in stored:
            continue
        out.append(Proposal("build", cand.path))
        free -= 1
    return out


def allocate(kind: AllocatorName, generator: Generator,
             entries: Mapping[str, Sequence[PathEntry]], budget: int) -> list[Proposal]:
    """Run the named allocator (a queue's configuration picks one)."""
    if kind == "sticky":
        return sticky(generator, entries, budget)
    if kind == "preempting":
        return preempting(generator, entries, budget)
    raise ValueError(f"unknown allocator {kind!r}")
