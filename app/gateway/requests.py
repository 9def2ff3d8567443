"""The gateway's reads of the request log and its projections, and its one write there
besides acceptance: a request asked to cancel (``cancelling``, then the ``cancel``
topic). HTTP lives in ``app/api/requests.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pydantic import BaseModel

from app.controllers.stages import partition_key
from app.db.engine import Database
from app.db.repos import request_log as repo
from app.domain.access import Principal, Scope
from app.domain.entities import RequestLog, RequestSummary
from app.domain.errors import Forbidden, ServiceUnavailable
from app.domain.messages import CANCEL, CancelRequestMsg, log_id
from app.domain.states import LogType, PublicStatus
from app.gateway.landing import LandRuntime

log = logging.getLogger("submitqueue.gateway")

_TERMINAL = frozenset(s.value for s in PublicStatus if s.terminal)


async def summary(db: Database, *, queue: str, sqid: str) -> RequestSummary:
    """The request's summary, or ``NotFound``."""
    async with db.read() as s:
        return await repo.get_summary(s, queue=queue, request_id=sqid)


async def history(db: Database, *, queue: str, sqid: str) -> list[RequestLog]:
    """Every status and event of the request, oldest first (``NotFound`` if unknown)."""
    async with db.read() as s:
        await repo.get_summary(s, queue=queue, request_id=sqid)
        return list(await repo.history(s, queue=queue, request_id=sqid))


async def page(db: Database, *, queue: str, limit: int, since_ms: int | None,
               until_ms: int | None, status: str | None, change_uri: str | None,
               after: tuple[int, str] | None) -> list[RequestSummary]:
    """Up to ``limit`` summaries, newest first, after the keyset position ``after``."""
    async with db.read() as s:
        return list(await repo.list_summaries(
            s, queue=queue, limit=limit, since_ms=since_ms, until_ms=until_ms,
            status=status, change_uri=change_uri, after=after))


async def counts(db: Database, queues: Sequence[str]) -> dict[str, dict[str, int]]:
    """Visible requests per queue and status."""
    async with db.read() as s:
        return await repo.counts_by_status(s, queues=list(queues))


async def cancel(runtime: LandRuntime, *, queue: str, sqid: str, reason: str,
                 caller: Principal | None = None) -> str:
    """Ask to cancel ``sqid`` on behalf of ``caller``: its status after the ask (a
    terminal one is left alone). ``None`` = a caller with ``cancel:any``.

    A caller without ``cancel:any`` may cancel only what it submitted (``Forbidden``
    naming the submitter otherwise). Records ``cancelling`` with the reason and the
    actor (log id stable per request), then publishes ``cancel`` (message id
    ``<sqid>/cancel``): a repeat writes and publishes nothing new."""
    found = await summary(runtime.db, queue=queue, sqid=sqid)
    actor = caller.actor if caller is not None else ""
    if caller is not None and caller.missing(Scope.CANCEL_ANY, queue) is not None and \
            found.submitted_by != caller.actor:
        who = found.submitted_by or "an unknown actor (it was submitted before tokens)"
        raise Forbidden(f"{sqid} was submitted by {who}; a token with the scope "
                        f"'cancel' cancels only its own requests ({caller.actor}'s), "
                        "cancelling another's needs 'cancel:any'")
    if found.status in _TERMINAL:
        return found.status
    cancelling = PublicStatus.CANCELLING.value
    metadata = {"reason": reason, "actor": actor} if actor else {"reason": reason}
    await repo.persist_log(runtime.db, RequestLog(
        queue=queue, request_id=sqid, timestamp_ms=runtime.broker.clock(),
        type=LogType.STATUS, status=cancelling, request_version=0,
        metadata=metadata, log_id=log_id(sqid, cancelling),
    ))
    msg = CancelRequestMsg(id=sqid, queue=queue, reason=reason, actor=actor)
    await publish(runtime, CANCEL, msg, message_id=f"{sqid}/cancel")
    return cancelling


async def publish(runtime: LandRuntime, topic: str, msg: BaseModel, *,
                  message_id: str) -> None:
    """Publish (partitioned as the stage registry says), or ``ServiceUnavailable`` (503:
    the client tries again)."""
    try:
        await runtime.broker.publish(topic, msg.model_dump(mode="json"),
                                     partition_key=partition_key(topic, msg),
                                     message_id=message_id)
    except Exception as exc:
        log.warning("publish failed", exc_info=exc,
                    extra={"topic": topic, "message_id": message_id})
        raise ServiceUnavailable(
            f"could not hand {message_id!r} to the {topic!r} topic") from exc
