"""Invariants every plan must keep, checked by ``plan()`` itself (pure).

They are re-derived from the input and the output alone, so they also serve the tests
as an independent oracle:

1. only heads (``speculating`` and not decided in this plan) get builds, and every new
   path matches its head's (possibly grown) dependency list and is not contradicted;
2. a path stored live or with a verdict (passed/failed) is never built again; a path
   stored ``cancelled`` may be, as its next attempt (see :mod:`app.speculation.allocator`);
3. a passed path is never cancelled or changed; no terminal entry changes; a cancel
   moves a live entry to ``cancelling``/``cancelled``;
4. the plan never adds live paths beyond the budget: when it funds anything, the live
   entries (pending, building, cancelling) of all batches after it, counted entry by
   entry as the allocators count them, fit in ``budget``. A snapshot may already hold
   more (cancelling builds keep their slot until they end, the queue's budget was
   lowered, a lost build's retry keeps its path's slot): that is no violation, such a
   plan funds nothing, and by 2 and 3 nothing else turns live, so the count cannot
   grow (the controller checks ``live_after <= max(budget, live_before)``);
5. ``sticky`` keeps every funded slot: a live path that is still valid and not
   contradicted, of a head still speculating, keeps its status (``preempting`` may
   cancel such paths, and only pending or building ones).

A violation raises :class:`PlanInvariantError`, a
:class:`~app.domain.errors.PlanError` naming the head(s) it is about; it is not
retryable (the same snapshot plans the same way), and the controller adds the queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NoReturn

from app.domain.entities import PathEntry, SpeculationPath
from app.domain.errors import PlanError
from app.domain.states import BatchState, PathStatus
from app.speculation import core, doom
from app.speculation.core import Resolution
from app.speculation.plans import Plan, PlanInput


class PlanInvariantError(PlanError, AssertionError):
    """The planner produced a plan that breaks one of its invariants (a bug)."""

    code = "plan_invariant"
    summary = "speculation plan breaks an invariant"


def _fail(msg: str, *heads: str) -> NoReturn:
    raise PlanInvariantError(f"{PlanInvariantError.summary}: {msg}",
                             problems=dict.fromkeys(heads, (msg,)))


def check(inp: PlanInput, out: Plan, *, preempted: set[str]) -> None:
    decided = {d.head for d in out.decisions}
    res = {bid: core.resolution(b.state) for bid, b in inp.batches.items()}
    res.update({d.head: Resolution.FAILED for d in out.decisions if d.kind == "fail"})
    deps = {bid: out.dependencies.get(bid, b.dependencies) for bid, b in inp.batches.items()}
    before = {e.id: e for es in inp.entries.values() for e in es}
    after: dict[str, Sequence[PathEntry]] = {**inp.entries, **out.entries}
    _check_builds(inp, out, decided, res, deps, before)
    _check_entries(out, before, after)
    _check_budget(inp, out, after)
    if inp.allocator == "sticky" and preempted:
        owners = [h for h, es in inp.entries.items() for e in es if e.id in preempted]
        _fail("the sticky allocator preempted a funded path", *owners)
    failed = {} if inp.vindication_depth > 0 else doom.failed_paths(inp.entries)
    deps_before = {bid: b.dependencies for bid, b in inp.batches.items()}
    for head, es in inp.entries.items():
        b = inp.batches.get(head)
        if b is None or b.state is not BatchState.SPECULATING or head in decided:
            continue
        now = {e.id: e for e in after[head]}
        for e in es:
            keeps = e.status.live and not core.broken(e.path, res) and \
                e.path.names == deps[head] and not _doomed(e.path, failed, res, deps, deps_before)
            if keeps and now[e.id].status is not e.status and e.id not in preempted:
                _fail(f"funded path {e.id[:12]} of {head} lost its slot without a reason",
                      head)


def _doomed(path: SpeculationPath, failed: doom.Failed, res: Mapping[str, Resolution],
            deps: Mapping[str, tuple[str, ...]], before: Mapping[str, tuple[str, ...]],
            ) -> bool:
    """A doomed path may lose its slot (the planner judged it under the dependency lists
    of the moment: the input's, ``before``, or the plan's grown ones, ``deps``)."""
    return doom.doomed(path, failed, res, deps) or doom.doomed(path, failed, res, before)


def _check_budget(inp: PlanInput, out: Plan, after: Mapping[str, Sequence[PathEntry]]) -> None:
    live_before = sum(1 for es in inp.entries.values() for e in es if e.status.live)
    live_after = sum(1 for es in after.values() for e in es if e.status.live)
    if out.builds and live_after > inp.budget:
        _fail(f"budget exceeded: {live_after} live paths after funding "
              f"{len(out.builds)}, {live_before} before, budget {inp.budget}",
              *(p.head for p in out.builds))


def _check_builds(inp: PlanInput, out: Plan, decided: set[str], res: Mapping[str, Resolution],
                  deps: Mapping[str, tuple[str, ...]], before: Mapping[str, PathEntry]) -> None:
    seen: set[str] = set()
    for p in out.builds:
        b = inp.batches.get(p.head)
        if b is None or b.state is not BatchState.SPECULATING or p.head in decided:
            _fail(f"build for {p.head}, which is not a speculating head", p.head)
        if p.names != deps[p.head] or core.broken(p, res):
            _fail(f"build of a malformed or contradicted path of {p.head}", p.head)
        old = before.get(p.id)
        if (old is not None and old.status is not PathStatus.CANCELLED) or p.id in seen:
            _fail(f"path {p.id[:12]} of {p.head} is stored {old.status if old else 'twice'}"
                  " and is built again", p.head)
        seen.add(p.id)


def _check_entries(out: Plan, before: Mapping[str, PathEntry],
                   after: Mapping[str, Sequence[PathEntry]]) -> None:
    built = {p.id for p in out.builds}
    for head, es in after.items():
        for e in es:
            old = before.get(e.id)
            if old is None:
                if e.id not in built or e.status is not PathStatus.PENDING:
                    _fail(f"entry {e.id[:12]} of {head} appeared without being funded", head)
                continue
            if old.status is PathStatus.CANCELLED and e.id in built:
                if e.status is not PathStatus.PENDING or e.attempt != old.attempt + 1:
                    _fail(f"cancelled path {e.id[:12]} of {head} funded again, but not as "
                          "its next attempt", head)
            elif old.status.terminal and e != old:
                _fail(f"terminal entry {e.id[:12]} of {head} changed ({old.status} -> "
                      f"{e.status})", head)
            if old.status.live and e.status is not old.status and e.id not in out.cancels:
                _fail(f"entry {e.id[:12]} of {head} changed status without a cancel", head)
    for pid in out.cancels:
        old = before.get(pid)
        if old is None or not old.status.live:
            owners = [h for h, es in after.items() for e in es if e.id == pid]
            _fail(f"cancel of {pid[:12]}, which was not a live stored path", *owners)
