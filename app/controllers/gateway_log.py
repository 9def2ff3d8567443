"""``log`` (consumer group ``gateway-log``): fold a request-log entry into the
gateway's history and summary through the one materializer (``persist_log``).

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| payload not a valid ``LogMsg`` | invalid | pydantic's error propagates (DLQ) |
| no ``log_id``, unknown status, unnamed event | invalid | raise ``ValidationError`` (DLQ) |
| summary missing | invalid | raise ``NotFound`` (DLQ); nothing is stored |
| summary the entry wins (``log_wins``) | before | append row + CAS summary, one transaction (a terminal status also settles the request's change claims in it: released on ``error``/``cancelled``, kept with the commits on ``landed``) |
| same, another writer changed it first | before | reload, classify again (10x; then retry) |
| history row already stored | at | skip the insert; fold again (repairs a lost write); a terminal status settles the claims again (idempotent) |
| summary the entry does not win | superseded | keep it; the row stays in history; ack |

"Does not win": an event, an older status, ``accepted`` after progress, or a
non-terminal status after a versioned terminal one (``app/domain/materializer.py``).
The CAS writes status, request version, status timestamp, last error and
metadata with ``version + 1``. Each committed fold is reported to the metrics
observer (``log_folded``), which times a request's first terminal status.

**Folded together.** Entries that arrive while a fold is being written wait for it and
are then folded in one transaction (``persist_logs``, in arrival order, at most
:data:`MAX_FOLD` at a time): the consumer runs several handlers at once, so under load
a dozen entries cost one transaction instead of a dozen, and an idle queue waits for
nothing. Each delivery still gets its own outcome: when the shared transaction fails
(one malformed entry, a missing summary, a lost race, a busy database) it is rolled
back whole and every entry of it is folded again on its own, so only the entry that
fails raises, for its own delivery (retry or DLQ as in the table).
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import asyncio

from app.controllers.common import NoMetrics, PipelineMetrics
from app.db.engine import Database
from app.db.repos.request_log import persist_log, persist_logs
from app.domain.entities import RequestLog, RequestSummary
from app.domain.messages import LogMsg
from app.queue import Delivery, Retryable

MAX_FOLD = 64
Waiter = asyncio.Future[RequestSummary | None]


class GatewayLogController:
    def __init__(self, db: Database, metrics: PipelineMetrics | None = None) -> None:
        self.db = db
        self.metrics = metrics or NoMetrics()
        self._pending: list[tuple[RequestLog, Waiter]] = []
        self._folder: asyncio.Task[None] | None = None

    async def process(self, delivery: Delivery) -> None:
        entry = LogMsg.model_validate(delivery.payload).entry()
        waiter: Waiter = asyncio.get_running_loop().create_future()
        # read by the handler, or by nobody if it was cancelled (then not worth a warning)
        waiter.add_done_callback(lambda w: w.cancelled() or w.exception())
        self._pending.append((entry, waiter))
        if self._folder is None or self._folder.done():
            self._folder = asyncio.create_task(self._fold_pending())
        # a cancelled handler (lost lease, shutdown) leaves the fold running: it is
        # idempotent, and the message's next delivery folds the entry again anyway
        before = await asyncio.shield(waiter)
        self.metrics.log_folded(entry, before)

    async def _fold_pending(self) -> None:
        while self._pending:
            batch = self._pending[:MAX_FOLD]
            del self._pending[:MAX_FOLD]
            try:
                await self._fold(batch)
            finally:  # interrupted (cancelled): those still waiting retry their delivery
                for _, waiter in batch:
                    if not waiter.done():
                        waiter.set_exception(Retryable("the fold was interrupted"))

    async def _fold(self, batch: list[tuple[RequestLog, Waiter]]) -> None:
        if len(batch) > 1:
            try:
                folded = await persist_logs(self.db, [entry for entry, _ in batch])
            except Exception:  # rolled back whole: each entry is folded again on its own
                pass
            else:
                for (_, waiter), before in zip(batch, folded, strict=True):
                    if not waiter.done():
                        waiter.set_result(before)
                return
        for entry, waiter in batch:
            try:
                before = await persist_log(self.db, entry)
            except Exception as exc:  # this entry's own outcome, for its own delivery
                if not waiter.done():
                    waiter.set_exception(exc)
            else:
                if not waiter.done():
                    waiter.set_result(before)
