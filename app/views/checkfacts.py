"""What a GitHub check-run shows of a request: the request page's view
(``pages.request_view``), folded into ``app/domain/checkrun.CheckFacts``.

The composition root (``app/main.py``) hands :func:`facts_source` to the controllers
(``Deps.check_facts``), so the check-run and the request page can never tell a request
differently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from app.db.repos import views as view_repo
from app.domain.checkrun import CheckFacts, Link, TrailStep
from app.domain.freeze import FreezeWindowConfig
from app.domain.ids import request_number
from app.domain.notifications import page_url
from app.views.data import TimingCache, ViewRuntime
from app.views.pages import request_view
from app.views.schemas import RequestViewOut
from app.views.stalls import StallDetector


def facts_of(view: RequestViewOut, public_url: str) -> CheckFacts:
    r, removal = view.request, view.removal
    log = removal.log if removal is not None else None
    return CheckFacts(
        sqid=r.sqid, queue=r.queue, status=r.status, stage=r.stage,
        page_url=page_url(public_url, r.sqid), change_uris=tuple(r.change_uris),
        activity_text=r.activity_text, position=r.position,
        p_land=r.forecast.p_land if r.forecast else None,
        eta_ms=r.forecast.eta_ms if r.forecast else None,
        landed_commits=tuple(r.landed_commits),
        needs_operator=r.health.needs_operator,
        health_text=r.health.text if r.health.state != "ok" else "",
        reason=removal.reason if removal else None,
        removal_text=removal.text if removal else "",
        evidence=tuple(Link(e.label, e.url) for e in removal.evidence) if removal else (),
        next_steps=tuple(removal.next_steps) if removal else (),
        log_lines=tuple(line.text for line in log.lines) if log else (),
        log_url=log.url if log else None,
        trail=tuple(TrailStep(s.label, s.at_ms, s.duration_ms) for s in view.trail),
        last_error=r.last_error,
    )


FactsSource = Callable[[str, str, str], Awaitable[CheckFacts | None]]


def facts_source(rt: ViewRuntime, *, public_url: str, timings: TimingCache,
                 stalls: Callable[[], StallDetector | None],
                 windows: Mapping[str, tuple[FreezeWindowConfig, ...]]) -> FactsSource:
    """``(queue, sqid, log id) -> CheckFacts``, None while the request log does not hold
    that entry (the gateway's projection is behind the caller)."""
    async def facts(queue: str, sqid: str, log_id: str) -> CheckFacts | None:
        async with rt.db.read() as s:
            if not await view_repo.has_log(s, queue=queue, request_id=sqid, log_id=log_id):
                return None
        view = await request_view(rt, queue, request_number(sqid), timings, stalls(),
                                  windows=windows.get(queue, ()))
        return facts_of(view, public_url)

    return facts
