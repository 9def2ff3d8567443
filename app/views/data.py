"""Loading what the status pages show: a queue's live batches with their path sets and
builds, the scorer's probabilities, and the queue's recent timing. Read-only.

The pages are a read model over both halves of the database: the gateway's request
log and projections, and the orchestrator's batches, path sets and builds (read
through their repositories, never written). Each load is a handful of bounded
queries; the timing (medians over the last :data:`TIMING_WINDOW` log rows) is cached
per queue for :data:`TIMING_TTL_S` seconds, so a page refreshing on every live event
does not rescan history.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.db.engine import Database
from app.db.repos import batches as batch_repo
from app.db.repos import changes as change_repo
from app.db.repos import speculation as spec_repo
from app.db.repos import views as view_repo
from app.domain.entities import Batch, Build, ChangeDetails, PathEntry
from app.domain.states import BatchState, BuildStatus
from app.extensions.base import QueueExtensions
from app.queue import Trouble
from app.speculation import core
from app.speculation.generator import probabilities
from app.views import throughput as throughput_mod
from app.views.forecast import Forecast, QueueSnapshot, Timing, forecast_batches, timing
from app.views.health import HealthIndex
from app.views.rows import Slots, resolutions
from app.views.rows import slots as slots_of
from app.views.schemas import ThroughputOut
from app.views.stalls import Stall

ACTIVE = (BatchState.CREATING, BatchState.CREATED, BatchState.SPECULATING,
          BatchState.MERGING, BatchState.CANCELLING)
TIMING_WINDOW = 2000
TIMING_TTL_S = 5.0
_FINISHED_BUILDS = frozenset({BuildStatus.SUCCEEDED.value, BuildStatus.FAILED.value})


class _Registry(Protocol):
    def for_queue(self, name: str) -> QueueExtensions: ...


class _Clock(Protocol):
    def clock(self) -> int: ...

    async def troubles(self, *, limit: int = ...) -> list[Trouble]: ...


class ReadRuntime(Protocol):
    """What the read model needs: the database (read only), the gateway's clock and the
    queue's failing messages."""

    @property
    def db(self) -> Database: ...

    @property
    def broker(self) -> _Clock: ...


class ViewRuntime(ReadRuntime, Protocol):
    @property
    def extensions(self) -> _Registry: ...


@dataclass
class QueueState:
    """A queue's live batches (and every batch they or ``extra`` name), folded."""

    queue: str
    now_ms: int
    batches: dict[str, Batch]
    active: list[Batch]
    entries: dict[str, list[PathEntry]]
    builds: dict[tuple[str, int], Build]
    probs: dict[str, float]
    timing: Timing
    forecasts: dict[str, Forecast] = field(default_factory=dict)
    details: dict[str, list[ChangeDetails]] = field(default_factory=dict)
    health: HealthIndex | None = None  # set by the pages (``pages.with_health``)
    stall: Stall | None = None
    slots: Slots = field(default_factory=lambda: Slots(budget=0, in_use=0))

    @functools.cached_property
    def resolutions(self) -> dict[str, core.Resolution]:
        """Every known batch's resolution (computed once per page)."""
        return resolutions(self.batches)

    def build_of(self, e: PathEntry) -> Build | None:
        return self.builds.get((e.id, e.attempt))

    def batch_of_request(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for b in sorted(self.batches.values(), key=lambda b: b.created_at_ms):
            for sqid in b.contains:
                out[sqid] = b.id
        return out


class TimingCache:
    """Per-queue timing with a short TTL, and the queue's last 24 hours
    (``throughput.py``) with a longer one; one per app (``app.state``)."""

    def __init__(self, ttl_s: float = TIMING_TTL_S,
                 throughput_ttl_s: float = throughput_mod.THROUGHPUT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.throughput_ttl_s = throughput_ttl_s
        self._items: dict[str, tuple[float, Timing]] = {}
        self._throughput: dict[str, tuple[float, ThroughputOut]] = {}

    async def throughput(self, rt: ReadRuntime, queue: str) -> ThroughputOut:
        hit = self._throughput.get(queue)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        async with rt.db.read() as s:
            value = await throughput_mod.load(s, queue=queue, now_ms=rt.broker.clock())
        self._throughput[queue] = (now + self.throughput_ttl_s, value)
        return value

    async def get(self, rt: ReadRuntime, queue: str) -> Timing:
        hit = self._items.get(queue)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        value = await load_timing(rt, queue)
        self._items[queue] = (now + self.ttl_s, value)
        return value


async def load_timing(rt: ReadRuntime, queue: str) -> Timing:
    """Medians over the queue's last log rows: build durations (trigger -> verdict, from
    the builds those rows name) and merges (``speculated`` -> ``landed``)."""
    async with rt.db.read() as s:
        rows = await view_repo.recent_log(s, queue=queue, limit=TIMING_WINDOW)
        build_ids = {str(r.metadata["build_id"]) for r in rows
                     if r.event == "building" and r.metadata.get("build_id")}
        builds = await view_repo.build_timings(s, queue=queue, build_ids=build_ids)
    speculated: dict[str, int] = {}
    landed: dict[str, int] = {}
    for r in rows:
        if r.status == "speculated":
            speculated[r.request_id] = min(r.timestamp_ms,
                                           speculated.get(r.request_id, r.timestamp_ms))
        elif r.status == "landed":
            landed[r.request_id] = r.timestamp_ms
    merges = [landed[k] - speculated[k] for k in landed if k in speculated]
    return timing((b.updated_at_ms - b.created_at_ms for b in builds
                   if b.status in _FINISHED_BUILDS), merges)


def _changes_of(batch: Batch, details: Mapping[str, Sequence[ChangeDetails]]
                ) -> list[ChangeDetails]:
    return [d for sqid in batch.contains for d in details.get(sqid, ())]


async def load_queue_state(rt: ViewRuntime, queue: str, *, timing_: Timing,
                           extra: Iterable[str] = (),
                           requests: Iterable[str] = ()) -> QueueState:
    """``extra``: batches to include besides the active ones (with their dependencies
    and path sets); ``requests``: requests whose change details to load besides the
    batches' members (for the prior of those not batched yet)."""
    extra = list(extra)
    now = rt.broker.clock()
    async with rt.db.read() as s:
        active = await batch_repo.list_by_states(s, queue=queue, states=ACTIVE)
        batches = {b.id: b for b in active}
        batches.update(await batch_repo.get_many(s, queue=queue, ids=set(extra) - set(batches)))
        dep_ids = {d for b in batches.values() for d in b.dependencies} - set(batches)
        batches.update(await batch_repo.get_many(s, queue=queue, ids=dep_ids))
        heads = [b.id for b in active] + [b for b in extra if b in batches]
        sets = await spec_repo.path_sets(s, queue=queue, heads=heads)
        keys = [(e.id, e.attempt) for ps in sets.values() for e in ps.entries]
        links = await spec_repo.links(s, queue=queue, keys=keys)
        by_id = await spec_repo.builds_by_id(s, queue=queue, ids=links.values())
        members = sorted({m for b in batches.values() for m in b.contains} | set(requests))
        details = await change_repo.details_for(s, queue=queue, request_ids=members)
    builds = {k: by_id[v] for k, v in links.items() if v in by_id}
    entries = {
        head: [core.fold(e, builds.get((e.id, e.attempt)), (e.id, e.attempt) in links, now,
                         rt.extensions.for_queue(queue).speculation.retries)
               for e in ps.entries]
        for head, ps in sets.items()
    }
    ext = rt.extensions.for_queue(queue)
    scorer = ext.scorer
    probs = probabilities(sorted(batches),
                          lambda bid: scorer.score(bid, _changes_of(batches[bid], details)))
    state = QueueState(queue=queue, now_ms=now, batches=batches, active=active, entries=entries,
                       builds=builds, probs=probs, timing=timing_, details=details,
                       slots=slots_of(ext.build_budget, entries, active))
    started = {e.id: b.created_at_ms for es in entries.values() for e in es
               if (b := builds.get((e.id, e.attempt))) is not None}
    snap = QueueSnapshot(batches=batches, entries=entries, build_started_ms=started,
                         probs=probs, timing=timing_, now_ms=now,
                         build_budget=ext.build_budget)
    state.forecasts = forecast_batches(snap, list(batches))
    return state


def request_prior(rt: ViewRuntime, queue: str, sqid: str,
                  details: Mapping[str, Sequence[ChangeDetails]]) -> float:
    """The scorer's probability for a request not in a batch yet (its own changes)."""
    scorer = rt.extensions.for_queue(queue).scorer
    return probabilities([sqid], lambda i: scorer.score(i, list(details.get(i, ()))))[sqid]
