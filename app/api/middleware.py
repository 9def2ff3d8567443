"""Small ASGI middleware of the gateway.

- ``BodyGuard``: on POST/PUT/PATCH, a body over ``max_bytes`` (64 KiB) is refused
  with 413 — by its ``Content-Length`` before anything is read, or while the body
  streams in — and a body that is not JSON (``application/json`` or ``*+json``) with
  415. The accepted body is buffered and replayed to the app.
- ``CatchAll``: an error no handler took becomes a JSON 500 (or 503 when transient)
  through ``app.api.errors.response_for`` instead of Starlette's plain-text page.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import error_response, response_for

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
