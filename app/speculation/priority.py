"""Priority: where a new batch goes among the conflicting batches in flight (pure).

Without priorities a new batch depends on every conflicting batch in flight (they are
all ahead of it, in arrival order). With them, a batch of a higher priority
(``Priority.rank``: ``hotfix`` > ``high`` > ``normal``) goes *ahead* of each conflicting
batch of a lower priority that is not yet ``merging``:

- :func:`place` (dependency analysis, for the new batch ``N``): ``N`` depends on the
  conflicting batches that are ``merging`` or of at least its priority, and *overtakes*
  the others (lower priority, not merging) - unless ``N`` already reaches one of them
  through the batches it depends on (a chain ``N -> M -> L``), which then stays ahead:
  an overtaken batch gains ``N`` as a dependency, and that edge must never close a cycle.
- :func:`overtaking` (the planner, every speculate run, before anything is decided):
  turns each recorded overtake into a dependency edge. For ``N`` overtaking ``L``:
  ``L`` still ``created``/``speculating`` -> ``L`` gains ``N`` (its paths, none of which
  contains ``N``, no longer match its dependency list: they are cancelled and rebuilt on
  top of ``N``); ``L`` ``merging`` or ``succeeded`` meanwhile (a run decided it before the
  overtake was applied) -> ``N`` gains ``L`` instead (``N``'s paths without ``L`` are
  rebuilt); ``L`` failed, cancelled or cancelling -> nothing (it will not land). An edge
  that would close a cycle is never added (the other direction is tried; a pair already
  on a cycle is left alone). Applied exactly when neither names the other yet, so a
  replayed run (the same snapshot) applies the same edges and a later run none.

Independent batches (no conflict) are never touched: only the analyzer's conflicts are
reordered. With every batch ``normal`` both functions change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from app.domain.entities import Batch
from app.domain.states import BatchState


def reaches(start: Iterable[str], target: str, deps: Mapping[str, Sequence[str]]) -> bool:
    """Whether ``target`` is ``start`` or reachable from it along dependency lists
    (batches missing from ``deps`` have none)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        b = todo.pop()
        if b == target:
            return True
        if b in seen:
            continue
        seen.add(b)
        todo.extend(deps.get(b, ()))
    return False


def place(new: Batch, conflicting: Sequence[Batch],
          graph: Mapping[str, Sequence[str]] | None = None,
          ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(dependencies, overtakes)`` of the new batch among the ``conflicting`` batches in
    flight (``created``/``speculating``/``merging``, in queue order); ``graph``: the
    dependency list of every batch in flight (default: the conflicting ones'). Both keep
    that order; together they are exactly the conflicting batches."""
    rank = new.priority.rank
    ahead = [b for b in conflicting
             if b.state is BatchState.MERGING or b.priority.rank >= rank]
    behind = [b for b in conflicting if b not in ahead]
    if not behind:
        return tuple(b.id for b in conflicting), ()
    if graph is None:
        graph = {b.id: b.dependencies for b in conflicting}
    # a lower batch the ahead ones reach (N -> M -> L) must stay ahead of N too
    kept = {b.id for b in behind if reaches((a.id for a in ahead), b.id, graph)}
    deps = tuple(b.id for b in conflicting if b in ahead or b.id in kept)
    return deps, tuple(b.id for b in behind if b.id not in kept)


OVERTAKEN = (BatchState.CREATED, BatchState.SPECULATING)  # may still gain a dependency
LANDING = (BatchState.MERGING, BatchState.SUCCEEDED)  # too late to overtake


def overtaking(batches: Mapping[str, Batch],
               deps: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The dependency lists the recorded overtakes grow (batch id -> its new list, only
    those that change), from ``deps`` (every known batch's current list). A batch that
    overtakes must itself still be ``created``/``speculating``: once it is decided it
    went ahead (or ended) and its edges were applied by an earlier run."""
    if not any(b.overtakes for b in batches.values()):
        return {}
    grown = {bid: tuple(ds) for bid, ds in deps.items()}
    changed: set[str] = set()
    for n in sorted(batches.values(), key=lambda b: (b.created_at_ms, b.id)):
        if not n.overtakes or n.state not in OVERTAKEN:
            continue
        for lid in n.overtakes:
            low = batches.get(lid)
            if low is None or n.id in grown.get(lid, ()) or lid in grown.get(n.id, ()):
                continue
            if low.state in OVERTAKEN and not reaches((n.id,), lid, grown):
                grown[lid] = (*grown.get(lid, ()), n.id)
                changed.add(lid)
            elif low.state in (*OVERTAKEN, *LANDING) and not reaches((lid,), n.id, grown):
                grown[n.id] = (*grown.get(n.id, ()), lid)
                changed.add(n.id)
    return {bid: grown[bid] for bid in sorted(changed)}
