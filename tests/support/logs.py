"""Capturing the server's logs as it configures them (JSON lines or console text)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from typing import Any

import structlog

from app.logs import configure_logging


class Captured:
    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.text.splitlines() if line.strip()]


@contextmanager
def captured_logs(level: str = "INFO", queue_level: str = "WARNING", *,
                  json_lines: bool = True) -> Iterator[Captured]:
    """Configure logging as the server does, into a string; restore everything after."""
    root = logging.getLogger()
    queue = logging.getLogger("submitqueue.queue")
    saved = (list(root.handlers), root.level, queue.level)
    stream = io.StringIO()
    with redirect_stderr(stream):  # the handler writes to sys.stderr as it is now
        configure_logging(level, queue_level, json=json_lines)
    try:
        yield Captured(stream)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        queue.setLevel(saved[2])
        structlog.contextvars.clear_contextvars()
        structlog.reset_defaults()
