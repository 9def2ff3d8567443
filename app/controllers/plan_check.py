"""The speculate controller's check of a plan before anything is written.

The planner checks its own invariants; this is the controller's independent guard
against what the snapshot says (stored path sets, batch states), so a planner bug
can never rebuild a path that has a verdict (passed or failed), cancel a passed one
behind its head's back, fund a head that is not speculating, or overspend the
budget. A *cancelled* path gave no verdict: the planner may fund it again, as its
next attempt (else a head whose only settled path was preempted could never end).

A rejected plan raises :class:`PlanRejected`, a :class:`~app.domain.errors.PlanError`:
**not retryable**, by decision. The planner is a pure function of the snapshot, so
another attempt on the same facts gets the same plan, and blind retries would only
delay the dead letter. Each problem names the batch it is about (a budget overrun:
every head whose live paths grew), and the error carries them with the queue; the
``speculate`` DLQ reconciler fails exactly those batches, never the one the message
happened to name, and wakes the queue so the rest of it re-plans.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from app.domain.entities import Batch, PathEntry, PathSet
from app.domain.errors import PlanRejected as PlanRejected  # re-exported
from app.domain.states import BatchState, PathStatus
from app.speculation.planner import Plan


def check_plan(batches: Mapping[str, Batch], stored: Mapping[str, PathSet],
               current: Mapping[str, Sequence[PathEntry]], plan: Plan, *, budget: int,
               queue: str = "") -> None:
    merged = {d.head for d in plan.decisions if d.kind == "merge"}
    funded = {p.id for p in plan.builds}
    problems: dict[str, list[str]] = defaultdict(list)

    def speculating(bid: str) -> bool:
        b = batches.get(bid)
        return b is not None and b.state is BatchState.SPECULATING

    for d in plan.decisions:
        if not speculating(d.head):
            problems[d.head].append(f"decision on {d.head}, which is not speculating")
    for bid in plan.dependencies:
        if not speculating(bid):
            problems[bid].append(f"dependencies of {bid} changed, but it is not speculating")
    for head, entries in plan.entries.items():
        before = {e.id: e for e in current.get(head, ())}
        verdicts = {e.id for e in stored.get(head, PathSet(queue="", head=head)).entries
                    if e.status in (PathStatus.PASSED, PathStatus.FAILED)}
        for e in entries:
            old = before.get(e.id)
            if old is None or (old.status.terminal and e.status.live):
                if not speculating(head):
                    problems[head].append(f"new build for {head}, which is not speculating")
                if e.id in verdicts or (old is not None and old.status in (
                        PathStatus.PASSED, PathStatus.FAILED)):
                    problems[head].append(f"path {e.id[:12]} of {head} has a verdict and "
                                          "would be rebuilt")
                elif old is not None and (e.attempt != old.attempt + 1
                                          or e.id not in funded):
                    problems[head].append(f"cancelled path {e.id[:12]} of {head} comes back "
                                          "without a new attempt")
            elif old.status is PathStatus.PASSED and e.status is not PathStatus.PASSED \
                    and head not in merged and head not in plan.dependencies:
                problems[head].append(f"passed path {e.id[:12]} of {head} would be cancelled")
    _check_budget(current, plan, budget, problems)
    if problems:
        text = "; ".join(p for ps in problems.values() for p in ps)
        raise PlanRejected(f"{PlanRejected.summary}: {text}", queue=queue,
                           problems=problems)


def _check_budget(current: Mapping[str, Sequence[PathEntry]], plan: Plan, budget: int,
                  problems: dict[str, list[str]]) -> None:
    """More live paths than ``max(budget, live before)``: the heads whose live count grew
    are the ones the overrun is about."""
    def live(es: Sequence[PathEntry]) -> int:
        return sum(1 for e in es if e.status.live)

    before = {h: live(es) for h, es in current.items()}
    after = {**before, **{h: live(es) for h, es in plan.entries.items()}}
    live_before, live_after = sum(before.values()), sum(after.values())
    if live_after <= max(budget, live_before):
        return
    grown = {h: n - before.get(h, 0) for h, n in after.items() if n > before.get(h, 0)}
    for head, n in grown.items():
        problems[head].append(f"{live_after} live paths would exceed the build budget "
                              f"{budget} ({head} gains {n})")
