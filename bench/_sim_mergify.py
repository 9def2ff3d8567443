"""Mergify's merge queue: batches, parallel checks, n-way split on failure, retries.

What Mergify does (its documentation: merge-queue batches, "When a batch fails",
parallel checks, ``skip_intermediate_results``, ``max_checks_retries``), as configured
here:

- ``batch_size`` = the point's ``batch``: the queue is cut into batches of up to that
  many pull requests, in queue order;
- ``max_parallel_checks`` = the point's ``budget``: up to that many drafts are tested at
  once, each the target plus every batch ahead of it plus its own batch (cumulative);
- ``max_checks_retries`` = 1: a failed draft is rerun once before it counts as failed;
- ``skip_intermediate_results: true``: a later draft that passed, which contains the
  earlier batches, merges them all, even if their own drafts failed ("a later pass
  clears an earlier failure");
- when the head batch has failed (its rerun too) and no later draft has passed yet, the
  drafts behind it are cancelled (they were tested on top of a failure) and the batch
  is *split*: cut into ``k + 1`` parts (``k`` = as many parallel checks as allowed, at
  most one less than its size), the first ``k`` prefixes tested at once on today's
  trunk; the parts ahead of the first failing one merge, the ones after it go back to
  the queue, the failing part is split again; the last part is never retested: if
  every prefix passes, it is the culprit (a single pull request is removed untested
  on its own);
- ``batch_max_failure_resolution_attempts``: unlimited (the default).

Simplified: batches form at once from what is waiting (``batch_max_wait_time``, 30 s by
default, is negligible against a build time); one failed batch is split at a time and
the batches behind it wait meanwhile; the parts that go back to the queue return as
one batch at its front; a later pass also clears a failed prefix inside a split.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from bench._sim_record import Recorder, SimBuild
from bench._sim_workload import Workload

RETRIES = 1


@dataclass(slots=True)
class _Draft:
    changes: list[int]  # the batch (or, in a split, the prefix) it tests
    build: SimBuild | None = None
    base: tuple[int, ...] = ()
    done: bool = False
    serial: int = 0
    tries: int = 0  # reruns so far

    @property
    def passed(self) -> bool:
        return self.build is not None and self.done and self.build.passed

    @property
    def failed(self) -> bool:
        return self.build is not None and self.done and not self.build.passed


@dataclass(slots=True)
class _Split:
    parts: list[list[int]]  # every part but the last is a prefix with a draft
    prefixes: list[_Draft]


def _cut(changes: list[int], n: int) -> list[list[int]]:
    size, extra = divmod(len(changes), n)
    out, i = [], 0
    for k in range(n):
        j = i + size + (1 if k < extra else 0)
        out.append(changes[i:j])
        i = j
    return out


@dataclass(slots=True)
class _Mergify:
    w: Workload
    rec: Recorder = field(init=False)
    waiting: list[int] = field(default_factory=list)
    train: list[_Draft] = field(default_factory=list)
    split: _Split | None = None
    running: int = 0
    ends: list[tuple[int, int]] = field(default_factory=list)
    live: dict[int, _Draft] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rec = Recorder(self.w)

    def run(self) -> Recorder:
        w, nxt = self.w, 0
        while not self.rec.done():
            t_arr = w.arrival[nxt] if nxt < w.n else None
            t_end = self.ends[0][0] if self.ends else None
            if t_arr is None and t_end is None:
                raise RuntimeError("mergify: stuck")
            t = min(x for x in (t_arr, t_end) if x is not None)
            while nxt < w.n and w.arrival[nxt] == t:
                self.waiting.append(nxt)
                nxt += 1
            while self.ends and self.ends[0][0] <= t:
                _, serial = heapq.heappop(self.ends)
                d = self.live.pop(serial, None)
                if d is not None:
                    self._ended(d)
            self.step(t)
        return self.rec

    def _ended(self, d: _Draft) -> None:
        d.done = True
        self.running -= 1
        assert d.build is not None
        if not d.build.passed and d.tries < RETRIES:
            d.tries += 1
            d.build, d.done = None, False  # rerun: the same tree, its next attempt

    def _cancel(self, d: _Draft) -> None:
        if d.build is not None and not d.done:
            self.rec.abort(d.build)
            self.live.pop(d.serial, None)
            self.running -= 1
        d.build, d.base, d.done, d.tries = None, (), False, 0

    def _start(self, d: _Draft, base: tuple[int, ...], t: int) -> None:
        d.base = base
        d.build = self.rec.build(d.changes[-1], frozenset(base) | frozenset(d.changes), t)
        d.done = False
        d.serial = self.rec.started
        self.live[d.serial] = d
        self.running += 1
        heapq.heappush(self.ends, (d.build.end, d.serial))

    def _land(self, changes: list[int], build: SimBuild, t: int) -> None:
        self.rec.land([c for c in changes if c not in self.rec.landed_at], build, t)

    # -- one instant -----------------------------------------------------------------
    def step(self, t: int) -> None:
        for _ in range(100_000):
            if not (self._split_step(t) if self.split else self._train_step(t)):
                break
        else:
            raise RuntimeError(f"mergify: decisions at t={t} never settled")
        self._fund(t)

    def _train_step(self, t: int) -> bool:
        ahead: list[int] = []
        for d in self.train:  # a draft no longer on top of exactly the batches ahead
            if d.build is not None and \
                    [x for x in d.base if x not in self.rec.landed_at] != ahead:
                self._cancel(d)
            ahead += d.changes
        if not self.train:
            return False
        passed = [k for k, d in enumerate(self.train) if d.passed]
        if passed:  # it contains every batch ahead of it: they all merge
            k = passed[-1]
            for d in self.train[:k]:
                self._cancel(d)
            self._land([c for d in self.train[:k + 1] for c in d.changes],
                       self.train[k].build, t)  # type: ignore[arg-type]
            del self.train[:k + 1]
            return True
        head = self.train[0]
        if not head.failed:
            return False
        for d in self.train[1:]:
            self._cancel(d)
        self.train.pop(0)
        self._begin_split(head.changes)
        return True

    def _begin_split(self, part: list[int]) -> None:
        if len(part) == 1:
            self.rec.reject(part[0])
            self.split = None
            return
        k = min(self.w.point.budget, len(part) - 1)
        parts = _cut(part, k + 1)
        prefixes = [_Draft([c for p in parts[:i + 1] for c in p]) for i in range(k)]
        self.split = _Split(parts, prefixes)

    def _split_step(self, t: int) -> bool:
        s = self.split
        assert s is not None
        passed = [k for k, d in enumerate(s.prefixes) if d.passed]
        if passed:
            k = passed[-1]
            for d in s.prefixes[:k]:
                self._cancel(d)
            self._land(s.prefixes[k].changes, s.prefixes[k].build, t)  # type: ignore[arg-type]
            del s.prefixes[:k + 1]
            del s.parts[:k + 1]
            if not s.prefixes:  # every prefix passed: the last part is the culprit
                self._begin_split([c for p in s.parts for c in p])
            return True
        first = s.prefixes[0]
        if not first.failed:
            return False
        for d in s.prefixes[1:]:
            self._cancel(d)
        after = [c for p in s.parts[1:] for c in p]
        if after:
            self.train.insert(0, _Draft(after))
        self._begin_split(s.parts[0])
        return True

    def _fund(self, t: int) -> None:
        budget = self.w.point.budget
        if self.split is not None:
            for d in self.split.prefixes:
                if d.build is None and self.running < budget:
                    self._start(d, (), t)
            return
        while len(self.train) < budget and self.waiting:
            self.train.append(_Draft(self.waiting[:self.w.point.batch]))
            del self.waiting[:self.w.point.batch]
        ahead: list[int] = []
        for d in self.train:
            if d.build is None and self.running < budget:
                self._start(d, tuple(ahead), t)
            ahead += d.changes


def mergify(w: Workload) -> Recorder:
    """Mergify's merge queue as the module docstring describes it."""
    return _Mergify(w).run()
