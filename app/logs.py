"""Logging: structlog for our own events, stdlib loggers routed through the same renderer.

JSON lines when stderr is not a terminal, coloured console lines when it is.
``SQ_LOG_LEVEL`` sets the level; ``SQ_QUEUE_LOG_LEVEL`` sets the durable queue's own
(``submitqueue.queue``) level separately, since it is chatty by nature.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_EXTRA_SKIP = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}


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
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("submitqueue.queue").setLevel(queue_level.upper())
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
