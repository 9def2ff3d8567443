"""What every controller shares: its dependencies, publishing, logs, terminal writes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from app.db.engine import Database
from app.db.repos import requests as request_repo
from app.domain.entities import LandRequest, RequestLog
from app.domain.errors import NotFound
from app.domain.messages import LOG, LogMsg, log_id
from app.domain.states import LogType, RequestState
from app.extensions.base import QueueExtensions
from app.queue import Broker, Outgoing


@dataclass
class Deps:
    db: Database
    broker: Broker
    extensions: Callable[[str], QueueExtensions]

    def now(self) -> int:
        return self.broker.clock()

    async def publish(self, topic: str, msg: BaseModel, *, partition_key: str,
                      message_id: str) -> None:
        await self.broker.publish(topic, msg.model_dump(mode="json"),
                                  partition_key=partition_key, message_id=message_id)

    async def publish_logs(self, entries: Sequence[RequestLog]) -> None:
        if entries:
            await self.broker.publish_many([
                Outgoing(LOG, LogMsg.of(e).model_dump(mode="json"), e.request_id, e.log_id)
                for e in entries
            ])


class StageController:
    """Base of the pipeline's controllers: each holds the shared dependencies."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps


def unique_id(base: str) -> str:
    """A message id for a hand-off that must not be deduplicated (no stable cause)."""
    return f"{base}@{uuid.uuid4().hex[:16]}"


def status_log(
    queue: str, sqid: str, status: str, *, now: int, version: int = 0, last_error: str = "",
    metadata: dict[str, Any] | None = None, occurrence: str | None = None,
) -> RequestLog:
    return RequestLog(
        queue=queue, request_id=sqid, timestamp_ms=now, type=LogType.STATUS, status=status,
        request_version=version, last_error=last_error, metadata=dict(metadata or {}),
        log_id=log_id(sqid, status, occurrence),
    )


def event_log(
    queue: str, sqid: str, event: str, *, now: int, occurrence: str,
    metadata: dict[str, Any] | None = None,
) -> RequestLog:
    return RequestLog(
        queue=queue, request_id=sqid, timestamp_ms=now, type=LogType.EVENT, event=event,
        metadata=dict(metadata or {}), log_id=log_id(sqid, event, occurrence),
    )


async def terminate_request(
    deps: Deps, *, queue: str, sqid: str, target: RequestState, last_error: str = "",
    metadata: dict[str, Any] | None = None,
) -> str:
    """The only writer of terminal request states.

    | Loaded request | Action | Returns |
    |---|---|---|
    | missing | raise ``NotFound`` | - |
    | already ``target`` | skip the write, re-publish the terminal log (repair) | ``repaired`` |
    | another terminal state | leave it | ``diverged`` |
    | otherwise | conditional write (v+1), then publish the terminal log | ``terminated`` |
    """
    assert target.terminal
    async with deps.db.read() as s:
        current = await request_repo.get(s, queue=queue, id=sqid)
    if current.state is target:
        await deps.publish_logs([_terminal_log(current, metadata, deps.now())])
        return "repaired"
    if current.state.terminal:
        return "diverged"
    new = replace(current, state=target, version=current.version + 1, last_error=last_error)
    async with deps.db.write() as s:
        await request_repo.update(s, old=current, new=new, now_ms=deps.now())
    await deps.publish_logs([_terminal_log(new, metadata, deps.now())])
    return "terminated"


def _terminal_log(req: LandRequest, metadata: dict[str, Any] | None, now: int) -> RequestLog:
    return status_log(req.queue, req.id, req.state.value, now=now, version=req.version,
                      last_error=req.last_error, metadata=metadata)


async def load_request(deps: Deps, queue: str, sqid: str) -> LandRequest | None:
    try:
        async with deps.db.read() as s:
            return await request_repo.get(s, queue=queue, id=sqid)
    except NotFound:
        return None
