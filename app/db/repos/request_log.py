"""The request log and its projections (gateway-owned): ``request_summaries``,
``request_log`` and ``change_uri_requests`` (and, through ``claims``, the change
claims a terminal status settles).

Only the gateway reads and writes these tables. ``persist_log`` is the one
materializer: every status or event — written directly by the gateway
(``accepted``, ``cancelling``) or arriving on the ``log`` topic — goes through it,
so redelivered and reordered entries fold into the same summary
(see ``app/domain/materializer.py`` for the precedence rules).

A summary still ``accepting`` (its ``start`` publish failed or has not happened
yet) is invisible: ``get_summary`` raises ``NotFound`` and the lists skip it.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.bound import where_bound
from app.db.dialect import insert_ignore
from app.db.engine import Database
from app.db.locking import conditional_update
from app.db.repos import claims
from app.db.tables import change_uri_requests as uri_t
from app.db.tables import request_log as log_t
from app.db.tables import request_summaries as sum_t
from app.domain.entities import RequestLog, RequestSummary
from app.domain.errors import AlreadyExists, NotFound, ValidationError, VersionMismatch
from app.domain.materializer import StatusPoint, log_wins
from app.domain.states import LogType, Priority, PublicStatus

ACCEPTING = PublicStatus.ACCEPTING.value
PERSIST_ATTEMPTS = 10
_VISIBLE_STATUSES = frozenset(s.value for s in PublicStatus if s is not PublicStatus.ACCEPTING)
_TERMINAL_STATUSES = frozenset(s.value for s in PublicStatus if s.terminal)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _summary_from_row(r: Any) -> RequestSummary:
    return RequestSummary(
        queue=r.queue, request_id=r.request_id,
        change_uris=tuple(json.loads(r.change_uris_json)), received_at_ms=r.received_at_ms,
        status=r.status, request_version=r.request_version,
        status_timestamp_ms=r.status_timestamp_ms, version=r.version,
        last_error=r.last_error or "", metadata=json.loads(r.metadata_json or "{}"),
        submitted_by=r.submitted_by or "",
        priority=Priority(r.priority or Priority.NORMAL),
    )


def _log_from_row(r: Any) -> RequestLog:
    return RequestLog(
        queue=r.queue, request_id=r.request_id, timestamp_ms=r.timestamp_ms,
        type=LogType(r.type), status=r.status or "", event=r.event or "",
        request_version=r.request_version, last_error=r.last_error or "",
        metadata=json.loads(r.metadata_json or "{}"), log_id=r.log_id,
    )


# --- summaries ------------------------------------------------------------------


async def create_summary(
    session: AsyncSession, *, queue: str, request_id: str, change_uris: Sequence[str],
    received_at_ms: int, metadata: dict[str, Any] | None = None, submitted_by: str = "",
    priority: Priority = Priority.NORMAL,
) -> RequestSummary:
    """Record a receipt: summary ``accepting`` (version 1) and one mapping per change URI.
    ``metadata`` is the hidden receipt's own (the land keeps its strategy there, so a
    receipt orphaned before its ``start`` was published can be handed on later); the
    first visible status replaces it."""
    summary = RequestSummary(
        queue=queue, request_id=request_id, change_uris=tuple(change_uris),
        received_at_ms=received_at_ms, status=ACCEPTING, request_version=0,
        status_timestamp_ms=received_at_ms, version=1, metadata=dict(metadata or {}),
        submitted_by=submitted_by, priority=priority,
    )
    try:
        await session.execute(sa.insert(sum_t).values(
            queue=queue, request_id=request_id, change_uris_json=_dumps(list(change_uris)),
            received_at_ms=received_at_ms, status=ACCEPTING, request_version=0,
            status_timestamp_ms=received_at_ms, version=1, last_error="",
            metadata_json=_dumps(summary.metadata), submitted_by=submitted_by,
            priority=priority.value,
        ))
    except IntegrityError as exc:
        raise AlreadyExists(f"request {request_id!r} already exists in queue {queue!r}") from exc
    if change_uris:
        await session.execute(insert_ignore(session, uri_t), [
            {"queue": queue, "change_uri": uri, "request_id": request_id,
             "received_at_ms": received_at_ms}
            for uri in change_uris
        ])
    return summary


# The hot reads, built once (``app/db/bound.py``).
_SUMMARY = where_bound(sa.select(sum_t), sum_t, "queue", "request_id")
_SUMMARIES = where_bound(sa.select(sum_t), sum_t, "queue", within="request_id")


async def find_summary(
    session: AsyncSession, *, queue: str, request_id: str
) -> RequestSummary | None:
    """The stored summary, ``accepting`` included (the materializer needs it)."""
    row = (await session.execute(_SUMMARY, {"queue": queue, "request_id": request_id})).first()
    return _summary_from_row(row) if row is not None else None


async def get_summary(session: AsyncSession, *, queue: str, request_id: str) -> RequestSummary:
    """The visible summary; ``NotFound`` if missing or still ``accepting``."""
    summary = await find_summary(session, queue=queue, request_id=request_id)
    if summary is None or summary.status == ACCEPTING:
        raise NotFound(f"request {request_id!r} does not exist in queue {queue!r}")
    return summary


async def list_summaries(
    session: AsyncSession, *, queue: str, limit: int, since_ms: int | None = None,
    until_ms: int | None = None, status: str | None = None, change_uri: str | None = None,
    after: tuple[int, str] | None = None,
) -> list[RequestSummary]:
    """Visible summaries of ``queue``, newest first (``received_at_ms DESC, request_id
    DESC``), received in ``[since_ms, until_ms)``; ``after`` is the keyset position of
    the last row of the previous page. Ask ``limit + 1`` to learn if a page follows."""
    conditions: list[sa.ColumnElement[bool]] = [
        sum_t.c.queue == queue, sum_t.c.status != ACCEPTING,
    ]
    if status is not None:
        conditions.append(sum_t.c.status == status)
    if since_ms is not None:
        conditions.append(sum_t.c.received_at_ms >= since_ms)
    if until_ms is not None:
        conditions.append(sum_t.c.received_at_ms < until_ms)
    if change_uri is not None:
        conditions.append(sum_t.c.request_id.in_(
            sa.select(uri_t.c.request_id)
            .where(uri_t.c.queue == queue, uri_t.c.change_uri == change_uri)
            .scalar_subquery()
        ))
    if after is not None:
        ts, rid = after
        conditions.append(sa.or_(
            sum_t.c.received_at_ms < ts,
            sa.and_(sum_t.c.received_at_ms == ts, sum_t.c.request_id < rid),
        ))
    stmt = (
        sa.select(sum_t).where(*conditions)
        .order_by(sum_t.c.received_at_ms.desc(), sum_t.c.request_id.desc())
        .limit(limit)
    )
    return [_summary_from_row(r) for r in (await session.execute(stmt)).all()]


async def summaries_by_change_uri(
    session: AsyncSession, *, queue: str, change_uri: str, limit: int = 101
) -> list[RequestSummary]:
    """Visible requests that carried ``change_uri``, newest first."""
    return await list_summaries(session, queue=queue, limit=limit, change_uri=change_uri)


async def summaries_in(session: AsyncSession, *, queue: str, statuses: Collection[str],
                       limit: int = 1000) -> list[RequestSummary]:
    """The summaries of ``queue`` whose status is one of ``statuses``, oldest first (at
    most ``limit``)."""
    stmt = (sa.select(sum_t).where(sum_t.c.queue == queue, sum_t.c.status.in_(statuses))
            .order_by(sum_t.c.received_at_ms, sum_t.c.request_id).limit(limit))
    return [_summary_from_row(r) for r in (await session.execute(stmt)).all()]


async def counts_by_status(
    session: AsyncSession, *, queues: Collection[str] | None = None
) -> dict[str, dict[str, int]]:
    """``{queue: {status: n}}`` of visible summaries (queues without any are absent)."""
    stmt = (
        sa.select(sum_t.c.queue, sum_t.c.status, sa.func.count())
        .where(sum_t.c.status != ACCEPTING)
        .group_by(sum_t.c.queue, sum_t.c.status)
    )
    if queues is not None:
        stmt = stmt.where(sum_t.c.queue.in_(list(queues)))
    out: dict[str, dict[str, int]] = {}
    for queue, status, n in (await session.execute(stmt)).all():
        out.setdefault(queue, {})[status] = int(n)
    return out


async def actor_usage(
    session: AsyncSession, *, queue: str, actor: str, since_ms: int
) -> tuple[int, int, int | None]:
    """For the quotas: ``(in_flight, received_since, oldest_since_ms)`` of ``actor``'s
    requests in ``queue`` (hidden receipts count: they are lands on their way in)."""
    mine = [sum_t.c.queue == queue, sum_t.c.submitted_by == actor]
    in_flight = (await session.execute(
        sa.select(sa.func.count()).where(*mine, sum_t.c.status.not_in(_TERMINAL_STATUSES))
    )).scalar_one()
    recent, oldest = (await session.execute(
        sa.select(sa.func.count(), sa.func.min(sum_t.c.received_at_ms))
        .where(*mine, sum_t.c.received_at_ms >= since_ms)
    )).one()
    return int(in_flight), int(recent), None if oldest is None else int(oldest)


# --- the log ----------------------------------------------------------------------


async def append_log(session: AsyncSession, *, entry: RequestLog) -> bool:
    """Store one history row once per ``(queue, request_id, log_id)``; True if inserted."""
    result = await session.execute(insert_ignore(session, log_t).values(**_log_row(entry)))
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def history(session: AsyncSession, *, queue: str, request_id: str) -> list[RequestLog]:
    """Every stored entry of a request, oldest first (``timestamp_ms``, then arrival)."""
    stmt = (
        sa.select(log_t)
        .where(log_t.c.queue == queue, log_t.c.request_id == request_id)
        .order_by(log_t.c.timestamp_ms, log_t.c.id)
    )
    return [_log_from_row(r) for r in (await session.execute(stmt)).all()]


#: summary metadata kept through every status: how GitHub asked (``origin``: label or
#: comment; the resync cancels a label's request when the label is gone)
STICKY = ("origin",)


async def update_summary_status(
    session: AsyncSession, *, summary: RequestSummary, entry: RequestLog
) -> RequestSummary:
    """Conditionally write ``entry``'s status onto ``summary`` (``folded_summary``,
    version + 1)."""
    new = folded_summary(summary, entry)
    await write_summary(session, old_version=summary.version, new=new)
    return new


def folded_summary(summary: RequestSummary, entry: RequestLog) -> RequestSummary:
    """``summary`` with ``entry``'s status (version + 1). The entry's metadata replaces
    the summary's, except that a repeat of the same status at the same request version
    (a repair) keeps the keys it does not carry, so a landed request's ``commits``
    survive a bare re-publication of ``landed``; and the keys of ``STICKY`` (set at
    acceptance, about the request rather than a status) always stay."""
    metadata = {k: summary.metadata[k] for k in STICKY if k in summary.metadata}
    metadata.update(entry.metadata)
    if (entry.status, entry.request_version) == (summary.status, summary.request_version):
        metadata = {**summary.metadata, **metadata}
    return RequestSummary(
        queue=summary.queue, request_id=summary.request_id, change_uris=summary.change_uris,
        received_at_ms=summary.received_at_ms, status=entry.status,
        request_version=entry.request_version, status_timestamp_ms=entry.timestamp_ms,
        version=summary.version + 1, last_error=entry.last_error, metadata=metadata,
        submitted_by=summary.submitted_by,
    )


async def write_summary(session: AsyncSession, *, old_version: int,
                         new: RequestSummary) -> None:
    await conditional_update(
        session, sum_t,
        key={"queue": new.queue, "request_id": new.request_id},
        old_version=old_version, new_version=new.version,
        values={
            "status": new.status, "request_version": new.request_version,
            "status_timestamp_ms": new.status_timestamp_ms, "last_error": new.last_error,
            "metadata_json": _dumps(new.metadata),
        },
    )


def check_entry(entry: RequestLog) -> None:
    """Reject an entry that could not be folded sensibly (``ValidationError``)."""
    if not entry.log_id:
        raise ValidationError("a request log entry needs a log_id (its idempotency key)")
    if entry.type is LogType.STATUS and entry.status not in _VISIBLE_STATUSES:
        raise ValidationError(
            f"status entry {entry.log_id!r} has status {entry.status!r}; expected one of "
            f"{sorted(_VISIBLE_STATUSES)}"
        )
    if entry.type is LogType.EVENT and not entry.event:
        raise ValidationError(f"event entry {entry.log_id!r} names no event")


def entry_wins(entry: RequestLog, summary: RequestSummary) -> bool:
    return log_wins(
        entry.type,
        StatusPoint(entry.status, entry.request_version, entry.timestamp_ms),
        StatusPoint(summary.status, summary.request_version, summary.status_timestamp_ms),
    )


async def persist_log(db: Database, entry: RequestLog) -> RequestSummary | None:
    """The materializer: append ``entry`` to the history (once per log id) and fold it
    into the summary if it wins; a lost race reloads and classifies again.

    Each attempt is one transaction (append + fold + claims), so history, summary and
    change claims never disagree: a terminal status entry (winning, or a redelivery)
    settles the request's change claims (``claims.settle``: ``error``/``cancelled``
    release them, ``landed`` keeps them with the landed commits). A redelivered entry
    is not stored twice but is folded again, which repairs a summary whose write was
    lost. Raises ``NotFound`` when the request has
    no summary (not retryable), ``ValidationError`` for a malformed entry and
    ``VersionMismatch`` (retryable) if every attempt lost its race.

    Returns the summary as it was before the fold when the entry won (its write is
    committed), else None — so an observer can tell a status transition from a no-op.
    """
    check_entry(entry)
    for attempt in range(1, PERSIST_ATTEMPTS + 1):
        try:
            async with db.write() as session:
                return (await _fold(session, [entry]))[0]
        except VersionMismatch:
            if attempt == PERSIST_ATTEMPTS:
                raise
            await asyncio.sleep(random.uniform(0, 0.002 * attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def persist_logs(db: Database, entries: Sequence[RequestLog]
                       ) -> list[RequestSummary | None]:
    """``persist_log`` for several entries in one transaction, in order (an entry of a
    request sees the fold of an earlier one of the same request). All or nothing: the
    first entry that raises (malformed, no summary, a lost race) rolls back the whole
    transaction and its error propagates; the caller then persists each on its own."""
    for entry in entries:
        check_entry(entry)
    async with db.write() as session:
        return await _fold(session, entries)


async def _fold(session: AsyncSession, entries: Sequence[RequestLog]
                ) -> list[RequestSummary | None]:
    """Append ``entries`` and fold them, in order, into their summaries in ``session``:
    for each, the summary as it was before it when it won, else None. One statement
    appends them all and one reads their summaries; each summary is then written once,
    conditional on the version read (its version grows by one per winning entry), and
    each terminal entry settles its request's claims with the summary as folded then."""
    await _append_logs(session, entries)
    stored = await summaries_of(session, {(e.queue, e.request_id) for e in entries})
    current = dict(stored)
    out: list[RequestSummary | None] = []
    settled: list[RequestSummary] = []
    for entry in entries:
        summary = current.get((entry.queue, entry.request_id))
        if summary is None:
            raise NotFound(f"request {entry.request_id!r} does not exist in queue "
                           f"{entry.queue!r}")
        won = entry_wins(entry, summary)
        if won:
            current[(entry.queue, entry.request_id)] = folded_summary(summary, entry)
        out.append(summary if won else None)
        if entry.type is LogType.STATUS and entry.status in _TERMINAL_STATUSES:
            settled.append(current[(entry.queue, entry.request_id)])
    for key, new in current.items():
        if new is not stored[key]:
            await write_summary(session, old_version=stored[key].version, new=new)
    for summary in settled:
        await claims.settle(session, summary=summary)
    return out


async def _append_logs(session: AsyncSession, entries: Sequence[RequestLog]) -> None:
    """Store the history rows once per ``(queue, request_id, log_id)``, in order."""
    await session.execute(insert_ignore(session, log_t).values([_log_row(e) for e in entries]))


def _log_row(entry: RequestLog) -> dict[str, Any]:
    return {"queue": entry.queue, "request_id": entry.request_id, "log_id": entry.log_id,
            "timestamp_ms": entry.timestamp_ms, "type": entry.type.value,
            "status": entry.status, "event": entry.event,
            "request_version": entry.request_version, "last_error": entry.last_error,
            "metadata_json": _dumps(entry.metadata)}


async def summaries_of(session: AsyncSession, keys: set[tuple[str, str]]
                     ) -> dict[tuple[str, str], RequestSummary]:
    """The stored summaries of ``keys`` (``(queue, request_id)``), one statement per queue."""
    out: dict[tuple[str, str], RequestSummary] = {}
    for queue in sorted({q for q, _ in keys}):
        ids = sorted(r for q, r in keys if q == queue)
        rows = (await session.execute(_SUMMARIES, {"queue": queue, "request_id": ids})).all()
        for row in rows:
            summary = _summary_from_row(row)
            out[(summary.queue, summary.request_id)] = summary
    return out
