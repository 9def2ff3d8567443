"""Speculating strategies, all driven by the real planner (``app.speculation.planner.plan``).

The simulated CI starts a funded path's build at once (``pending`` -> ``building``), a
cancel stops its build at once (the slot is free for the next plan), and a merge lands
at once (``merging`` lasts no simulated time). After every event (arrivals and build
ends at one instant) the driver plans again until a plan decides and cancels nothing.

Funding:
- ``planner``: the planner's own funding (best-first generator + allocator);
- ``likely``: the planner finalizes with a zero budget, then each head in queue order
  gets its one likely path (every unsettled dependency assumed to land) while slots are
  free, rebuilt when a failure breaks it - the optimistic, Zuul-style queue;
- ``all``: the planner finalizes, then heads in queue order get *every* path of theirs
  (all outcome combinations) while slots are free - speculate-all.

Batching (``batching``: the queue's ``batching: {max_size: <the point's batch>,
max_wait_ms, adaptive}``, ``app/domain/batching.py``): arrivals join the forming batch
until it holds the size limit or ``batch_wait`` has passed since its first; a batch
conflicts with the batches in flight any of its changes conflicts with; a failed batch
of several is split ``max(2, budget // 2)`` ways into new batches at the back of the
queue, as ``conclude`` does, and a failed batch of one rejects its change.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, replace
from typing import Literal

from app.controllers.speculate import DEFAULT_MEAN_BUILD_MS, DURATION_WEIGHT
from app.domain import batching as batch_rules
from app.domain import second_chance
from app.domain.entities import Batch, PathEntry, SpeculationPath
from app.domain.states import BatchState, PathStatus
from app.speculation import core, doom, vindication
from app.speculation.allocator import AllocatorName
from app.speculation.coverage import CoveragePolicy
from app.speculation.evidence import EvidencePolicy
from app.speculation.generator import Generator
from app.speculation.planner import Plan, PlanInput, plan
from bench._sim_record import Recorder, SimBuild
from bench._sim_workload import T_MS, Workload, flag_probability

Funding = Literal["planner", "likely", "all"]


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """One speculating strategy. ``scorer``: ``fixed`` gives every change ``fixed_p``
    (the queue's long-run pass rate, which history teaches); ``flag`` gives the
    calibrated probability of its noisy risk flag. ``evidence``: refine with build
    results (the planner's default)."""

    funding: Funding = "planner"
    allocator: AllocatorName = "sticky"
    coverage: CoveragePolicy | None = None
    scorer: Literal["fixed", "flag"] = "flag"
    fixed_p: float = 0.9
    evidence: bool = True
    min_probability: float = 0.1
    weigh_alternatives: bool = True
    hedge_by_time: bool = True
    # the mean build time the planner is told: ``window``, the mean of the last 50 builds
    # (T before the first ends); ``ewma``, the controller's own running mean
    # (``DURATION_WEIGHT`` per build, ``DEFAULT_MEAN_BUILD_MS`` before the first ends)
    mean_build: Literal["window", "ewma"] = "window"
    # speculation.retries: a path whose build failed is built again (at once, in its own
    # slot) up to this many times before the failure counts (the controller's core.fold)
    retries: int = 0
    # speculation.vindication_depth: a failed path that a passed path of one of its head's
    # first N dependents contains is built once more (app/speculation/vindication.py)
    vindication: int = 0
    # batching: {max_size: the point's batch, max_wait_ms: batch_wait * T, adaptive}
    batching: bool = False
    batch_wait: float = 0.25
    adaptive: bool = False
    # skip_last: Mergify's rule - the last part of a bisected batch whose other parts all
    # landed is failed without a build of its own (a part of one: rejected; more: split)
    skip_last: bool = False
    # lanes: a change joins the forming batch only when it conflicts with one of its
    # changes (it would depend on that batch anyway); otherwise that batch closes
    lanes: bool = False
    # speculation.second_chance: a change whose batch of one failed goes once more to the
    # back of the queue, as a new batch of P(lands) second_chance.PROBABILITY, while the
    # queue's second chances pass often enough (app/domain/second_chance.py)
    second_chance: bool = False


def bid(i: int) -> str:
    return f"q/batch/{i:05d}"


class _Sim:
    def __init__(self, w: Workload, cfg: SpecConfig) -> None:
        self.w, self.cfg = w, cfg
        self.rec = Recorder(w)
        self.batches: dict[str, Batch] = {}
        self.entries: dict[str, list[PathEntry]] = {}
        self.active: dict[str, None] = {}  # in queue order
        self.probs: dict[str, float] = {}
        self.running: dict[str, SimBuild] = {}
        self.build_of: dict[str, SimBuild] = {}
        self.head_of: dict[str, str] = {}
        self.ends: list[tuple[int, int, str]] = []
        self.recent: deque[int] = deque(maxlen=50)
        self.ewma = DEFAULT_MEAN_BUILD_MS
        self.plans = 0  # diagnostics: plans run, merges on coverage, paths they invalidated
        self.bypasses = 0
        self.rebuilds = 0
        self.path_of: dict[str, SpeculationPath] = {}
        self.retried: dict[str, int] = {}
        self.members: dict[str, tuple[int, ...]] = {}  # each batch's changes, in order
        self.minted = 0
        self.forming: list[int] = []
        self.forming_since = 0
        self.outcomes: deque[bool] = deque(maxlen=batch_rules.RECENT_OUTCOMES)
        self.parts_of: dict[str, list[str]] = {}  # a bisected batch's parts, in order
        self.inferred = 0  # last parts failed without a build (skip_last)
        self.second: dict[str, None] = {}  # the batches minted as a second chance
        self.second_outcomes: list[bool] = []  # whether each ended one landed

    # -- events ----------------------------------------------------------------
    def run(self) -> Recorder:
        nxt = 0
        w = self.w
        while not self.rec.done():
            while self.ends and self.ends[0][2] not in self.running:
                heapq.heappop(self.ends)
            t_arr = w.arrival[nxt] if nxt < w.n else None
            t_end = self.ends[0][0] if self.ends else None
            t_close = self.closes_at()
            if t_arr is None and t_end is None and t_close is None:
                raise RuntimeError(f"stuck: {len(self.active)} batches never finished")
            t = min(x for x in (t_arr, t_end, t_close) if x is not None)
            while nxt < w.n and w.arrival[nxt] == t:
                self.arrive(nxt, t)
                nxt += 1
            if self.forming and t >= (self.closes_at() or t):
                self.close(t)
            while self.ends and self.ends[0][0] <= t:
                _, _, pid = heapq.heappop(self.ends)
                if pid in self.running:
                    self.finish(pid, t)
            self.step(t)
        return self.rec

    def arrive(self, i: int, t: int) -> None:
        if not self.cfg.batching:
            self.add_batch((i,), t)
            return
        if self.forming and self.cfg.lanes and not any(
                self.w.conflict(m, i) for m in self.forming):
            self.close(t)
        if not self.forming:
            self.forming_since = t
        self.forming.append(i)
        limit = batch_rules.window(self.w.point.batch, adaptive=self.cfg.adaptive,
                                   recent=self.outcomes)
        if len(self.forming) >= limit:
            self.close(t)

    def closes_at(self) -> int | None:
        """When the forming batch stops waiting for more changes."""
        if not self.forming:
            return None
        return self.forming_since + round(self.cfg.batch_wait * T_MS)

    def close(self, t: int) -> None:
        members, self.forming = tuple(self.forming), []
        self.add_batch(members, t)

    def add_batch(self, members: tuple[int, ...], t: int) -> None:
        """A new batch of ``members`` at the back of the queue (an arrival's, or a part
        of a failed batch)."""
        b_id = bid(self.minted)
        self.minted += 1
        conflict = self.w.conflict
        deps = tuple(h for h in self.active
                     if any(conflict(a, m) for a in self.members[h] for m in members))
        b = Batch(queue="q", id=b_id, contains=(b_id,), dependencies=deps,
                  state=BatchState.SPECULATING, version=1, created_at_ms=t)
        self.batches[b.id] = b
        self.members[b.id] = members
        self.active[b.id] = None
        p = 1.0 if self.cfg.scorer == "flag" else self.cfg.fixed_p
        if self.cfg.scorer == "flag":
            for m in members:
                p *= flag_probability(self.w.point, self.w.flagged[m])
        self.probs[b.id] = p

    def finish(self, pid: str, t: int) -> None:
        b = self.running.pop(pid)
        self.recent.append(b.end - b.start)
        self.ewma += DURATION_WEIGHT * ((b.end - b.start) - self.ewma)
        if not b.passed and self.retried.get(pid, 0) < self.cfg.retries:
            self.retried[pid] = self.retried.get(pid, 0) + 1
            es = self.entries[self.head_of[pid]]
            for k, e in enumerate(es):  # the entry counts it, as core.fold does
                if e.id == pid:
                    es[k] = replace(e, retried=self.retried[pid])
            self.start(self.path_of[pid], t)  # attempt + 1, the same slot
            return
        self._set(pid, PathStatus.PASSED if b.passed else PathStatus.FAILED, t)

    def _set(self, pid: str, status: PathStatus, t: int) -> None:
        es = self.entries[self.head_of[pid]]
        for k, e in enumerate(es):
            if e.id == pid:
                es[k] = replace(e, status=status, updated_at_ms=t)
                return

    # -- planning --------------------------------------------------------------
    def step(self, t: int) -> None:
        for _ in range(10_000):
            if self.cfg.vindication:
                self.vindicate(t)
            if self.cfg.skip_last:
                self.skip_last_parts(t)
            p = plan(self.snapshot(t))
            self.plans += 1
            self.apply(p, t)
            if self.cfg.funding != "planner":
                self.fund_baseline(t)
            if not p.decisions and not p.cancels:
                return
        raise RuntimeError(f"plans at t={t} never settled (cancel/fund loop)")

    def skip_last_parts(self, t: int) -> None:
        for parts in list(self.parts_of.values()):
            last = parts[-1]
            if last not in self.active or any(
                    self.batches[p].state is not BatchState.SUCCEEDED for p in parts[:-1]):
                continue
            if any(e.status is PathStatus.PASSED for e in self.entries.get(last, ())):
                continue
            for e in self.entries.get(last, ()):
                b = self.running.pop(e.id, None)
                if b is not None:
                    self.rec.abort(b)
                    self._set(e.id, PathStatus.CANCELLED, t)
            self.inferred += 1
            self.active.pop(last)
            self._failed(last, t)

    def _failed(self, head: str, t: int) -> None:
        """``head`` failed: bisected when it holds several changes (its parts go on at
        the back of the queue), else its change gets its second chance or is rejected."""
        members = self.members[head]
        if head in self.second:
            self.second_outcomes.append(False)
        if self.cfg.second_chance and second_chance.deserved(
                members=len(members), chance=int(head in self.second), build_failed=True,
                outcomes=self.second_outcomes, batch_id=head):
            self.second[bid(self.minted)] = None
            self.add_batch(members, t)
            self.probs[bid(self.minted - 1)] = second_chance.PROBABILITY
        elif len(members) > 1:
            ways = max(2, self.w.point.budget // 2)
            self.parts_of[head] = []
            for part in batch_rules.split([str(m) for m in members], ways=ways):
                self.parts_of[head].append(bid(self.minted))
                self.add_batch(tuple(int(m) for m in part), t)
        else:
            self.rec.reject(members[0])
        self.outcomes.append(False)
        self.batches[head] = replace(self.batches[head], state=BatchState.FAILED)

    def vindicate(self, t: int) -> None:
        """The controller's pre-plan step: reopened paths start building at once."""
        deps = {h: b.dependencies for h, b in self.batches.items()}
        res = {h: core.resolution(b.state) for h, b in self.batches.items()}
        opened = vindication.vindicate(list(self.active), deps, self.entries, res,
                                       self.cfg.vindication, t)
        for head, es in opened.items():
            before = {e.id: e.status for e in self.entries[head]}
            self.entries[head] = es
            for e in es:
                if e.status is PathStatus.PENDING and before[e.id] is PathStatus.FAILED:
                    self.start(e.path, t)

    def snapshot(self, t: int) -> PlanInput:
        batches = {h: self.batches[h] for h in self.active}
        for h in self.active:
            for d in self.batches[h].dependencies:
                batches.setdefault(d, self.batches[d])
        entries = {h: self.entries[h] for h in self.active if h in self.entries}
        mean = sum(self.recent) / len(self.recent) if self.recent else float(T_MS)
        cfg = self.cfg
        if cfg.mean_build == "ewma":
            mean = self.ewma
        return PlanInput(batches=batches, entries=entries, probs=self.probs,
                         budget=self.w.point.budget if cfg.funding == "planner" else 0,
                         allocator=cfg.allocator, coverage=cfg.coverage, now_ms=t,
                         mean_build_ms=mean,
                         evidence=EvidencePolicy() if cfg.evidence else None,
                         min_probability=cfg.min_probability,
                         weigh_alternatives=cfg.weigh_alternatives,
                         hedge_by_time=cfg.hedge_by_time,
                         vindication_depth=cfg.vindication)

    def apply(self, p: Plan, t: int) -> None:
        for head, es in p.entries.items():
            self.entries[head] = list(es)
        for d, deps in p.dependencies.items():
            self.batches[d] = replace(self.batches[d], dependencies=deps)
        for pid in p.cancels:
            b = self.running.pop(pid, None)
            if b is not None:
                self.rec.abort(b)
            self._set(pid, PathStatus.CANCELLED, t)
        for dec in p.decisions:
            self.bypasses += dec.bypass
            self.rebuilds += p.rebuilds if dec.bypass else 0
            self.active.pop(dec.head)
            if dec.kind != "merge":
                self._failed(dec.head, t)
                continue
            assert dec.path_id is not None
            self.rec.land(list(self.members[dec.head]), self.build_of[dec.path_id], t)
            self.outcomes.append(True)
            if dec.head in self.second:
                self.second_outcomes.append(True)
            self.batches[dec.head] = replace(self.batches[dec.head], state=BatchState.SUCCEEDED)
        for path in p.builds:
            self.start(path, t)

    def start(self, path: SpeculationPath, t: int) -> None:
        members = frozenset(m for h in (path.head, *path.base) for m in self.members[h])
        b = self.rec.build(self.members[path.head][0], members, t)
        self.running[path.id] = b
        self.build_of[path.id] = b
        self.head_of[path.id] = path.head
        self.path_of[path.id] = path
        heapq.heappush(self.ends, (b.end, self.rec.started, path.id))
        es = self.entries.setdefault(path.head, [])
        for k, e in enumerate(es):
            if e.id == path.id:
                es[k] = replace(e, status=PathStatus.BUILDING, updated_at_ms=t)
                return
        es.append(PathEntry(path=path, status=PathStatus.BUILDING, created_at_ms=t,
                            updated_at_ms=t))

    # -- baselines' funding ----------------------------------------------------
    def fund_baseline(self, t: int) -> None:
        heads = [self.batches[h] for h in self.active]
        res = {b: core.resolution(self.batches[b].state) for h in heads
               for b in h.dependencies}
        free = self.w.point.budget - sum(1 for h in self.active
                                         for e in self.entries.get(h, ()) if e.status.live)
        # the planner cancelled the doomed paths (app/speculation/doom.py): not refunded
        failed = doom.failed_paths(self.entries)
        deps = {h: b.dependencies for h, b in self.batches.items()}
        res.update({h: core.resolution(self.batches[h].state) for h in self.active})
        if self.cfg.funding == "likely":
            live = {h: self.entries[h] for h in self.active if h in self.entries}
            for path in core.sticky_fund(heads, live, res, self.w.point.budget,
                                         skip=lambda p: doom.doomed(p, failed, res, deps)):
                self.start(path, t)
            return
        gen = Generator(heads, res, self.probs)
        for h in heads:
            if free <= 0:
                return
            stored = {e.id for e in self.entries.get(h.id, ())}
            for cand in gen.head_paths(h.id):
                if cand.path.id in stored or doom.doomed(cand.path, failed, res, deps):
                    continue
                self.start(cand.path, t)
                free -= 1
                if free <= 0:
                    return


def speculate(w: Workload, cfg: SpecConfig) -> Recorder:
    return _Sim(w, cfg).run()
