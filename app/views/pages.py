"""What the status pages read (served by ``app/api/views.py``): a queue's overview, one
request's view, and search. Read-only and bounded: at most :data:`IN_FLIGHT_LIMIT` in-flight
requests, :data:`RECENT_LIMIT` recent ones, :data:`HISTORY_LIMIT` history rows and
``search.SEARCH_LIMIT`` search hits per call (``search.py``).

| Route (``/api/v1``) | What |
|---|---|
| ``GET /queues/{queue}/overview`` | counts; in-flight requests by stage, each with P(land) and ETA; every live batch with its dependencies and paths (assumptions, status, build and log link); recent terminal requests with durations; the queue's timing |
| ``GET /queues/{queue}/requests/{n}/view`` | the stage trail, the batch and what it waits on, P(land)/ETA, the typed removal reason with evidence, whether it can be cancelled |
| ``GET /search?q=&queue=`` | ``q`` = a sqid (``demo/12``; a bare number with ``queue``), a batch id (``demo/batch/3``: its requests) or an exact change URI (every queue) |

What the numbers mean: ``forecast.py``. The trail and the reasons: ``trail.py``. An
unknown request -> ``NotFound``; an empty, oversized or unrecognisable search ->
``ValidationError`` (the routes check the queue and the text's characters).
"""  # noqa: E501 - route tables read best unwrapped

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from app.db.repos import batches as batch_repo
from app.db.repos import build_runs as build_run_repo
from app.db.repos import circuits as circuit_repo
from app.db.repos import epochs as epoch_repo
from app.db.repos import request_log as log_repo
from app.db.repos import views as view_repo
from app.domain.entities import Batch, RequestLog, RequestSummary
from app.domain.freeze import FreezeWindowConfig
from app.domain.ids import request_id, request_number
from app.domain.outages import waiting_text
from app.domain.queue_config import QueueConfig
from app.domain.states import Assumption, BatchState, LogType, PublicStatus
from app.speculation import core
from app.speculation.generator import Generator
from app.views import explain, logtail
from app.views import health as health_mod
from app.views import rows as rows_mod
from app.views import trail as trail_mod
from app.views.data import QueueState, TimingCache, ViewRuntime, load_queue_state, request_prior
from app.views.forecast import Forecast, forecast_unbatched
from app.views.freeze import FreezeView, freeze_view
from app.views.health import Health
from app.views.schemas import (
    AssumptionOut,
    BatchOut,
    BuildOut,
    DependencyOut,
    EvidenceOut,
    FlakeOut,
    ForecastOut,
    HealthOut,
    LogExcerptOut,
    LogLineOut,
    OutageOut,
    OverviewOut,
    PathOut,
    RemovalOut,
    RequestRowOut,
    RequestViewOut,
    SlotsOut,
    StageGroupOut,
    StageOut,
    StallOut,
    TimingOut,
    TrailEntryOut,
    TrailEventOut,
    TrunkMoveOut,
)
from app.views.search import search as search  # the search route's entry point
from app.views.stages import STAGES, TERMINAL, landed_commits, stage_of
from app.views.stalls import Stall, StallDetector

IN_FLIGHT_LIMIT = 200
RECENT_LIMIT = 20
HISTORY_LIMIT = 5000
LOGS_TRIED = 5  # failed builds whose stored log a request view looks for
TARGET = "the target branch"

def forecast_out(f: Forecast | None, now_ms: int) -> ForecastOut | None:
    if f is None:
        return None
    return ForecastOut(p_land=f.p_land, p_speculation_holds=f.p_speculation_holds,
                       eta_ms=f.remaining_ms(now_ms), eta_at_ms=f.eta_at_ms, basis=f.basis,
                       p_land_from=f.p_land_from)


def _request_forecast(rt: ViewRuntime, state: QueueState, s: RequestSummary,
                      batch_id: str | None) -> Forecast | None:
    if s.status in TERMINAL:
        return None
    batch = state.batches.get(batch_id) if batch_id else None
    if s.status == PublicStatus.CANCELLING.value and (
            batch is None or batch.state is not BatchState.MERGING):
        return Forecast(0.0, None, None, "a cancel was requested", "state")
    if batch is not None and batch_id in state.forecasts:
        return state.forecasts[batch_id]
    prior = request_prior(rt, state.queue, s.request_id, state.details)
    return forecast_unbatched(prior, state.timing, state.now_ms)


def request_health(state: QueueState, s: RequestSummary, batch_id: str | None) -> Health:
    """What ``health.py`` says of the request (``ok`` before ``with_health`` ran)."""
    if state.health is None:
        return health_mod.OK
    st = state.stall
    stall = None
    if st is not None and st.stalled and st.request_id == s.request_id \
            and st.last_moved_at_ms is not None:
        stall = health_mod.stalled(st.last_moved_at_ms, st.checked_at_ms, st.threshold_ms)
    return state.health.of_request(s.request_id, batch_id, terminal=s.status in TERMINAL,
                                   stall=stall)


def health_out(h: Health) -> HealthOut:
    return HealthOut(state=h.state, topic=h.topic, subject=h.subject, attempts=h.attempts,
                     max_attempts=h.max_attempts, last_error=h.last_error,
                     next_attempt_at_ms=h.next_attempt_ms, attempt_running=h.running,
                     since_ms=h.since_ms, needs_operator=h.needs_operator,
                     operator_reason=h.operator_reason, admin_url=h.admin_url, text=h.text)


async def with_health(rt: ViewRuntime, state: QueueState, stall: Stall | None) -> QueueState:
    """Read the queue's failing messages (one statement for the whole page) into ``state``."""
    troubles = await rt.broker.troubles()
    builds = {b.id: b.batch_id for b in state.builds.values()}
    state.health = health_mod.HealthIndex(state.queue, troubles, batches=state.batches,
                                          build_batches=builds)
    state.stall = stall
    return state


def stall_out(st: Stall | None) -> StallOut | None:
    """The verdict as of the detector's last check (``unmoved_ms`` at that moment)."""
    if st is None:
        return None
    return StallOut(stalled=st.stalled, request=st.request_id,
                    last_moved_at_ms=st.last_moved_at_ms,
                    unmoved_ms=st.unmoved_ms(st.checked_at_ms), threshold_ms=st.threshold_ms,
                    checked_at_ms=st.checked_at_ms, text=st.text(st.checked_at_ms))


def row(rt: ViewRuntime, state: QueueState, s: RequestSummary,
        batch_id: str | None, *, position: int | None = None) -> RequestRowOut:
    terminal = s.status in TERMINAL
    health = request_health(state, s, batch_id)
    batch = state.batches.get(batch_id) if batch_id else None
    forecast = health_mod.honest(_request_forecast(rt, state, s, batch_id), health,
                                 batch=batch, now_ms=state.now_ms)
    stage = stage_of(s.status)
    duration = max(0, s.status_timestamp_ms - s.received_at_ms) if terminal else None
    w = rows_mod.who(s.change_uris, state.details.get(s.request_id, ()))
    act = rows_mod.Activity(s.status, s.status) if terminal else rows_mod.activity(
        stage, batch, state.entries.get(batch_id or "", ()), state.resolutions, state.slots)
    return RequestRowOut(
        sqid=s.request_id, n=request_number(s.request_id), queue=s.queue, status=s.status,
        stage=stage, change_uris=list(s.change_uris),
        received_at_ms=s.received_at_ms, status_at_ms=s.status_timestamp_ms,
        duration_ms=duration, last_error=s.last_error, batch_id=batch_id,
        forecast=forecast_out(forecast, state.now_ms),
        landed_commits=landed_commits(s), submitted_by=s.submitted_by,
        priority=s.priority.value, health=health_out(health), title=w.title,
        branch=w.branch, author=w.author,
        author_email=w.author_email, position=None if terminal else position,
        elapsed_ms=duration if duration is not None else max(0, state.now_ms - s.received_at_ms),
        activity=act.code, activity_text=act.text,
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
    health = state.health.of_batch(b.id) if state.health else health_mod.OK
    forecast = health_mod.honest(state.forecasts.get(b.id), health, batch=b,
                                 now_ms=state.now_ms)
    return BatchOut(
        id=b.id, state=b.state.value, requests=list(b.contains),
        dependencies=[dependency_out(state, d) for d in b.dependencies], paths=paths,
        failure_reason=b.failure_reason,
        forecast=forecast_out(forecast, state.now_ms)
        or ForecastOut(p_land=None, p_speculation_holds=None, eta_ms=None, eta_at_ms=None,
                       basis="no forecast"),
        health=health_out(health),
    )


def timing_out(state: QueueState) -> TimingOut:
    t = state.timing
    return TimingOut(build_ms=t.build_ms, merge_ms=t.merge_ms, build_samples=t.build_samples,
                     merge_samples=t.merge_samples)


async def overview(rt: ViewRuntime, config: QueueConfig, timings: TimingCache,
                   stalls: StallDetector | None = None) -> OverviewOut:
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
                                   requests=[x.request_id for x in (*live, *recent)])
    stall = stalls.get(queue) if stalls else None
    await with_health(rt, state, stall)
    of_request = state.batch_of_request()
    freeze = await freeze_view(rt.db, queue, state.now_ms, config.freeze_windows)
    groups: dict[str, list[RequestRowOut]] = {stage: [] for stage in STAGES}
    for i, x in enumerate(live, start=1):
        r = _frozen(row(rt, state, x, of_request.get(x.request_id) or _batch_md(x),
                        position=i), freeze)
        groups.setdefault(r.stage, []).append(r)
    in_flight = [r for g in groups.values() for r in g]
    slots = SlotsOut(budget=state.slots.budget, in_use=state.slots.in_use,
                     building=sum(r.activity == "building" for r in in_flight),
                     waiting_for_slot=sum(r.activity == "waiting_for_slot" for r in in_flight),
                     text=state.slots.text)
    return OverviewOut(
        queue=queue, description=config.description, build_budget=config.build_budget,
        now_ms=state.now_ms, counts={k: v for k, v in counts.items() if k != "accepting"},
        stages=[StageGroupOut(stage=k, requests=v) for k, v in groups.items()],
        batches=[batch_out(state, b) for b in state.active[:IN_FLIGHT_LIMIT]],
        recent=[row(rt, state, x, _batch_md(x)) for x in recent],
        timing=timing_out(state), truncated=truncated or len(state.active) > IN_FLIGHT_LIMIT,
        outages=outages,
        trunk_move=_move_out(move, config.git.target_branch if config.git else "the target"),
        stall=stall_out(stall),
        queue_health=health_out(state.health.queue_wide or health_mod.OK
                                if state.health else health_mod.OK),
        slots=slots, throughput=await timings.throughput(rt, queue),
        freeze=freeze,
    )


def _frozen(r: RequestRowOut, freeze: FreezeView) -> RequestRowOut:
    """``r`` with the ``frozen`` activity when its queue's freeze holds it back (not a
    hotfix under ``allow_hotfix``: it lands through the freeze)."""
    if freeze.allow_hotfix and r.priority == "hotfix":
        return r
    act = rows_mod.frozen(rows_mod.Activity(r.activity, r.activity_text), freeze.text)
    return r if act.code == r.activity else r.model_copy(
        update={"activity": act.code, "activity_text": act.text})


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


async def request_view(rt: ViewRuntime, queue: str, n: int, timings: TimingCache,
                       stalls: StallDetector | None = None, *,
                       windows: tuple[FreezeWindowConfig, ...] = ()) -> RequestViewOut:
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
    await with_health(rt, state, stalls.get(queue) if stalls else None)
    batch = state.batches.get(batch_id) if batch_id else None
    waits_on = [dependency_out(state, d) for d in (batch.dependencies if batch else ())
                if d not in state.batches or not state.batches[d].state.terminal]
    entries = state.entries.get(batch_id or "", [])
    builds = [trail_mod.BuildFact(build_id=b.id, path_id=e.id, status=b.status.value,
                                  log_url=b.log_url)
              for e in entries if (b := state.build_of(e)) is not None]
    assumptions = {e.id: e.path.dependencies for e in entries}
    removal = trail_mod.removal(status=summary.status, last_error=summary.last_error,
                                history=history, batch_id=batch_id, assumptions=assumptions,
                                queue=queue, builds=builds)
    removal_out = None if removal is None else await _removal_out(
        rt, removal, explain.failed_builds(history, builds), assumptions, state, sqid)
    stages = trail_mod.trail(history, now_ms=state.now_ms, terminal=TERMINAL)
    freeze = await freeze_view(rt.db, queue, state.now_ms, windows)
    return RequestViewOut(
        request=_frozen(row(rt, state, summary, batch_id), freeze),
        trail=[StageOut(
            status=st.status, label=st.label, at_ms=st.at_ms, duration_ms=st.duration_ms,
            events=[TrailEventOut(event=k, count=v) for k, v in st.events],
            entries=[TrailEntryOut(at_ms=e.at_ms, event=e.event, build_id=e.build_id,
                                   build_status=e.build_status, build_url=e.build_url,
                                   path_id=e.path_id) for e in st.entries],
            last_error=st.last_error, metadata=dict(st.metadata)) for st in stages],
        batch=batch_out(state, batch) if batch else None,
        waits_on=waits_on,
        removal=removal_out,
        cancellable=summary.status not in TERMINAL
        and summary.status != PublicStatus.CANCELLING.value,
        timing=timing_out(state), now_ms=state.now_ms, outages=outages,
        freeze=freeze, flakes=flakes(history),
    )


def flakes(history: Sequence[RequestLog]) -> list[FlakeOut]:
    """The ``flake_suspected`` events of a history, oldest first."""
    return [FlakeOut(at_ms=e.timestamp_ms, build_id=str(e.metadata.get("build_id", "")),
                     path_id=str(e.metadata.get("path_id", "")),
                     detail=str(e.metadata.get("detail", "")))
            for e in history if e.type is LogType.EVENT and e.event == "flake_suspected"]


async def _removal_out(rt: ViewRuntime, removal: trail_mod.Removal,
                       failed: list[explain.FailedBuild],
                       assumptions: Mapping[str, Sequence[tuple[str, Assumption]]],
                       state: QueueState, sqid: str) -> RemovalOut:
    """The removal in a person's words (``explain.py``), its next steps and, for a build
    failure, the failing lines of the first failed build whose log we keep."""
    alone: bool | None = None
    log: LogExcerptOut | None = None
    if removal.kind == "build_failed":
        removal = explain.build_failed(removal, failed, assumptions, state.batches, sqid,
                                       TARGET)
        known = [assumptions[f.path_id] for f in failed if f.path_id in assumptions]
        alone = any(not deps for deps in known) if known else None
        log = await _log_excerpt(rt, failed)
    return RemovalOut(
        kind=removal.kind, reason=removal.reason, text=removal.text, stage=removal.stage,
        evidence=[EvidenceOut(label=e.label, url=e.url) for e in removal.evidence],
        next_steps=explain.next_steps(removal, alone_failed=alone, has_log=log is not None),
        log=log)


async def _log_excerpt(rt: ViewRuntime, failed: Sequence[explain.FailedBuild]
                       ) -> LogExcerptOut | None:
    async with rt.db.read() as s:
        for f in failed[:LOGS_TRIED]:
            text = await build_run_repo.get_log(s, build_id=f.build_id)
            ex = logtail.excerpt(text) if text else None
            if ex is not None:
                return LogExcerptOut(
                    build_id=f.build_id, url=f.url, first_failure=ex.first_failure,
                    total_lines=ex.total_lines,
                    lines=[LogLineOut(n=x.n, text=x.text, failing=x.failing)
                           for x in ex.lines])
    return None
