"""The one mapping from errors to HTTP. Every error body is
``{"error": {"code": "...", "message": "..."}}``.

| Error | HTTP | code |
|---|---|---|
| ``NotFound`` | 404 | ``not_found`` |
| ``ValidationError`` | 400 | ``validation_error`` |
| ``AlreadyExists`` / ``InvalidState`` / ``VersionMismatch`` | 409 | their ``code`` |
| ``IdempotencyKeyReused`` | 422 | ``idempotency_key_reused`` |
| queue ``UnknownTopic``, ``MessageNotFound`` | 404 | ``not_found`` |
| queue ``NotDeadLettered`` / ``PayloadTooLarge`` / ``InvalidPayload`` | 409 / 413 / 400 | |
| ``Busy`` (the SQLite write lock stayed taken too long), queue ``QueueBusy`` | 503 | ``busy`` |
| ``ServiceUnavailable`` (``TooManyStreams``: ``Retry-After: 5``), other ``QueueError``s, transient database errors | 503 | |
| ``Unauthorized`` (``WWW-Authenticate: Bearer``), ``BadSignature`` | 401 | their ``code`` |
| ``Forbidden`` (``AdminDisabled``, ``MissingScope``, ``HotfixNotAllowed``) | 403 | their ``code`` |
| ``QuotaExceeded`` (``Retry-After``: when the quota frees up) | 429 | ``quota_exceeded`` |
| FastAPI's ``RequestValidationError`` (bad body, query or path) | 422 | ``invalid_request`` |
| Starlette's ``HTTPException`` (unknown route, wrong method) | its status | e.g. ``not_found`` |
| anything else | 500 | ``internal_error`` (logged; no details leak) |

Every 503 carries ``Retry-After`` (:data:`RETRY_AFTER_S` seconds). Text a client sent
(a JSON key, say) is echoed with lone surrogates escaped, so an error body always
encodes as UTF-8.

``response_for`` is the mapping, the only one (the tree itself is drawn in
``app/domain/errors.py``); ``handle`` registers it with FastAPI, and the catch-all
middleware (``app/api/middleware.py``) uses it for errors FastAPI's handlers never see.
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.domain.errors import (
    AlreadyExists,
    Busy,
    Forbidden,
    IdempotencyKeyReused,
    InvalidState,
    NotFound,
    QuotaExceeded,
    ServiceUnavailable,
    SubmitQueueError,
    Unauthorized,
    ValidationError,
    VersionMismatch,
)
from app.queue import (
    InvalidPayload,
    MessageNotFound,
    NotDeadLettered,
    PayloadTooLarge,
    QueueBusy,
    QueueError,
    UnknownTopic,
    classify,
)

log = logging.getLogger("submitqueue.api")

TRY_AGAIN = "the service could not take this request right now; try again"
INTERNAL = "internal error; it has been logged"
RETRY_AFTER_S = 2
_RETRY = {"Retry-After": str(RETRY_AFTER_S)}


_DOMAIN_STATUS: tuple[tuple[type[SubmitQueueError], int], ...] = (
    (NotFound, 404),
    (ValidationError, 400),
    (AlreadyExists, 409),
    (InvalidState, 409),
    (VersionMismatch, 409),
    (Busy, 503),
    (IdempotencyKeyReused, 422),
    (ServiceUnavailable, 503),
    (Unauthorized, 401),
    (Forbidden, 403),
    (QuotaExceeded, 429),
)

_HTTP_CODES = {
    400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
    415: "unsupported_media_type", 422: "invalid_request", 429: "too_many_requests",
    503: "unavailable",
}


# Queue errors that describe the request, not an outage.
_QUEUE_STATUS: tuple[tuple[type[QueueError], int, str], ...] = (
    (UnknownTopic, 404, "not_found"),
    (MessageNotFound, 404, "not_found"),
    (NotDeadLettered, 409, "invalid_state"),
    (PayloadTooLarge, 413, "payload_too_large"),
    (InvalidPayload, 400, "validation_error"),
)


def printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``), so it encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": printable(message)}}


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=status, headers=headers)


def describe_validation(errors: Sequence[Any]) -> str:
    """One readable sentence naming each offending field, e.g.
    ``invalid request: body.change_uris: List should have at least 1 item ...``."""
    parts: list[str] = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "")
            parts.append(f"request body is not valid JSON{': ' + reason if reason else ''}")
            continue
        if loc[:1] == ["body"]:
            where = ".".join(loc[1:]) or "request body"
        elif len(loc) > 1:
            where = f"{loc[0]} parameter {'.'.join(loc[1:])!r}"
        else:
            where = ".".join(loc) or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts or ["malformed input"])


def response_for(exc: BaseException) -> JSONResponse:
    """Map any exception to its JSON error response (logging the unexpected ones)."""
    if isinstance(exc, SubmitQueueError):
        for cls, status in _DOMAIN_STATUS:
            if isinstance(exc, cls):
                message = str(exc) or exc.code
                if status == 429:
                    return error_response(status, exc.code, message, headers={
                        "Retry-After": str(getattr(exc, "retry_after_s", RETRY_AFTER_S))})
                if status == 503:
                    message = f"{message}; try again" if str(exc) else TRY_AGAIN
                    after = getattr(exc, "retry_after_s", RETRY_AFTER_S)
                    return error_response(status, exc.code, message,
                                          headers={"Retry-After": str(after)})
                if status == 401 and getattr(exc, "bearer", False):
                    return error_response(status, exc.code, message,
                                          headers={"WWW-Authenticate": "Bearer"})
                return error_response(status, exc.code, message)
    if isinstance(exc, RequestValidationError):
        return error_response(422, "invalid_request", describe_validation(exc.errors()))
    if isinstance(exc, StarletteHTTPException):
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)
    for qcls, status, code in _QUEUE_STATUS:
        if isinstance(exc, qcls):
            return error_response(status, code, str(exc) or code)
    if isinstance(exc, QueueBusy):
        return error_response(503, "busy", f"{exc}; try again", headers=_RETRY)
    if isinstance(exc, QueueError) or classify(exc):
        log.warning("request failed on a transient error", exc_info=exc)
        return error_response(503, "unavailable", TRY_AGAIN, headers=_RETRY)
    log.error("unhandled error", exc_info=exc)
    return error_response(500, "internal_error", INTERNAL)


async def handle(_request: Request, exc: Exception) -> JSONResponse:
    return response_for(exc)


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(SubmitQueueError, handle)
    app.add_exception_handler(RequestValidationError, handle)
    app.add_exception_handler(StarletteHTTPException, handle)
