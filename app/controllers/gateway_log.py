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
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from app.controllers.common import NoMetrics, PipelineMetrics
from app.db.engine import Database
from app.db.repos.request_log import persist_log
from app.domain.messages import LogMsg
from app.queue import Delivery


class GatewayLogController:
    def __init__(self, db: Database, metrics: PipelineMetrics | None = None) -> None:
        self.db = db
        self.metrics = metrics or NoMetrics()

    async def process(self, delivery: Delivery) -> None:
        entry = LogMsg.model_validate(delivery.payload).entry()
        self.metrics.log_folded(entry, await persist_log(self.db, entry))
