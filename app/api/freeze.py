"""Freezing a merge queue (``app/domain/freeze.py``; docs/freeze.md): a frozen queue
accepts requests and (with ``allow_builds``) builds them, but lands nothing.

| Route | Auth | What |
|---|---|---|
| ``GET /api/v1/queues/{queue}/freeze`` | read | the freeze in effect (manual or a ``queues.yaml`` window) |
| ``POST /api/v1/queues/{queue}/freeze`` | admin | ``{"reason", "until"?, "allow_builds"?, "allow_hotfix"?}``; audited |
| ``POST /api/v1/queues/{queue}/unfreeze`` | admin | ``{"reason"?}``: ends a manual freeze (a window ends with its window); audited |

``until``: an ISO 8601 time with a zone (``2026-12-07T10:00:00Z``) or epoch
milliseconds; it must lie in the future (422 otherwise). Auth as the admin API
(``SQ_ADMIN_TOKEN`` or a token with ``admin``): 401 without a valid token, 403 without
the scope; a refused call writes nothing and is not audited.
"""  # noqa: E501 - the route table reads best unwrapped

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.api.auth import Admin, Reader
from app.api.deps import RuntimeDep, queue_config
from app.api.examples import ok
from app.api.schemas import ErrorOut, SafeText
from app.domain.freeze import format_time
from app.gateway import freeze as freezes
from app.views.freeze import FreezeView

MAX_UNTIL_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
router = APIRouter(prefix="/api/v1/queues/{queue}", tags=["freeze"], responses={
    code: {"model": ErrorOut} for code in (401, 403, 404, 409, 422)})


class FreezeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"reason": "release 4.2 branch cut", "until": "2026-12-07T10:00:00Z",
         "allow_builds": True},
        {"reason": "incident INC-231: trunk is red", "allow_builds": False},
    ]})
    reason: SafeText = Field(min_length=1, max_length=500,
                             description="why; shown on every page of the queue")
    until: int | str | None = Field(
        default=None, description="when it ends by itself: ISO 8601 with a zone, or epoch "
        "ms; omitted: until unfrozen")
    allow_builds: bool = Field(default=True, description="keep funding builds (false: no "
                               "new build starts; running ones finish)")
    allow_hotfix: bool = Field(default=False, description="let a batch of hotfix requests "
                               "land (priority hotfix)")

    @field_validator("reason")
    @classmethod
    def _reason(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("give a reason: it is shown on every page of the queue")
        return v.strip()

    @field_validator("until", mode="before")
    @classmethod
    def _until(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            if not 0 < v <= MAX_UNTIL_MS:
                raise ValueError(f"until {v} is not epoch milliseconds between 1970 and 9999")
            return v
        if v is None:
            return v
        if not isinstance(v, str):
            raise ValueError("until is an ISO 8601 time such as 2026-12-07T10:00:00Z or "
                             "epoch milliseconds")
        try:
            t = dt.datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"until {v!r} is not an ISO 8601 time such as "
                             "2026-12-07T10:00:00Z") from None
        if t.tzinfo is None:
            raise ValueError(f"until {v!r} has no time zone; add one (Z for UTC, or +01:00)")
        ms = int(t.timestamp() * 1000)
        if not 0 < ms <= MAX_UNTIL_MS:
            raise ValueError(f"until {v!r} is not between 1970 and 9999")
        return ms


class UnfreezeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"reason": "release cut done"}]})
    reason: SafeText = Field(default="", max_length=500)


class FreezeOut(BaseModel):
    queue: str
    freeze: FreezeView
    changed: bool = Field(description="false: the call found nothing to change")
    audit_id: int | None = None


def _windows(rt: RuntimeDep, queue: str) -> tuple[Any, ...]:
    return tuple(queue_config(rt, queue).freeze_windows)


@router.get("/freeze", response_model=FreezeOut, summary="The queue's freeze in effect",
            responses=ok(200, "FREEZE_STATE"))
async def get_freeze(rt: RuntimeDep, queue: str, _: Reader) -> FreezeOut:
    """Whether ``queue`` is frozen now, why, since when, until when and by whom
    (``source``: ``manual``, or ``window`` for a ``freeze_windows`` entry)."""
    windows = _windows(rt, queue)
    found = await freezes.freeze_of(rt.db, queue=queue, now_ms=rt.broker.clock(),
                                    windows=windows)
    return FreezeOut(queue=queue, freeze=FreezeView.of(found), changed=False)


@router.post("/freeze", response_model=FreezeOut, summary="Freeze a queue: land nothing",
             responses=ok(200, "FREEZE"))
async def post_freeze(rt: RuntimeDep, queue: str, caller: Admin,
                      body: FreezeBody) -> FreezeOut:
    """Stop ``queue`` landing: requests are still accepted, validated and (unless
    ``allow_builds`` is false) built; a batch ready to land waits, and lands once the
    freeze ends (``unfreeze``, ``until``) with no restart. Freezing a frozen queue
    replaces its reason, ``until`` and options. Takes effect in every process;
    audited."""
    windows = _windows(rt, queue)
    now = rt.broker.clock()
    until = body.until if isinstance(body.until, int) else 0
    if body.until is not None and until <= now:
        raise RequestValidationError([{
            "loc": ("body", "until"), "type": "value_error", "input": body.until,
            "msg": f"until {format_time(until)} is not in the future (now is "
                   f"{format_time(now)}); give a later time, or none to freeze until "
                   "unfrozen"}])
    change = await freezes.freeze(
        rt.db, queue=queue, actor=caller.actor, now_ms=now, reason=body.reason,
        until_ms=until, allow_builds=body.allow_builds, allow_hotfix=body.allow_hotfix,
        windows=windows)
    return FreezeOut(queue=queue, freeze=FreezeView.of(change.freeze), changed=True,
                     audit_id=change.audit_id)


@router.post("/unfreeze", response_model=FreezeOut, summary="End a queue's manual freeze",
             responses=ok(200, "UNFREEZE"))
async def post_unfreeze(rt: RuntimeDep, queue: str, caller: Admin,
                        body: UnfreezeBody | None = None) -> FreezeOut:
    """End the manual freeze of ``queue``: the batches waiting to land land within
    ``SQ_FREEZE_RECHECK_MS``. ``changed: false`` when it was not frozen by hand; a
    ``freeze_windows`` window (``freeze.source: window``) is not ended by this call.
    Audited."""
    windows = _windows(rt, queue)
    change = await freezes.unfreeze(rt.deps, queue=queue, actor=caller.actor,
                                    now_ms=rt.broker.clock(),
                                    reason=(body or UnfreezeBody()).reason, windows=windows)
    return FreezeOut(queue=queue, freeze=FreezeView.of(change.freeze),
                     changed=change.changed, audit_id=change.audit_id)
