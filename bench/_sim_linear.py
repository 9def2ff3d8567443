"""One-line merge queues (Zuul, GitHub, Trunk): every change is built on top of every
change ahead of it in the queue, whatever they touch.

These peers analyse no conflicts: a queue is one line (a Zuul shared change queue, a
GitHub merge queue, a Trunk queue without parallel mode). The k-th item's build is the
trunk plus the items ahead of it that it assumes land plus itself, started in queue
order while a CI slot is free (the point's ``budget`` is the CI's capacity: Zuul's node
pool, GitHub's build concurrency, Trunk's testing concurrency). Merges take no time and
happen only at the head of the line: the head lands when its own build passed (it was
built on exactly today's trunk by then) or when a policy below lets a later passed
build, which contains it, vouch for it. An item whose build no longer matches what it
assumes (an item ahead was rejected, or, with :attr:`Policy.reparent`, started failing
or stopped failing) has its build cancelled and rebuilt.

What the policies share, simplified: an item's failure is judged only once it is at
the head (everything ahead of it landed or was rejected), as Zuul reports and as we
assume GitHub does; builds never end in infrastructure errors; no timeouts.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from bench._sim_record import Recorder, SimBuild
from bench._sim_workload import Workload


@dataclass(frozen=True, slots=True)
class Policy:
    """``reparent``: a failing item is dropped from the builds behind it at once (Zuul's
    nearest-non-failing-item rule; GitHub ALLGREEN) instead of staying in them until it
    is judged. ``vouch_depth``: how many items behind a failed head may still vouch for
    it, each waited for; ``vouch_any``: any already-passed item behind it vouches too,
    however far (Trunk's optimistic merging). ``window``: Zuul's AIMD window (initial,
    floor): +1 per merge, halved per failure; ``None``: no window but the CI's."""

    reparent: bool
    vouch_depth: int = 0
    vouch_any: bool = False
    window: tuple[int, int] | None = None


@dataclass(slots=True)
class _Item:
    change: int
    build: SimBuild | None = None
    base: tuple[int, ...] = ()  # the items ahead its build assumed land
    done: bool = False  # its build ended
    serial: int = 0  # which build of the run it is (ends of cancelled builds are ignored)


@dataclass(slots=True)
class _Line:
    w: Workload
    policy: Policy
    rec: Recorder = field(init=False)
    queue: list[_Item] = field(default_factory=list)
    running: int = 0
    ends: list[tuple[int, int, int]] = field(default_factory=list)
    window: float = 0.0

    def __post_init__(self) -> None:
        self.rec = Recorder(self.w)
        self.window = float(self.policy.window[0]) if self.policy.window else float("inf")

    def run(self) -> Recorder:
        w, nxt = self.w, 0
        live: dict[int, _Item] = {}
        while not self.rec.done():
            t_arr = w.arrival[nxt] if nxt < w.n else None
            t_end = self.ends[0][0] if self.ends else None
            if t_arr is None and t_end is None:
                raise RuntimeError(f"stuck with {len(self.queue)} items in the line")
            t = min(x for x in (t_arr, t_end) if x is not None)
            while nxt < w.n and w.arrival[nxt] == t:
                item = _Item(nxt)
                self.queue.append(item)
                live[nxt] = item
                nxt += 1
            while self.ends and self.ends[0][0] <= t:
                _, serial, change = heapq.heappop(self.ends)
                ended = live.get(change)
                if ended is not None and ended.build is not None and not ended.done \
                        and ended.serial == serial:
                    ended.done = True
                    self.running -= 1
            self.step(t)
            for x in list(live):
                if x in self.rec.landed_at or x in self.rec.rejected:
                    del live[x]
        return self.rec

    # -- one instant -------------------------------------------------------------
    def step(self, t: int) -> None:
        while True:
            self.reconcile()
            if not self.decide(t):
                break
        self.fund(t)

    def _limit(self) -> int:
        """How many items from the front may be tested (Zuul's window; else all, CI
        slots permitting)."""
        if self.policy.window is None:
            return len(self.queue)
        return min(len(self.queue), max(int(self.window), 1))

    def _cancel(self, item: _Item) -> None:
        if item.build is not None and not item.done:
            self.rec.abort(item.build)
            self.running -= 1
        item.build, item.base, item.done = None, (), False

    def reconcile(self) -> None:
        """Cancel every build whose assumptions no longer match the line."""
        landed = self.rec.landed_at
        ahead: list[int] = []
        for item in self.queue:  # a window that shrank cancels nothing, as in Zuul
            if item.build is not None and \
                    tuple(x for x in item.base if x not in landed) != tuple(ahead):
                self._cancel(item)
            failing = item.done and item.build is not None and not item.build.passed
            if not (self.policy.reparent and failing):
                ahead.append(item.change)

    def decide(self, t: int) -> bool:
        """Land or reject at the head; True when something changed."""
        if not self.queue:
            return False
        head = self.queue[0]
        if head.build is None or not head.done:
            return False
        if head.build.passed:
            self._land(1, head.build, t)
            return True
        vouch = self._voucher()
        if vouch is not None:
            k, build = vouch
            self._land(k + 1, build, t)
            return True
        depth = self.queue[1:1 + self.policy.vouch_depth]
        if any(it.build is None or not it.done for it in depth):
            return False  # wait for the items behind to finish testing
        self.queue.pop(0)
        self.rec.reject(head.change)
        if self.policy.window:
            self.window = max(float(self.policy.window[1]), self.window / 2)
        return True

    def _voucher(self) -> tuple[int, SimBuild] | None:
        """The furthest passed build behind the failed head that contains it."""
        reach = len(self.queue) if self.policy.vouch_any else 1 + self.policy.vouch_depth
        best = None
        for k in range(1, min(reach, len(self.queue))):
            it = self.queue[k]
            if it.build is not None and it.done and it.build.passed:
                best = (k, it.build)
        return best

    def _land(self, count: int, build: SimBuild, t: int) -> None:
        group = [it.change for it in self.queue[:count]]
        for it in self.queue[:count]:
            if it.build is not build:
                self._cancel(it)  # vouched for: its own build is no longer needed
        del self.queue[:count]
        self.rec.land(group, build, t)
        if self.policy.window:
            self.window += count

    def fund(self, t: int) -> None:
        ahead: list[int] = []
        budget = self.w.point.budget
        for item in self.queue[:self._limit()]:
            if item.build is None and self.running < budget:
                item.base = tuple(ahead)
                item.build = self.rec.build(item.change, frozenset(ahead) | {item.change}, t)
                item.done = False
                self.running += 1
                item.serial = self.rec.started
                heapq.heappush(self.ends, (item.build.end, item.serial, item.change))
            failing = item.build is not None and item.done and not item.build.passed
            if not (self.policy.reparent and failing):
                ahead.append(item.change)


ZUUL = Policy(reparent=True, window=(20, 3))
GITHUB_ALLGREEN = Policy(reparent=True)
TRUNK_DEPTH = 2


def zuul(w: Workload) -> Recorder:
    """Zuul's dependent pipeline (the gate): one shared change queue, each change tested
    on top of every change ahead of it (optimistic: all assumed to merge). A failing
    change is taken out of the builds behind it at once (nearest non-failing item; they
    restart without it) and reported when it reaches the head; if a change ahead of it
    fails later, its own result is discarded and it is retested. The active window (the
    changes being tested) starts at 20, grows by 1 per merge and halves per failure,
    never below 3 (Zuul's defaults: window 20, window-floor 3, linear increase 1,
    exponential decrease 2); a change outside the window starts no build, but a window
    that shrinks cancels none. Simplified: one job per change; a job failure is final (no
    retry of a test failure; Zuul retries only pre-run/infrastructure failures)."""
    return _Line(w, ZUUL).run()


def github_allgreen(w: Workload) -> Recorder:
    """GitHub merge queue, "only merge non-failing pull requests" (ALLGREEN): each entry's
    merge group is the target plus every entry ahead plus itself, at most ``budget``
    built at once (build concurrency); an entry merges only on its own passing checks;
    a failed entry is removed and the groups behind are rebuilt without it. Simplified:
    the groups behind drop a failed entry as soon as it fails and it is removed when it
    reaches the front (GitHub does not document the order); merge limits and the status
    check timeout play no part (merges are instant)."""
    return _Line(w, GITHUB_ALLGREEN).run()


def github_headgreen(w: Workload) -> Recorder:
    """GitHub merge queue with "only merge non-failing pull requests" unselected
    (HEADGREEN): a failed entry may merge in a group (at most ``batch`` entries from the
    front) whose last entry passed, since that entry's merge group contained it. A
    failed entry at the front waits for the next ``batch - 1`` entries' checks; if none
    passed it is removed and those behind are rebuilt without it."""
    return _Line(w, Policy(reparent=False, vouch_depth=max(w.point.batch - 1, 0))).run()


def trunk(w: Workload) -> Recorder:
    """Trunk merge queue with optimistic merging and a pending failure depth of
    ``TRUNK_DEPTH`` (2; Trunk's default is 0, its documentation's example 2): a failed
    entry stays in the queue, still included in the tests of the entries behind it,
    until the 2 entries behind it finish testing; a passed entry behind it (which
    contains it) merges it and everything in between (optimistic merging, however far
    behind); else it is evicted and those behind restart without it. Simplified: no
    batching, no parallel queues (impacted targets), no automatic retry."""
    return _Line(w, Policy(reparent=False, vouch_depth=TRUNK_DEPTH, vouch_any=True)).run()
