"""The speculate controller's check of a plan before anything is written.

The planner checks its own invariants; this is the controller's independent guard
against what the snapshot says (stored path sets, batch states), so a planner bug
can never rebuild a path that has a verdict (passed or failed), cancel a passed one
behind its head's back, fund a head that is not speculating, or overspend the
budget. A *cancelled* path gave no verdict: the planner may fund it again, as its
next attempt (else a head whose only settled path was preempted could never end). A rejected plan
raises :class:`PlanRejected` (retryable: a fresh snapshot may plan differently;
if it keeps failing the message is dead-lettered and the queue's reconciler acts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.domain.entities import Batch, PathEntry, PathSet
from app.domain.errors import SubmitQueueError
from app.domain.states import BatchState, PathStatus
from app.speculation.planner import Plan


class PlanRejected(SubmitQueueError):
    code = "plan_rejected"


def check_plan(batches: Mapping[str, Batch], stored: Mapping[str, PathSet],
               current: Mapping[str, Sequence[PathEntry]], plan: Plan, *, budget: int) -> None:
    merged = {d.head for d in plan.decisions if d.kind == "merge"}
    funded = {p.id for p in plan.builds}
    problems: list[str] = []
    for d in plan.decisions:
        b = batches.get(d.head)
        if b is None or b.state is not BatchState.SPECULATING:
            problems.append(f"decision on {d.head}, which is not speculating")
    for bid in plan.dependencies:
        b = batches.get(bid)
        if b is None or b.state is not BatchState.SPECULATING:
            problems.append(f"dependencies of {bid} changed, but it is not speculating")
    for head, entries in plan.entries.items():
        b = batches.get(head)
        before = {e.id: e for e in current.get(head, ())}
        verdicts = {e.id for e in stored.get(head, PathSet(queue="", head=head)).entries
                    if e.status in (PathStatus.PASSED, PathStatus.FAILED)}
        for e in entries:
            old = before.get(e.id)
            if old is None or (old.status.terminal and e.status.live):
                if b is None or b.state is not BatchState.SPECULATING:
                    problems.append(f"new build for {head}, which is not speculating")
                if e.id in verdicts or (old is not None and old.status in (
                        PathStatus.PASSED, PathStatus.FAILED)):
                    problems.append(f"path {e.id[:12]} of {head} has a verdict and would be "
                                    "rebuilt")
                elif old is not None and (e.attempt != old.attempt + 1
                                          or e.id not in funded):
                    problems.append(f"cancelled path {e.id[:12]} of {head} comes back "
                                    "without a new attempt")
            elif old.status is PathStatus.PASSED and e.status is not PathStatus.PASSED \
                    and head not in merged and head not in plan.dependencies:
                problems.append(f"passed path {e.id[:12]} of {head} would be cancelled")
    live_before = sum(1 for es in current.values() for e in es if e.status.live)
    after = {**{h: tuple(es) for h, es in current.items()}, **plan.entries}
    live_after = sum(1 for es in after.values() for e in es if e.status.live)
    if live_after > max(budget, live_before):
        problems.append(f"{live_after} live paths would exceed the build budget {budget}")
    if problems:
        raise PlanRejected("speculation plan rejected: " + "; ".join(problems))
