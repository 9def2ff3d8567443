"""Doomed paths: a path that cannot land because a build it relies on already failed (pure).

A path of head ``h`` that assumes dependency ``d`` succeeds relies on ``d`` landing.
``d`` lands only through a passed path of its own whose assumptions all came true. If
``d``'s path ``F`` (valid: named after ``d``'s current dependencies) *failed*, and
every assumption ``F`` makes about ``d``'s dependencies is either already a fact or
made the same way by ``h``'s path, then in every future where ``h``'s path comes true
``F`` is ``d``'s one settled path, and it failed: ``d`` is rejected and ``h``'s path is
broken. Its build, running or not, can never land anything; it only holds a slot.

This follows from the planner's own rules, not from any assumption about builds (a
superset of a failing tree need not fail): a path with a verdict is never built again,
so ``F`` stays failed. Two things reopen a failed path and switch the rule off:
``vindication_depth`` (a dependent's passed build may clear ``F``: those builds are
the evidence, so they must run) and a change of ``d``'s dependency list (``F`` is then
no longer valid for ``d``). ``speculation.retries`` does not: a path being retried is
not ``failed`` until its last retry fails.

In a queue where every change conflicts this is what frees the budget after a failure:
without it the builds behind a failed change, which all contain it, keep their slots
until the change is rejected at the front of the queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.domain.entities import PathEntry, SpeculationPath
from app.domain.states import PathStatus
from app.speculation.core import Resolution

Failed = Mapping[str, Sequence[SpeculationPath]]


def failed_paths(entries: Mapping[str, Sequence[PathEntry]]) -> dict[str, list[SpeculationPath]]:
    """Per batch, the paths of its own that failed (read once per plan: a plan never
    gives a path a verdict)."""
    out: dict[str, list[SpeculationPath]] = {}
    for head, es in entries.items():
        for e in es:
            if e.status is PathStatus.FAILED and e.path.head == head:
                out.setdefault(head, []).append(e.path)
    return out


def doomed(path: SpeculationPath, failed: Failed, res: Mapping[str, Resolution],
           deps: Mapping[str, tuple[str, ...]]) -> bool:
    """``path`` assumes an unresolved dependency succeeds whose failed path, valid for
    that dependency's current list (``deps``), it agrees with on every assumption that
    is not already a fact (see the module doc)."""
    if not failed:
        return False
    succeeds, fails = path.sides
    small, big = (failed.keys(), succeeds) if len(failed) < len(succeeds) \
        else (succeeds, failed.keys())
    for d in small:
        if d not in big or res.get(d, Resolution.UNRESOLVED) is not Resolution.UNRESOLVED:
            continue
        for f in failed[d]:
            if f.names != deps.get(d):
                continue
            f_succeeds, f_fails = f.sides
            if all(x in succeeds or res.get(x) is Resolution.SUCCEEDED for x in f_succeeds) \
                    and all(x in fails or res.get(x) is Resolution.FAILED for x in f_fails):
                return True
    return False
