"""``AccessLog``: one structured line per HTTP request, and a request id on every line.

Each request gets an id: the caller's ``X-Request-ID`` when it is a plain token (1-64
of ``[A-Za-z0-9._:-]``; anything else is replaced, never echoed), else a new random
one. The id is bound to the log context while the request runs (every line the
request writes carries ``request_id``) and returned in the ``X-Request-ID`` response
header. When the response ends, one ``http request`` line records ``method``,
``target`` (path and query; secret-named query values are masked by the log
renderer), ``route`` (the route template, as in the metrics), ``status``,
``duration_ms``, ``client`` and ``request_id``. Probes and scrapes (``/healthz``,
``/readyz``, ``/metrics``) log at DEBUG, everything else at INFO; uvicorn's own
unstructured access log is turned off (``submitqueue serve``).
"""

from __future__ import annotations

import logging
import re
import time
import uuid

import structlog
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.middleware import route_template

log = logging.getLogger("submitqueue.access")

HEADER = "X-Request-ID"
_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def request_id(headers: Headers) -> str:
    given = headers.get(HEADER, "")
    return given if _TOKEN.fullmatch(given) else uuid.uuid4().hex


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(Headers(scope=scope))
        status = 500  # the server answers 500 if the app raises before answering
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=rid):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                path = scope.get("path", "")
                query = scope.get("query_string", b"").decode("latin-1")
                client = scope.get("client")
                log.log(logging.DEBUG if path in QUIET_PATHS else logging.INFO,
                        "http request", extra={
                            "method": scope.get("method", ""),
                            "target": f"{path}?{query}" if query else path,
                            "route": route_template(scope), "status": status,
                            "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                            "client": f"{client[0]}:{client[1]}" if client else ""})
