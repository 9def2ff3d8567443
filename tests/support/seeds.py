"""Values a state-table case seeds or expects: change URIs, ids, paths, path entries
and request-log entries of the demo queue (re-exported by ``tests.support.controllers``)."""

from __future__ import annotations

from typing import Any

from app.domain.entities import PathEntry, RequestLog, SpeculationPath
from app.domain.messages import log_id
from app.domain.states import Assumption, LogType, PathStatus
from tests.support.doubles import NOW_MS, QUEUE


def change_uri(n: int, *, fake: str = "", files: str = "") -> str:
    """A canonical fake change URI for request ``n`` (``fake``: an ``sq-fake`` token,
    ``files``: its ``sq-files``)."""
    markers = "&".join(m for m in (f"sq-fake={fake}" if fake else "",
                                   f"sq-files={files}" if files else "") if m)
    base = f"git://demo.example.com/demo/refs%2Fheads%2Fr{n}/{n:040x}"
    return f"{base}?{markers}" if markers else base


def batch_id(n: int) -> str:
    return f"{QUEUE}/batch/{n}"


def path(n: int, *deps: tuple[int, Assumption]) -> SpeculationPath:
    """A path of batch ``n``: one assumption per dependency (``(dep number, assumption)``)."""
    return SpeculationPath(head=batch_id(n),
                           dependencies=tuple((batch_id(d), a) for d, a in deps))


def entry(p: SpeculationPath, status: PathStatus, attempt: int = 1) -> PathEntry:
    return PathEntry(path=p, status=status, attempt=attempt, created_at_ms=NOW_MS,
                     updated_at_ms=NOW_MS)


def status_entry(n: int, status: str, *, at_ms: int = NOW_MS, request_version: int = 0,
                 last_error: str = "", metadata: dict[str, Any] | None = None,
                 occurrence: str | None = None) -> RequestLog:
    """A status entry of request ``n``'s log, with its stable log id."""
    sqid = f"{QUEUE}/{n}"
    return RequestLog(queue=QUEUE, request_id=sqid, timestamp_ms=at_ms, type=LogType.STATUS,
                      status=status, request_version=request_version, last_error=last_error,
                      metadata=dict(metadata or {}), log_id=log_id(sqid, status, occurrence))


def event_entry(n: int, event: str, *, occurrence: str, at_ms: int = NOW_MS) -> RequestLog:
    sqid = f"{QUEUE}/{n}"
    return RequestLog(queue=QUEUE, request_id=sqid, timestamp_ms=at_ms, type=LogType.EVENT,
                      event=event, log_id=log_id(sqid, event, occurrence))
