"""The speculation planner: one pure, deterministic step over a snapshot of a merge queue.

``plan(PlanInput) -> Plan`` is everything a speculate run decides; the controller only
loads the snapshot, persists the plan and dispatches it, and ``bench/simulate.py``
drives the very same function with a simulated clock and simulated CI.

**Heads** are the batches in state ``speculating``, in queue order ``(created_at_ms,
id)``. ``merging``, ``cancelling`` and ``created`` batches are not heads, but their live
path entries hold build slots. A dependency resolves through :func:`core.resolution`
(``merging`` is unresolved). A path entry is *valid* for its head while its dependency
names equal the head's current dependency list (a bypass appends to that list, which
invalidates every older path of the overtaken batch).

0. **Overtakes**: a batch of a higher priority that went ahead of conflicting lower
   ones (``Batch.overtakes``) becomes their dependency (or, if one is already merging,
   depends on it) before anything is decided (:func:`app.speculation.priority.overtaking`);
   the overtaken batches' paths no longer match their dependency lists and are rebuilt.
1. **Finalize** (facts), repeated until a pass decides nothing, heads in queue order:
   cancel live paths that are invalid, broken (a settled dependency contradicts them)
   or doomed (they rely on a dependency's path that already failed; see
   :mod:`app.speculation.doom`: such a build can never land anything);
   **merge** when a valid passed path is settled (:func:`core.decide`), cancelling the
   head's live siblings; **fail** when every dependency is settled and every valid,
   unbroken path failed (at least one), unless a dependent's build that contains a
   failed path still runs (``vindication_depth``, :mod:`app.speculation.vindication`) -
   the head then counts as failed for its dependents in the next pass; else, with a
   :class:`CoveragePolicy`, **merge on full coverage** when it pays (see
   :mod:`app.speculation.coverage`): the decision lands the head on today's trunk (the
   covering path where every unsettled dependency fails), each overtaken batch gets
   the head appended to its dependencies and its paths invalidated.
   A merge resolves nothing (``merging`` is unresolved).
2. **Fund**: probabilities are the scorer's, refined by build evidence
   (:mod:`app.speculation.evidence`; with ``hedge_by_time`` a dependency's less likely
   outcome is also discounted by how soon its own build reports), with every ``merging``
   batch at ``merging_probability``. The best-first :class:`Generator` enumerates the
   remaining heads' paths (with their new dependency lists); every path but a head's
   most likely one is weighted by the head's own P(good) (``weigh_alternatives``), and
   paths below ``min_probability`` are not funded, except each head's most likely one.
   The named allocator spends the budget (``sticky`` never cancels a funded path;
   ``preempting`` may), funding the most likely path of every ``high``/``hotfix`` head
   first (highest priority first; :func:`app.speculation.allocator.prioritized`). A path
   with a verdict is never built again, nor is a doomed one; a cancelled one may be, as
   its next attempt
   (:mod:`app.speculation.allocator` says why). With
   ``coverage.complements``, up to ``complement_slots`` of the slots still free after
   that go to the complementary paths of heads that could then merge on coverage
   (:mod:`app.speculation.complements`).
3. **Check** the invariants (:func:`app.speculation.invariants.check`); a violation is a
   planner bug and raises :class:`PlanInvariantError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.speculation import core, doom, vindication
from app.speculation.allocator import Proposal, allocate, live_slots
from app.speculation.complements import complements
from app.speculation.core import Resolution
from app.speculation.coverage import CoveragePolicy, Progress, combos, cover, remaining_ms
from app.speculation.evidence import EvidencePolicy, hedge_weights, refine
from app.speculation.generator import DEFAULT_PROBABILITY, Generator, log_probability
from app.speculation.invariants import PlanInvariantError, check
from app.speculation.plans import Decision, Plan, PlanInput
from app.speculation.priority import overtaking

__all__ = ["CoveragePolicy", "Decision", "EvidencePolicy", "Plan", "PlanInput",
           "PlanInvariantError", "plan"]

Linked = Callable[[PathEntry], bool]


def _pending_linked(e: PathEntry) -> bool:
    return e.status is not PathStatus.PENDING


def plan(inp: PlanInput, *, linked: Linked = _pending_linked) -> Plan:
    """One planning step (see the module doc). Pure and deterministic."""
    run = _Run(inp, linked)
    run.finalize()
    run.fund()
    out = run.result()
    check(inp, out, preempted=run.preempted)
    return out


class _Run:
    def __init__(self, inp: PlanInput, linked: Linked) -> None:
        self.inp = inp
        self.linked = linked
        self.deps: dict[str, tuple[str, ...]] = {
            bid: b.dependencies for bid, b in inp.batches.items()}
        self.res: dict[str, Resolution] = core.Facts({
            bid: core.resolution(b.state) for bid, b in inp.batches.items()})
        self.merging = {bid for bid, b in inp.batches.items() if b.state is BatchState.MERGING}
        self.entries: dict[str, list[PathEntry]] = {h: list(es) for h, es in inp.entries.items()}
        self.heads = sorted((b for b in inp.batches.values()
                             if b.state is BatchState.SPECULATING),
                            key=lambda b: (b.created_at_ms, b.id))
        self.decided: set[str] = set()
        self.decisions: list[Decision] = []
        self.cancels: dict[str, None] = {}
        self.preempted: set[str] = set()
        # a higher priority batch's overtakes become dependency edges first
        self.grown: dict[str, tuple[str, ...]] = overtaking(inp.batches, self.deps)
        self.deps.update(self.grown)
        self.builds: list[SpeculationPath] = []
        self.rebuilds = 0
        # failed paths make the paths that rely on them doomed (app.speculation.doom),
        # unless vindication may reopen them
        self.failed: doom.Failed = {} if inp.vindication_depth > 0 else \
            doom.failed_paths(self.entries)

    # -- helpers ---------------------------------------------------------------
    def valid(self, head: str, e: PathEntry) -> bool:
        return e.path.head == head and \
            e.path.names == self.deps.get(head, ())

    def usable(self, head: str, e: PathEntry) -> bool:
        return self.valid(head, e) and not core.broken(e.path, self.res)

    def doomed(self, path: SpeculationPath) -> bool:
        return doom.doomed(path, self.failed, self.res, self.deps)

    def _cancel(self, head: str, doomed: Callable[[PathEntry], bool]) -> None:
        es = self.entries.get(head, [])
        for i, e in enumerate(es):
            if e.status in (PathStatus.PENDING, PathStatus.BUILDING) and doomed(e):
                es[i] = core.cancel(e, linked=self.linked(e), now=self.inp.now_ms)
                self.cancels[e.id] = None

    def batch(self, head: str) -> Batch:
        b = self.inp.batches[head]
        deps = self.deps[head]
        return b if deps == b.dependencies else replace(b, dependencies=deps)

    # -- 1. finalize -----------------------------------------------------------
    def finalize(self) -> None:
        progress = True
        while progress:
            progress = False
            for head in self.heads:
                if head.id not in self.decided:
                    progress = self._finalize(head.id) or progress

    def _finalize(self, head: str) -> bool:
        if not self.entries.get(head):
            return False  # no path: nothing to cancel, merge on, fail or cover with
        self._cancel(head, lambda e: not self.usable(head, e) or self.doomed(e.path))
        valid = [e for e in self.entries.get(head, []) if self.valid(head, e)]
        verdict = core.decide(self.batch(head), valid, self.res)
        if verdict.kind == "merge":
            assert verdict.path_id is not None
            self._merge(Decision(head, "merge", path_id=verdict.path_id))
            return True
        if verdict.kind == "fail":
            if self._suspect(head):
                return False
            self.decided.add(head)
            self.res[head] = Resolution.FAILED
            self.decisions.append(Decision(head, "fail", reason=verdict.reason))
            return True
        return self.inp.coverage is not None and self._bypass(head, self.inp.coverage)

    def _suspect(self, head: str) -> bool:
        """A failure a dependent's running build may still clear waits for it."""
        depth = self.inp.vindication_depth
        return depth > 0 and vindication.pending(
            head, [h.id for h in self.heads if h.id not in self.decided], self.deps,
            self.entries, self.res, depth)

    def _merge(self, decision: Decision) -> None:
        self._cancel(decision.head, lambda e: e.id != decision.path_id)
        self.decided.add(decision.head)
        self.merging.add(decision.head)
        self.decisions.append(decision)

    def _bypass(self, head: str, policy: CoveragePolicy) -> bool:
        unsettled = [d for d in self.deps[head]
                     if self.res.get(d, Resolution.UNRESOLVED) is Resolution.UNRESOLVED]
        if not unsettled or len(unsettled) > policy.max_unsettled:
            return False
        for d in unsettled:
            b = self.inp.batches.get(d)
            if b is None or b.state is not BatchState.SPECULATING or d in self.decided \
                    or head in self.deps[d]:
                return False
        found = cover([e for e in self.entries.get(head, []) if self.valid(head, e)],
                      unsettled, self.res)
        if found is None or not self._pays(unsettled, policy):
            return False
        for d in unsettled:
            self.rebuilds += sum(1 for e in self.entries.get(d, []) if self.usable(d, e)
                                 and (e.status.live or e.status is PathStatus.PASSED))
            self.deps[d] = (*self.deps[d], head)
            self.grown[d] = self.deps[d]
            self._cancel(d, lambda e: True)
        all_fail = tuple(Assumption.FAILS for _ in unsettled)
        self._merge(Decision(head, "merge", path_id=found[all_fail], bypass=True,
                             overtaken=tuple(unsettled),
                             covering=tuple(found[c] for c in combos(len(unsettled)))))
        return True

    def _pays(self, unsettled: Sequence[str], policy: CoveragePolicy) -> bool:
        if policy.min_remaining <= 0:
            return True
        progress = Progress(res=self.res, merging=frozenset(self.merging), deps=self.deps,
                            entries=self.entries, valid=self.valid, now_ms=self.inp.now_ms,
                            mean_build_ms=self.inp.mean_build_ms)
        memo: dict[str, float] = {}
        bar = policy.min_remaining * self.inp.mean_build_ms
        return all(remaining_ms(d, progress, memo) >= bar for d in unsettled)

    # -- 2. fund ---------------------------------------------------------------
    def probabilities(self) -> dict[str, float]:
        probs = dict(self.inp.probs)
        if self.inp.evidence is not None:
            probs = refine(probs, self.entries, self.res, self.inp.evidence)
            if self.inp.hedge_by_time:
                probs = hedge_weights(probs, self._known_in(), self.inp.evidence)
        for m in self.merging:
            probs[m] = self.inp.merging_probability
        return probs

    def _known_in(self) -> dict[str, float]:
        """Per unresolved batch with a live build of its own: when the soonest ends, in
        units of the mean build time."""
        out: dict[str, float] = {}
        mean = max(self.inp.mean_build_ms, 1.0)
        for h in self.heads:
            es = self.entries.get(h.id)
            if not es:
                continue
            ends = [e.updated_at_ms + mean - self.inp.now_ms for e in es
                    if e.status in (PathStatus.PENDING, PathStatus.BUILDING)
                    and self.usable(h.id, e)]
            if ends:
                out[h.id] = min(ends) / mean
        return out

    def fund(self) -> None:
        heads = [self.batch(h.id) for h in self.heads if h.id not in self.decided]
        if not heads or self.inp.budget <= 0:
            return
        inp = self.inp
        probs = self.probabilities()
        weights = {h.id: log_probability(probs.get(h.id, DEFAULT_PROBABILITY))
                   for h in heads} if inp.weigh_alternatives else None
        gen = Generator(heads, self.res, probs, weights)
        floor = math.log(inp.min_probability) if inp.min_probability > 0 else -math.inf
        ranks = {h.id: h.priority.rank for h in heads if h.priority.rank}
        self._apply(allocate(inp.allocator, gen, self.entries, inp.budget, floor=floor,
                             ranks=ranks, skip=self.doomed if self.failed else None))
        policy = inp.coverage
        if policy is not None and policy.complements:
            extra = complements(heads, self.entries, self.res, self.merging, policy,
                                free=inp.budget - live_slots(self.entries), probs=probs)
            self._apply([Proposal("build", p) for p in extra])

    def _apply(self, proposals: Sequence[Proposal]) -> None:
        now = self.inp.now_ms
        for p in proposals:
            head = p.path.head
            if p.action == "cancel":
                pid = p.path.id
                self.preempted.add(pid)
                self._cancel(head, lambda e: e.id == pid)  # noqa: B023 - used at once
            else:
                es = self.entries.setdefault(head, [])
                old = next((i for i, e in enumerate(es) if e.id == p.path.id), None)
                if old is None:
                    es.append(PathEntry(path=p.path, status=PathStatus.PENDING, attempt=1,
                                        created_at_ms=now, updated_at_ms=now))
                else:  # a cancelled path funded again: its next attempt
                    es[old] = replace(es[old], status=PathStatus.PENDING,
                                      attempt=es[old].attempt + 1, updated_at_ms=now)
                self.builds.append(p.path)

    # -- result ----------------------------------------------------------------
    def result(self) -> Plan:
        changed = {h: tuple(es) for h, es in self.entries.items()
                   if tuple(es) != tuple(self.inp.entries.get(h, ()))}
        return Plan(decisions=tuple(self.decisions), entries=changed,
                    dependencies=dict(self.grown), builds=tuple(self.builds),
                    cancels=tuple(self.cancels), rebuilds=self.rebuilds)
