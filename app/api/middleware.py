"""Small ASGI middleware of the gateway.

- ``BodyGuard``: on POST/PUT/PATCH, a body over ``max_bytes`` (64 KiB) is refused
  with 413 — by its ``Content-Length`` before anything is read, or while the body
  streams in — and a body that is not JSON (``application/json`` or ``*+json``) with
  415. The accepted body is buffered and replayed to the app.
- ``CatchAll``: an error no handler took becomes a JSON 500 (or 503 when transient)
  through ``app.api.errors.response_for`` instead of Starlette's plain-text page.
- ``SecurityHeaders``: ``X-Content-Type-Options: nosniff``, ``Referrer-Policy:
  no-referrer`` and ``X-Frame-Options: DENY`` on every response, and a
  ``Content-Security-Policy`` on HTML ones (``default-src 'self'``; the OpenAPI UI
  pages, whose assets are served from this origin too, get one that admits their
  inline start-up script). A header the app already set
  is left alone, so a page can send a stricter policy of its own.
- ``HttpMetrics``: reports method, route *template* (``/api/v1/queues/{queue}/...``,
  never the raw path; ``unmatched`` when no route answered, e.g. an unknown path or a
  body refused before routing), status and duration of every request to an observer.

CORS is off unless ``SQ_CORS_ORIGINS`` names origins (``app/main.py`` then adds
Starlette's ``CORSMiddleware`` for exactly those).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import error_response, response_for

log = logging.getLogger("submitqueue.api")

MAX_BODY_BYTES = 64 * 1024
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_json_media_type(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


class BodyGuard:
    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> str:
        return f"request body is larger than {self.max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        length: int | None = None
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                length = -1
            if length < 0:
                await error_response(400, "bad_request", "Content-Length is not a number")(
                    scope, receive, send)
                return
            if length > self.max_bytes:
                await error_response(413, "payload_too_large", self._too_large())(
                    scope, receive, send)
                return
        streamed = "chunked" in headers.get("transfer-encoding", "").lower()
        if (bool(length) or streamed) and not is_json_media_type(headers.get("content-type")):
            shown = headers.get("content-type") or "none"
            await error_response(
                415, "unsupported_media_type",
                f"request body must be JSON (Content-Type: application/json), got {shown}",
            )(scope, receive, send)
            return

        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; nothing to answer
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await error_response(413, "payload_too_large", self._too_large())(
                    scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class CatchAll:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            await response_for(exc)(scope, receive, send)


SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
HTML_CSP = "default-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
# /docs (Swagger UI) and /redoc (app/api/docs.py) load their bundles from this origin
# but start with an inline script and style; ReDoc runs a worker from a blob.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "worker-src 'self' blob:; frame-ancestors 'none'"
)
DOCS_PATHS = frozenset({"/docs", "/redoc", "/docs/oauth2-redirect"})


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers.append(name, value)
                media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
                if media == "text/html" and "content-security-policy" not in headers:
                    csp = DOCS_CSP if scope.get("path") in DOCS_PATHS else HTML_CSP
                    headers.append("Content-Security-Policy", csp)
            await send(message)

        await self.app(scope, receive, send_with_headers)


HttpObserver = Callable[[str, str, int, float], None]
"""``(method, route template, status, seconds)`` after each HTTP request."""

KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"


def route_template(scope: Scope) -> str:
    """The template of the route that answered: FastAPI's router puts the route on the
    scope; for plain Starlette routes and mounts (``/docs``, static files) it leaves the
    endpoint, whose route is looked up (a mount reports its prefix, not the file)."""
    route = scope.get("route")
    if route is None and scope.get("endpoint") is not None:
        endpoint = scope["endpoint"]
        router = getattr(scope.get("app"), "router", None)
        for candidate in getattr(router, "routes", ()):
            if getattr(candidate, "endpoint", None) is endpoint or \
                    getattr(candidate, "app", None) is endpoint:
                route = candidate
                break
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


class HttpMetrics:
    def __init__(self, app: ASGIApp, *, observe: HttpObserver) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app raises before answering, the server sends a 500
        started = time.perf_counter()

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            method = scope["method"] if scope["method"] in KNOWN_METHODS else "other"
            try:
                self.observe(method, route_template(scope), status,
                             time.perf_counter() - started)
            except Exception:
                log.warning("HTTP metrics observer failed", exc_info=True)
