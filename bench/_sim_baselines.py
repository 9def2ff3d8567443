"""Strategies that do not speculate over dependencies: oracle, serial, batch-bisect."""

from __future__ import annotations

from bench._sim_record import Recorder, SimBuild
from bench._sim_workload import Workload


def oracle(w: Workload) -> Recorder:
    """Knows every outcome: at arrival, each change is built once on exactly the trunk it
    will land on (the good conflicting changes ahead of it), with unlimited builds; it
    lands when that build ends and every good change it depends on has landed; a bad
    change is rejected when its one build ends. It knows the flakes too: its builds
    never fail spuriously."""
    land: dict[int, int] = {}
    base: dict[int, frozenset[int]] = {}
    for i in range(w.n):
        ahead = frozenset(j for j in w.conflicts[i]
                          if not w.bad[j] and land[j] > w.arrival[i])
        base[i] = ahead
        end = w.arrival[i] + w.duration(i, 0)
        land[i] = end if w.bad[i] else max([end, *(land[j] for j in ahead)])
    rec = Recorder(w)
    events: list[tuple[int, int, int]] = []  # (time, kind, change): land/reject 0, start 1
    for i in range(w.n):
        events.append((w.arrival[i], 1, i))
        events.append((land[i], 0, i))
    builds: dict[int, SimBuild] = {}
    for t, kind, i in sorted(events):
        if kind == 1:
            builds[i] = rec.build(i, base[i] | {i}, t, flaky=False)
        elif w.bad[i]:
            rec.reject(i)
        else:
            rec.land([i], builds[i], t)
    return rec


def serial(w: Workload) -> Recorder:
    """One build at a time, first come first served, each on today's trunk."""
    rec = Recorder(w)
    t = 0
    for i in range(w.n):
        t = max(t, w.arrival[i])
        b = rec.build(i, frozenset({i}), t)
        t = b.end
        if b.passed:
            rec.land([i], b, t)
        else:
            rec.reject(i)
    return rec


def batch_bisect(w: Workload, max_batch: int | None = None) -> Recorder:
    """bors-style: one build at a time of every waiting change together (at most
    ``max_batch``); a passing batch lands in one push; a failing batch of several is split
    in two halves that are tried next, in order; a failing single change is rejected."""
    rec = Recorder(w)
    t = 0
    nxt = 0  # next change not yet taken into a batch
    work: list[list[int]] = []
    while not rec.done():
        if not work:
            if nxt < w.n and w.arrival[nxt] > t:
                t = w.arrival[nxt]
            batch: list[int] = []
            while nxt < w.n and w.arrival[nxt] <= t and (
                    max_batch is None or len(batch) < max_batch):
                batch.append(nxt)
                nxt += 1
            work.append(batch)
        batch = work.pop(0)
        b = rec.build(batch[0], frozenset(batch), t)
        t = b.end
        if b.passed:
            rec.land(batch, b, t)
        elif len(batch) == 1:
            rec.reject(batch[0])
        else:
            half = len(batch) // 2
            work[:0] = [batch[:half], batch[half:]]
    return rec
