"""Coverage funding: the complementary paths a head needs to merge on full coverage (pure).

Best-first funds a head's paths in order of probability, so a head whose unsettled
dependency looks safe rarely gets the path assuming it fails - exactly the path that
coverage needs. When a queue's :class:`CoveragePolicy` asks for ``complements``, the
planner spends a few slots (``complement_slots``) on them first, head by head in queue
order, for heads that:

- have between 1 and ``max_unsettled`` unsettled dependencies, each a head itself
  (``speculating``, so a bypass over it is possible at all);
- already have a foothold: a passed or live, valid, unbroken path;
- can still be covered: no outcome combination's path is stored failed or cancelled.

The paths funded are the combinations not yet passed or live, most likely first.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import Assumption, PathStatus
from app.speculation import core
from app.speculation.core import Resolution
from app.speculation.coverage import CoveragePolicy, combos


def _path(head: Batch, unsettled: Sequence[str], combo: Sequence[Assumption],
          res: Mapping[str, Resolution]) -> SpeculationPath:
    chosen = dict(zip(unsettled, combo, strict=True))
    deps = []
    for d in head.dependencies:
        a = chosen.get(d)
        if a is None:
            a = Assumption.SUCCEEDS if res.get(d) is Resolution.SUCCEEDED else Assumption.FAILS
        deps.append((d, a))
    return SpeculationPath(head=head.id, dependencies=tuple(deps))


def complements(heads: Sequence[Batch], entries: Mapping[str, Sequence[PathEntry]],
                res: Mapping[str, Resolution], merging: Collection[str],
                policy: CoveragePolicy, *, free: int,
                probs: Mapping[str, float] | None = None) -> list[SpeculationPath]:
    """Up to ``min(free, policy.complement_slots)`` complementary paths (see module doc).
    ``heads``: the undecided speculating heads in queue order, with current dependencies."""
    limit = min(free, policy.complement_slots)
    if limit <= 0:
        return []
    head_ids = {h.id for h in heads}
    out: list[SpeculationPath] = []
    for head in heads:
        unsettled = [d for d in head.dependencies
                     if res.get(d, Resolution.UNRESOLVED) is Resolution.UNRESOLVED]
        if not 1 <= len(unsettled) <= policy.max_unsettled or \
                any(d not in head_ids or d in merging for d in unsettled):
            continue
        stored = {e.id: e for e in entries.get(head.id, ())}
        wanted = [_path(head, unsettled, c, res) for c in combos(len(unsettled))]
        statuses = [stored[p.id].status if p.id in stored else None for p in wanted]
        if any(s in (PathStatus.FAILED, PathStatus.CANCELLED, PathStatus.CANCELLING)
               for s in statuses):
            continue  # that combination can never pass: no coverage possible
        if all(s is None for s in statuses):
            continue  # no foothold yet: best-first funds the likely path first
        missing = [p for p, s in zip(wanted, statuses, strict=True)
                   if s is None and not core.broken(p, res)]
        missing.sort(key=lambda p: -_score(p, probs or {}))
        for p in missing:
            out.append(p)
            if len(out) >= limit:
                return out
    return out


def _score(path: SpeculationPath, probs: Mapping[str, float]) -> float:
    return math.fsum(math.log(probs.get(d, 0.95) if a is Assumption.SUCCEEDS
                              else 1.0 - probs.get(d, 0.95)) for d, a in path.dependencies
                     if 0.0 < probs.get(d, 0.95) < 1.0)
