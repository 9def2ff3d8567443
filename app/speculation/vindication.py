"""Vindication: a failed build stays suspect while a build of a bigger tree may clear it.

A batch ``H`` has a path ``e`` whose build failed. A *dependent* of ``H`` is a batch
behind it in queue order whose dependency list names ``H``. A dependent's path ``f``
*contains* ``e`` when ``f`` assumes ``H`` lands and contradicts none of ``e``'s
assumptions on the batches both name: ``f``'s tree holds ``H``'s change on the same
outcomes of what they share (a batch ``f`` does not conflict with is not in its tree,
whatever ``e`` assumed of it). A passed ``f`` is evidence that ``e``'s failure was a
flake (Trunk's "pending failure depth" and GitHub's HEADGREEN, on the speculation
tree). Only the first ``depth`` dependents count (``speculation.vindication_depth``; 0
turns this off).

| ``e`` (failed, valid, not contradicted) | a containing path of the first ``depth`` dependents | what happens |
|---|---|---|
| never vindicated | one passed | :func:`vindicate`: ``e`` is built again (``pending``, attempt + 1, ``vindicated`` + 1) |
| never vindicated | none passed, one ``pending`` or ``building`` | :func:`pending`: the planner does not fail ``H`` yet |
| never vindicated | none passed or live | nothing: the failure counts as before |
| vindicated once | any | nothing: the failure counts (one vindication per path) |

It never lands anything by itself: ``H`` lands only on a passed build of exactly its
path, so a vindicated path lands only if its own rebuild passes. A truly bad change
usually breaks its dependents' containing builds too, so it is not rebuilt; it may wait
for them (at most ``depth`` of them) before it is removed. Pure; no I/O.
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

from app.domain.entities import PathEntry, SpeculationPath
from app.domain.states import PathStatus
from app.speculation import core
from app.speculation.core import Resolution

__all__ = ["contains", "dependents", "pending", "vindicate"]

MAX_VINDICATIONS = 1  # per path
_EVIDENCE = (PathStatus.PASSED, PathStatus.PENDING, PathStatus.BUILDING)


def dependents(head: str, order: Sequence[str], deps: Mapping[str, Sequence[str]],
               depth: int) -> list[str]:
    """The first ``depth`` batches after ``head`` in ``order`` whose dependencies name it."""
    out: list[str] = []
    if depth <= 0:
        return out
    behind = False
    for b in order:
        if b == head:
            behind = True
        elif behind and head in deps.get(b, ()):
            out.append(b)
            if len(out) >= depth:
                break
    return out


def contains(outer: SpeculationPath, inner: SpeculationPath) -> bool:
    """``outer``'s tree holds ``inner``'s head, and the two agree on every batch both
    name."""
    succeeds, fails = outer.sides
    inner_succeeds, inner_fails = inner.sides
    return inner.head in succeeds and inner_succeeds.isdisjoint(fails) and \
        inner_fails.isdisjoint(succeeds)


def _suspects(head: str, entries: Sequence[PathEntry], names: Sequence[str],
              res: Mapping[str, Resolution]) -> Iterator[tuple[int, PathEntry]]:
    """``head``'s failed paths that a dependent's build may still clear."""
    for i, e in enumerate(entries):
        if e.status is PathStatus.FAILED and e.vindicated < MAX_VINDICATIONS and \
                e.path.head == head and e.path.names == tuple(names) and \
                not core.broken(e.path, res):
            yield i, e


def _evidence(e: PathEntry, behind: Sequence[str],
              entries: Mapping[str, Sequence[PathEntry]]) -> PathStatus | None:
    """``passed`` if a containing path of ``behind`` passed, else ``pending`` if one is
    live (pending or building), else None."""
    live = False
    for d in behind:
        for f in entries.get(d, ()):
            if f.status not in _EVIDENCE or not contains(f.path, e.path):
                continue
            if f.status is PathStatus.PASSED:
                return PathStatus.PASSED
            live = True
    return PathStatus.PENDING if live else None


def vindicate(order: Sequence[str], deps: Mapping[str, Sequence[str]],
              entries: Mapping[str, Sequence[PathEntry]], res: Mapping[str, Resolution],
              depth: int, now: int) -> dict[str, list[PathEntry]]:
    """The path sets (of the heads in ``order``, the speculating batches in queue order)
    with each failed path a dependent's passed build cleared opened again for one more
    attempt; only the sets that changed."""
    out: dict[str, list[PathEntry]] = {}
    if depth <= 0:
        return out
    for head in order:
        es = entries.get(head, ())
        behind: list[str] | None = None
        for i, e in _suspects(head, es, deps.get(head, ()), res):
            if behind is None:
                behind = dependents(head, order, deps, depth)
            if _evidence(e, behind, entries) is PathStatus.PASSED:
                new = out.setdefault(head, list(es))
                new[i] = replace(e, status=PathStatus.PENDING, attempt=e.attempt + 1,
                                 vindicated=e.vindicated + 1, updated_at_ms=now)
    return out


def pending(head: str, order: Sequence[str], deps: Mapping[str, Sequence[str]],
            entries: Mapping[str, Sequence[PathEntry]], res: Mapping[str, Resolution],
            depth: int) -> bool:
    """A failed path of ``head`` may still be cleared: a containing path of one of its
    first ``depth`` dependents is pending or building (and none passed yet)."""
    if depth <= 0:
        return False
    behind: list[str] | None = None
    for _, e in _suspects(head, entries.get(head, ()), deps.get(head, ()), res):
        if behind is None:
            behind = dependents(head, order, deps, depth)
        if _evidence(e, behind, entries) is not None:
            return True
    return False
