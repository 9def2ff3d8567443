"""Logging: structlog for our own events, stdlib loggers routed through the same renderer.

- JSON lines when stderr is not a terminal, coloured console lines when it is.
- ``SQ_LOG_LEVEL`` sets the level; ``SQ_QUEUE_LOG_LEVEL`` sets the durable queue's own
  (``submitqueue.queue``) level separately, since it is chatty by nature.
- Ids bound with ``structlog.contextvars`` (the consumer framework binds ``topic``,
  ``group``, ``message_id``, ``partition_key``, ``attempt`` and the payload's
  ``queue`` / ``sqid`` / ``batch_id`` around every handler) appear on every line the
  unit of work writes, stdlib ``logging`` calls included.
- uvicorn's loggers (the access log included) go through the same handler, also when
  uvicorn configured its own.
- Secrets are never written: the value of any key that names one (``token``,
  ``secret``, ``password``, ``authorization``, ``api_key``, ``cookie``, ...) becomes
  ``[redacted]``, at any depth; in every string (the message, exception text) a
  ``Bearer <token>``, the password of a ``scheme://user:password@host`` URL and the
  value of a secret-named query parameter (``?token=``, ``access_token=``,
  ``api_key=``, ``secret=``, ``password=``, ``key=``, ``sig=``, ...: the access log's
  request line) are masked too.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

REDACTED = "[redacted]"
QUEUE_LOGGER = "submitqueue.queue"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")

_EXTRA_SKIP = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}
_SECRET_KEY = re.compile(
    r"token|secret|passw|pwd|authori[sz]ation|api[-_]?key|cookie|credential|private[-_]?key",
    re.IGNORECASE,
)
# Keys that contain a secret word but hold no secret.
_NOT_SECRET = frozenset({"token_count", "secret_env"})
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.\-]*://[^:/?#@\s]+:)[^@/\s]+(?=@)",
                           re.IGNORECASE)
_BEARER = re.compile(r"(?P<head>\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=:\-]+", re.IGNORECASE)
_QUERY_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.~%\-\[\]]+)=)[^&;#\s\"'<>]*")
# Query parameter names that hold credentials without a secret word in them.
_QUERY_SECRET = frozenset({"key", "sig", "signature", "auth", "code", "access_key"})


def _mask_query_value(match: re.Match[str]) -> str:
    name = match.group("name").lower()
    if name in _QUERY_SECRET or _is_secret_key(name):
        return match.group("head") + REDACTED
    return match.group(0)


def redact_text(text: str) -> str:
    """Mask credentials inside free text (URLs with a password, secret query values,
    bearer tokens)."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)
    text = _QUERY_PARAM.sub(_mask_query_value, text)
    return _BEARER.sub(lambda m: m.group("head") + REDACTED, text)


def _is_secret_key(key: object) -> bool:
    return isinstance(key, str) and key.lower() not in _NOT_SECRET and \
        bool(_SECRET_KEY.search(key))


def _redact_value(value: Any, depth: int = 0) -> Any:
    if depth > 6:
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: REDACTED if _is_secret_key(k) else _redact_value(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redact_value(v, depth + 1) for v in value)
    return value


def redact_secrets(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: drop secret values before anything is rendered."""
    for key in list(event):
        if key.startswith("_"):
            continue
        if _is_secret_key(key):
            event[key] = REDACTED
        else:
            event[key] = _redact_value(event[key])
    return event


def _stdlib_extras(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    record = event.get("_record")
    if isinstance(record, logging.LogRecord):
        for key, value in record.__dict__.items():
            if key not in _EXTRA_SKIP and not key.startswith("_"):
                event.setdefault(key, value)
    return event


def configure_logging(level: str = "INFO", queue_level: str = "WARNING", *,
                      json: bool | None = None) -> None:
    as_json = (not sys.stderr.isatty()) if json is None else json
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _stdlib_extras],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            redact_secrets,  # after format_exc_info: exception text is masked too
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # uvicorn's own logging config (``uvicorn --factory app.main:app_factory``) gives its
    # loggers handlers of their own that print unredacted: route them through ours.
    for name in UVICORN_LOGGERS:
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    root.setLevel(level.upper())
    logging.getLogger(QUEUE_LOGGER).setLevel(queue_level.upper())
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))
