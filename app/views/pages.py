"""What the status pages read (served by ``app/api/views.py``): a queue's overview, one
request's view, and search. Read-only and bounded: at most :data:`IN_FLIGHT_LIMIT` in-flight
requests, :data:`RECENT_LIMIT` recent ones, :data:`HISTORY_LIMIT` history rows and
:data:`SEARCH_LIMIT` search hits per call.

| Route (``/api/v1``) | What |
|---|---|
| ``GET /queues/{queue}/overview`` | counts; in-flight requests by stage, each with P(land) and ETA; every live batch with its dependencies and paths (assumptions, status, build and log link); recent terminal requests with durations; the queue's timing |
| ``GET /queues/{queue}/requests/{n}/view`` | the stage trail, the batch and what it waits on, P(land)/ETA, the typed removal reason with evidence, whether it can be cancelled |
| ``GET /search?q=&queue=`` | ``q`` = a sqid (``demo/12``; a bare number with ``queue``) or an exact change URI (every queue) |

What the numbers mean: ``forecast.py``. The trail and the reasons: ``trail.py``. An
unknown request -> ``NotFound``; an empty, oversized or unrecognisable search ->
``ValidationError`` (the routes check the queue and the text's characters).
"""  # noqa: E501 - route tables read best unwrapped

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from app.db.repos import batches as batch_repo
from app.db.repos import circuits as circuit_repo
from app.db.repos import epochs as epoch_repo
from app.db.repos import request_log as log_repo
from app.db.repos import views as view_repo
from app.domain.entities import Batch, RequestSummary
from app.domain.errors import ValidationError
from app.domain.ids import request_id, request_number
from app.domain.outages import waiting_text
from app.domain.queue_config import QueueConfig
from app.domain.states import BatchState, PublicStatus
from app.speculation import core
from app.speculation.generator import Generator
from app.views import trail as trail_mod
from app.views.data import QueueState, TimingCache, ViewRuntime, load_queue_state, request_prior
from app.views.forecast import Forecast, forecast_unbatched
from app.views.schemas import (
    AssumptionOut,
    BatchOut,
    BuildOut,
    DependencyOut,
    EvidenceOut,
    ForecastOut,
    OutageOut,
    OverviewOut,
    PathOut,
    RemovalOut,
    RequestRowOut,
    RequestViewOut,
    SearchHitOut,
    SearchOut,
    StageGroupOut,
    StageOut,
    TimingOut,
    TrailEntryOut,
    TrailEventOut,
    TrunkMoveOut,
)
from app.views.stages import STAGES, TERMINAL, landed_commits, stage_of

IN_FLIGHT_LIMIT = 200
RECENT_LIMIT = 20
HISTORY_LIMIT = 5000
SEARCH_LIMIT = 20
MAX_QUERY = 1024

_SQID = re.compile(r"^(?P<queue>[A-Za-z0-9][A-Za-z0-9._-]{0,99})/(?P<n>[1-9][0-9]{0,17})$")
def forecast_out(f: Forecast | None, now_ms: int) -> ForecastOut | None:
    if f is None:
        return None
    return ForecastOut(p_land=f.p_land, p_speculation_holds=f.p_speculation_holds,
                       eta_ms=f.remaining_ms(now_ms), eta_at_ms=f.eta_at_ms, basis=f.basis)


def _request_forecast(rt: ViewRuntime, state: QueueState, s: RequestSummary,
                      batch_id: str | None) -> Forecast | None:
    if s.status in TERMINAL:
        return None
    batch = state.batches.get(batch_id) if batch_id else None
    if s.status == PublicStatus.CANCELLING.value and (
            batch is None or batch.state is not BatchState.MERGING):
        return Forecast(0.0, None, None, "a cancel was requested")
    if batch is not None and batch_id in state.forecasts:
        return state.forecasts[batch_id]
    prior = request_prior(rt, state.queue, s.request_id, state.details)
    return forecast_unbatched(prior, state.timing, state.now_ms)


def row(rt: ViewRuntime, state: QueueState, s: RequestSummary,
        batch_id: str | None) -> RequestRowOut:
    terminal = s.status in TERMINAL
    return RequestRowOut(
        sqid=s.request_id, n=request_number(s.request_id), queue=s.queue, status=s.status,
        stage=stage_of(s.status), change_uris=list(s.change_uris),
        received_at_ms=s.received_at_ms, status_at_ms=s.status_timestamp_ms,
        duration_ms=max(0, s.status_timestamp_ms - s.received_at_ms) if terminal else None,
        last_error=s.last_error, batch_id=batch_id,
        forecast=forecast_out(_request_forecast(rt, state, s, batch_id), state.now_ms),
        landed_commits=landed_commits(s), submitted_by=s.submitted_by,
    )


def dependency_out(state: QueueState, dep: str) -> DependencyOut:
    b = state.batches.get(dep)
    return DependencyOut(id=dep, state=b.state.value if b else None,
                         requests=list(b.contains) if b else [])


def batch_out(state: QueueState, b: Batch) -> BatchOut:
    res = {bid: core.resolution(x.state) for bid, x in state.batches.items()}
    gen = Generator([b], res, state.probs)
    paths = []
    for e in state.entries.get(b.id, []):
        build = state.build_of(e)
        score = gen.score(e.path)
        paths.append(PathOut(
            id=e.id, status=e.status.value, attempt=e.attempt,
            assumptions=[AssumptionOut(
                batch_id=d, assumption=a.value,
                batch_state=state.batches[d].state.value if d in state.batches else None)
                for d, a in e.path.dependencies],
            described=trail_mod.describe_assumptions(e.path.dependencies),
            p_assumptions_hold=math.exp(score) if score > -math.inf else 0.0,
            build=None if build is None else BuildOut(
                id=build.id, status=build.status.value,
                log_url=trail_mod.safe_url(build.log_url), started_at_ms=build.created_at_ms,
                finished_at_ms=build.updated_at_ms if build.status.terminal else None),
        ))
    return BatchOut(
        id=b.id, state=b.state.value, requests=list(b.contains),
        dependencies=[dependency_out(state, d) for d in b.dependencies], paths=paths,
        failure_reason=b.failure_reason,
        forecast=forecast_out(state.forecasts.get(b.id), state.now_ms)
        or ForecastOut(p_land=None, p_speculation_holds=None, eta_ms=None, eta_at_ms=None,
                       basis="no forecast"),
    )


def timing_out(state: QueueState) -> TimingOut:
    t = state.timing
    return TimingOut(build_ms=t.build_ms, merge_ms=t.merge_ms, build_samples=t.build_samples,
                     merge_samples=t.merge_samples)


async def overview(rt: ViewRuntime, config: QueueConfig, timings: TimingCache) -> OverviewOut:
    """Everything the queue page shows, in one read."""
    queue = config.name
    async with rt.db.read() as s:
        counts = (await log_repo.counts_by_status(s, queues=[queue])).get(queue, {})
        live = await view_repo.in_flight(s, queue=queue, limit=IN_FLIGHT_LIMIT + 1)
        recent = await view_repo.recent_terminal(s, queue=queue, limit=RECENT_LIMIT)
        outages = await open_outages(s, queue=queue, now_ms=rt.broker.clock())
        move = await epoch_repo.latest(s, queue=queue)
    truncated = len(live) > IN_FLIGHT_LIMIT
    live = live[:IN_FLIGHT_LIMIT]
    state = await load_queue_state(rt, queue, timing_=await timings.get(rt, queue),
                                   requests=[x.request_id for x in live])
    of_request = state.batch_of_request()
    groups: dict[str, list[RequestRowOut]] = {stage: [] for stage in STAGES}
    for x in live:
        r = row(rt, state, x, of_request.get(x.request_id) or _batch_md(x))
        groups.setdefault(r.stage, []).append(r)
    return OverviewOut(
        queue=queue, description=config.description, build_budget=config.build_budget,
        now_ms=state.now_ms, counts={k: v for k, v in counts.items() if k != "accepting"},
        stages=[StageGroupOut(stage=k, requests=v) for k, v in groups.items()],
        batches=[batch_out(state, b) for b in state.active[:IN_FLIGHT_LIMIT]],
        recent=[row(rt, state, x, _batch_md(x)) for x in recent],
        timing=timing_out(state), truncated=truncated or len(state.active) > IN_FLIGHT_LIMIT,
        outages=outages,
        trunk_move=_move_out(move, config.git.target_branch if config.git else "the target"),
    )


def _move_out(move: epoch_repo.Epoch | None, branch: str) -> TrunkMoveOut | None:
    if move is None:
        return None
    paths = "path" if move.rebuilt == 1 else "paths"
    return TrunkMoveOut(
        target_branch=branch, tip_sha=move.tip_sha, epoch=move.epoch, rebuilt=move.rebuilt,
        detected_at_ms=move.detected_at_ms,
        notice=f"{branch} moved outside the queue at {move.tip_sha[:12]}; "
               f"{move.rebuilt} {paths} rebuilt")


async def open_outages(s: Any, *, queue: str, now_ms: int) -> list[OutageOut]:
    """The open circuits of ``queue``'s dependencies (``<kind>:<queue>``)."""
    circuits = await circuit_repo.load_all(s)
    return [OutageOut(dependency=c.dependency, status=c.status.value, since_ms=c.opened_at_ms,
                      open_for_ms=c.open_for_ms(now_ms), next_probe_ms=c.probe_at_ms,
                      failures=c.failures, text=waiting_text(c, now_ms=now_ms))
            for c in sorted(circuits.values(), key=lambda c: c.dependency)
            if c.is_open and c.dependency.partition(":")[2] == queue]


def _batch_md(s: RequestSummary) -> str | None:
    value = s.metadata.get("batch_id")
    return value if isinstance(value, str) and value else None


async def request_view(rt: ViewRuntime, queue: str, n: int,
                       timings: TimingCache) -> RequestViewOut:
    """Everything the request page shows, in one read."""
    sqid = request_id(queue, n)
    async with rt.db.read() as s:
        summary = await log_repo.get_summary(s, queue=queue, request_id=sqid)
        history = await view_repo.history_of(s, queue=queue, request_ids=[sqid],
                                             limit=HISTORY_LIMIT)
        own = await batch_repo.for_request(s, queue=queue, request_id=sqid)
        outages = [] if summary.status in TERMINAL else \
            await open_outages(s, queue=queue, now_ms=rt.broker.clock())
    batch_id = own[-1].id if own else None
    state = await load_queue_state(rt, queue, timing_=await timings.get(rt, queue),
                                   extra=[batch_id] if batch_id else [], requests=[sqid])
    batch = state.batches.get(batch_id) if batch_id else None
    waits_on = [dependency_out(state, d) for d in (batch.dependencies if batch else ())
                if d not in state.batches or not state.batches[d].state.terminal]
    entries = state.entries.get(batch_id or "", [])
    builds = [trail_mod.BuildFact(build_id=b.id, path_id=e.id, status=b.status.value,
                                  log_url=b.log_url)
              for e in entries if (b := state.build_of(e)) is not None]
    removal = trail_mod.removal(status=summary.status, last_error=summary.last_error,
                                history=history, batch_id=batch_id,
                                assumptions={e.id: e.path.dependencies for e in entries},
                                queue=queue, builds=builds)
    stages = trail_mod.trail(history, now_ms=state.now_ms, terminal=TERMINAL)
    return RequestViewOut(
        request=row(rt, state, summary, batch_id),
        trail=[StageOut(
            status=st.status, label=st.label, at_ms=st.at_ms, duration_ms=st.duration_ms,
            events=[TrailEventOut(event=k, count=v) for k, v in st.events],
            entries=[TrailEntryOut(at_ms=e.at_ms, event=e.event, build_id=e.build_id,
                                   build_status=e.build_status, build_url=e.build_url,
                                   path_id=e.path_id) for e in st.entries],
            last_error=st.last_error, metadata=dict(st.metadata)) for st in stages],
        batch=batch_out(state, batch) if batch else None,
        waits_on=waits_on,
        removal=None if removal is None else RemovalOut(
            kind=removal.kind, text=removal.text, stage=removal.stage,
            evidence=[EvidenceOut(label=e.label, url=e.url) for e in removal.evidence]),
        cancellable=summary.status not in TERMINAL
        and summary.status != PublicStatus.CANCELLING.value,
        timing=timing_out(state), now_ms=state.now_ms, outages=outages,
    )


async def search(rt: ViewRuntime, queues: Sequence[str], q: str,
                 queue: str | None) -> SearchOut:
    """Find requests by sqid or by an exact change URI, in the configured ``queues``."""
    text = q.strip()
    if not text:
        raise ValidationError("q is empty; search for a sqid like demo/12 or a change URI")
    if len(text) > MAX_QUERY:
        raise ValidationError(f"q is longer than {MAX_QUERY} characters; a change URI is at "
                              f"most {MAX_QUERY} bytes")
    if text.isdigit() and queue:
        text = f"{queue}/{text}"
    m = _SQID.match(text)
    if m:
        if m["queue"] not in queues:
            return SearchOut(query=text, kind="sqid", items=[])
        async with rt.db.read() as s:
            found = await view_repo.summaries(s, queue=m["queue"], request_ids=[text])
        return SearchOut(query=text, kind="sqid", items=[_hit(x) for x in found.values()])
    if "://" not in text:
        raise ValidationError(f"q {text[:80]!r} is neither a sqid (like demo/12) nor a change "
                              "URI (like git://host/repo/refs%2Fheads%2Fbranch/<sha>)")
    async with rt.db.read() as s:
        keys = await view_repo.requests_of_change_uri(s, queues=list(queues),
                                                      change_uri=text, limit=SEARCH_LIMIT)
        items: list[SearchHitOut] = []
        for qn, rid in keys:
            found = await view_repo.summaries(s, queue=qn, request_ids=[rid])
            items.extend(_hit(x) for x in found.values())
    return SearchOut(query=text, kind="change_uri", items=items)


def _hit(s: RequestSummary) -> SearchHitOut:
    return SearchHitOut(sqid=s.request_id, queue=s.queue, status=s.status,
                        received_at_ms=s.received_at_ms, change_uris=list(s.change_uris),
                        page=f"/queues/{s.queue}/requests/{request_number(s.request_id)}")
