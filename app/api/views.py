"""Read endpoints of the status pages (``/api/v1``): a queue's overview, one request's
view, and search — HTTP only; what they return is assembled by ``app/views/pages.py``
(its docstring says what each holds and its bounds).

| Route | What |
|---|---|
| ``GET /queues/{queue}/overview`` | the queue page in one read |
| ``GET /queues/{queue}/requests/{n}/view`` | the request page in one read |
| ``GET /search?q=&queue=`` | ``q`` = a sqid (``demo/12``; a bare number with ``queue``) or an exact change URI (every queue) |

Unknown queue or request -> 404; an empty, oversized or unrecognisable ``q`` -> 400;
``q`` or ``queue`` holding NUL, a control character or a lone surrogate -> 422
(``SafeLine``).
"""  # noqa: E501 - route tables read best unwrapped

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from app.api.auth import Reader
from app.api.deps import RuntimeDep, queue_config
from app.api.examples import ok
from app.api.schemas import ErrorOut, SafeLine
from app.views import pages
from app.views.schemas import OverviewOut, RequestViewOut, SearchOut

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 422, 500, 503)
}

router = APIRouter(prefix="/api/v1", tags=["views"], responses=_ERRORS)

RequestNumber = Annotated[int, Path(ge=1, le=2**63 - 1,
                                    description="The number in the sqid <queue>/<n>.")]


@router.get("/queues/{queue}/overview", response_model=OverviewOut,
            summary="A queue's page in one read", responses=ok(200, "OVERVIEW"),
            description="Everything the queue page shows, in one read: counts by status, "
                        "the requests in flight by stage, the active batches with their "
                        "speculation paths and builds, recent terminal requests, typical "
                        "build and merge times, outages and the queue's health.")
async def overview(queue: str, rt: RuntimeDep, _caller: Reader) -> OverviewOut:
    """Everything the queue page shows, in one read."""
    return await pages.overview(rt, queue_config(rt, queue), rt.view_timing, rt.stalls)


@router.get("/queues/{queue}/requests/{n}/view", response_model=RequestViewOut,
            summary="A request's page in one read", responses=ok(200, "REQUEST_VIEW"),
            description="Everything the request page shows, in one read: the request "
                        "(status, stage, forecast, health), its trail of statuses with "
                        "their events, its batch with the speculation paths and builds, "
                        "what it waits on, and whether the caller may cancel it.")
async def request_view(queue: str, n: RequestNumber, rt: RuntimeDep,
                       _caller: Reader) -> RequestViewOut:
    """Everything the request page shows, in one read."""
    config = queue_config(rt, queue)
    return await pages.request_view(rt, queue, n, rt.view_timing, rt.stalls,
                                    windows=config.freeze_windows)


@router.get("/search", response_model=SearchOut, summary="Find requests",
            responses=ok(200, "SEARCH"),
            description="Find requests by sqid (`demo/12`, or a bare number with `queue`) "
                        "or by an exact change URI (in every queue); each hit links its "
                        "page. An empty, oversized or unrecognisable `q` is a 400.")
async def search(rt: RuntimeDep, _caller: Reader, q: Annotated[SafeLine, Query(description=(
        "A sqid (demo/12), a request number with 'queue', or an exact change URI."))] = "",
                 queue: Annotated[SafeLine | None, Query(max_length=100)] = None) -> SearchOut:
    """Find requests by sqid or by an exact change URI."""
    return await pages.search(rt, list(rt.queues), q, queue)
