"""Freezing and unfreezing a merge queue (``POST /api/v1/queues/{queue}/freeze`` and
``/unfreeze``, ``app/api/freeze.py``): the conditional write of the queue's manual
freeze (``app/db/repos/freezes.py``) and its admin audit entry, in one transaction.

| Loaded manual freeze | Call | Write | ``changed`` |
|---|---|---|---|
| none (never frozen) | freeze | insert version 1, frozen (a concurrent first freeze makes this one ``VersionMismatch``: 409, try again) | true |
| unfrozen, or frozen with ``until`` passed | freeze | conditional update (v+1), frozen since now | true |
| frozen | freeze | conditional update (v+1): the new reason, ``until`` and options; ``since`` and ``by`` kept | true |
| frozen (``until`` not passed) | unfreeze | conditional update (v+1), unfrozen | true |
| none, unfrozen, or ``until`` passed | unfreeze | nothing (a window freeze of ``queues.yaml`` is not ended by this: it ends with its window) | false |

Either call is audited (action ``freeze`` / ``unfreeze``, topic ``queue:<name>``) with
the freeze after the call, also when nothing changed. An unfreeze that ends the
freeze wakes the queue's ``speculate`` run (``app/controllers/freeze.py``: builds held
back by ``allow_builds: false`` start); the merges it held land at their next recheck.
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

from dataclasses import dataclass, replace

from app.controllers.common import Deps
from app.controllers.freeze import wake
from app.db.engine import Database
from app.db.repos import audit as audit_repo
from app.db.repos import freezes as freeze_repo
from app.domain.freeze import Freeze, FreezeWindowConfig, ManualFreeze, current


@dataclass(frozen=True, slots=True)
class FreezeChange:
    freeze: Freeze | None  # in effect after the call (a window's too)
    manual: ManualFreeze
    changed: bool
    audit_id: int


def _audit_result(change_freeze: Freeze | None, changed: bool) -> dict[str, object]:
    return {"changed": changed,
            "freeze": change_freeze.as_dict() if change_freeze else {"frozen": False}}


async def freeze(db: Database, *, queue: str, actor: str, now_ms: int, reason: str,
                 until_ms: int, allow_builds: bool, allow_hotfix: bool,
                 windows: tuple[FreezeWindowConfig, ...]) -> FreezeChange:
    actor = actor[:100]  # the column's width (a token's label is at most 100)
    async with db.write() as s:
        old = await freeze_repo.get(s, queue=queue)
        base = old or ManualFreeze(queue=queue)
        still = base.active(now_ms)
        new = replace(base, frozen=True, reason=reason, until_ms=until_ms,
                      allow_builds=allow_builds, allow_hotfix=allow_hotfix,
                      since_ms=base.since_ms if still else now_ms,
                      by=base.by if still else actor, version=base.version + 1,
                      updated_at_ms=now_ms, updated_by=actor)
        await freeze_repo.save(s, old=old, new=new)
        after = current(queue, new, windows, now_ms)
        audit_id = await audit_repo.append(
            s, at_ms=now_ms, actor=actor, action="freeze", topic=f"queue:{queue}",
            reason=reason, result=_audit_result(after, True))
    return FreezeChange(after, new, True, audit_id)


async def unfreeze(deps: Deps, *, queue: str, actor: str, now_ms: int, reason: str,
                   windows: tuple[FreezeWindowConfig, ...]) -> FreezeChange:
    actor = actor[:100]
    async with deps.db.write() as s:
        old = await freeze_repo.get(s, queue=queue)
        base = old or ManualFreeze(queue=queue)
        changed = base.active(now_ms)
        new = base
        if changed:
            new = replace(base, frozen=False, version=base.version + 1,
                          updated_at_ms=now_ms, updated_by=actor)
            await freeze_repo.save(s, old=old, new=new)
        after = current(queue, new, windows, now_ms)
        audit_id = await audit_repo.append(
            s, at_ms=now_ms, actor=actor, action="unfreeze", topic=f"queue:{queue}",
            reason=reason, result=_audit_result(after, changed))
    if changed and after is None:
        await wake(deps, queue)  # builds a freeze without allow_builds held back
    return FreezeChange(after, new, changed, audit_id)


async def freeze_of(db: Database, *, queue: str, now_ms: int,
                    windows: tuple[FreezeWindowConfig, ...]) -> Freeze | None:
    async with db.read() as s:
        manual = await freeze_repo.get(s, queue=queue)
    return current(queue, manual, windows, now_ms)
