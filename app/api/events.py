"""Live updates for the pages: ``GET /api/v1/events?queue=Q`` (Server-Sent Events).

``event: request`` carries a request's current summary (the fields of
``GET /queues/{queue}/requests/{n}`` plus ``stage``) each time its history grows
(a status or an event such as ``building``); ``id:`` is the request-log row id. A
``: keep-alive`` comment goes out every :data:`HEARTBEAT_S` seconds. A stream that fell
too far behind gets ``event: reset`` and ends (the client reconnects). A client that
reconnects should re-read what it shows (the pages re-fetch on every ``open``).

The streams are fed by the runtime's :class:`~app.views.events.EventHub` (one poller
per process; its bounds, its shutdown and how it works across processes are described
there). More than its ``MAX_STREAMS`` -> 503 with ``Retry-After: 5``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from app.api.auth import Reader
from app.api.deps import RuntimeDep, queue_config
from app.api.examples import media
from app.api.schemas import ErrorOut, RequestSummaryOut
from app.domain.entities import RequestSummary
from app.views.events import EventHub, Subscriber
from app.views.stages import stage_of

HEARTBEAT_S = 15.0

router = APIRouter(prefix="/api/v1", tags=["views"],
                   responses={c: {"model": ErrorOut} for c in (404, 422, 503)})


def frame(event: str, data: dict[str, Any], event_id: int | None = None) -> str:
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return head + f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def body_of(summary: RequestSummary) -> dict[str, Any]:
    body = RequestSummaryOut.of(summary).model_dump(mode="json")
    body["stage"] = stage_of(summary.status)
    return body


async def stream(hub: EventHub, sub: Subscriber, *,
                 heartbeat_s: float = HEARTBEAT_S) -> AsyncIterator[str]:
    try:
        yield "retry: 2000\n: connected\n\n"
        while True:
            if sub.items:
                event_id, summary = sub.items.popleft()
                yield frame("request", body_of(summary), event_id)
                continue
            if sub.ended:
                if sub.ended == "overflow":
                    yield frame("reset", {"reason": "this stream fell behind; reconnect"})
                return
            sub.wake.clear()
            try:
                await asyncio.wait_for(sub.wake.wait(), heartbeat_s)
            except TimeoutError:
                yield ": keep-alive\n\n"
    finally:
        hub.unsubscribe(sub)


@router.get("/events", response_class=StreamingResponse,
            summary="Live updates of a queue's requests (Server-Sent Events)",
            responses={200: {"content": {"text/event-stream": {
                "schema": {"type": "string"}, **media("EVENTS")}},
                "description": "A Server-Sent Events stream."}})
async def events(rt: RuntimeDep, _caller: Reader,
                 queue: Annotated[str, Query(max_length=100)]) -> Any:
    """Live updates of a queue's requests as Server-Sent Events: an ``event: request``
    frame each time a request's history grows, its ``data`` the request's summary (as
    ``GET /queues/{queue}/requests/{n}``) plus its ``stage``, its ``id`` the
    request-log row; a ``: keep-alive`` comment every 15 s; ``event: reset`` when the
    stream fell behind (then it ends: reconnect and re-read). 503 with ``Retry-After``
    when the server holds too many streams."""
    queue_config(rt, queue)
    hub = rt.event_hub
    sub = await hub.subscribe(queue)  # TooManyStreams: 503 + Retry-After (app/api/errors.py)
    return StreamingResponse(stream(hub, sub), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
