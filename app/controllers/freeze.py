"""The freeze in effect for a merge queue, as the stages see it (the rules:
``app/domain/freeze.py``; the writes: ``app/gateway/freeze.py``).

Read fresh from the database on every call (one primary-key read, no cache), so a
freeze or an unfreeze written by any process holds in every process from its commit
on; the queue's ``freeze_windows`` come from ``Deps.freeze_windows`` (``queues.yaml``)
and are computed against the clock, so a window starts and ends with no job and no
write.

Who asks, and what it does with the answer:

| Stage | Frozen (and not a batch of hotfixes under ``allow_hotfix``) | Not frozen |
|---|---|---|
| ``merge`` (``app/controllers/merge.py``) | hold the message (no attempt spent, no ``landing`` log, nothing pushed) until the freeze's end or the next recheck, whichever is first | land |
| ``speculate`` (``app/controllers/speculate.py``) with ``allow_builds`` false | fund no new build (the plan's new pending paths are dropped; running builds finish, their results are folded in) | plan as usual |
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

from app.controllers.common import Deps, unique_id
from app.db.repos import batches as batch_repo
from app.db.repos import freezes as freeze_repo
from app.domain.freeze import Freeze, ManualFreeze, current
from app.domain.messages import SPECULATE, EntityMsg
from app.domain.states import BatchState

ACTIVE = (BatchState.CREATED, BatchState.SPECULATING, BatchState.MERGING, BatchState.CANCELLING)

RECHECK_MS = 2000  # a held merge looks again at least this often (an unfreeze, a new until)


async def manual_freeze(deps: Deps, queue: str) -> ManualFreeze | None:
    async with deps.db.read() as s:
        return await freeze_repo.get(s, queue=queue)


async def freeze_of(deps: Deps, queue: str, *, now_ms: int | None = None) -> Freeze | None:
    """The freeze of ``queue`` in effect now (manual, else a window), or None."""
    now = deps.now() if now_ms is None else now_ms
    manual = await manual_freeze(deps, queue)
    return current(queue, manual, tuple(deps.freeze_windows.get(queue, ())), now)


def hold_ms(freeze: Freeze, now_ms: int, recheck_ms: int = RECHECK_MS) -> int:
    """How long a held merge waits before it looks again: until the freeze ends, at
    most ``recheck_ms`` (an unfreeze is seen within it)."""
    left = freeze.remaining_ms(now_ms)
    return max(1, min(recheck_ms, left if left is not None else recheck_ms))


async def wake(deps: Deps, queue: str, *, message_id: str | None = None) -> bool:
    """A ``speculate`` wake-up for ``queue`` once a freeze ended (its oldest active
    batch; by default a unique id: each unfreeze is its own cause), so builds a freeze
    without ``allow_builds`` kept waiting are dispatched now; False when nothing is
    active or another process stored the same wake-up first."""
    async with deps.db.read() as s:
        active = await batch_repo.list_by_states(s, queue=queue, states=ACTIVE)
    if not active:
        return False
    result = await deps.publish(SPECULATE, EntityMsg(id=active[0].id, queue=queue),
                                message_id=message_id or unique_id(f"{queue}/unfreeze"))
    return bool(result.created)


class FreezeThaw:
    """The ``freeze-thaw`` scheduler job (every ``SQ_FREEZE_RECHECK_MS``, worker roles):
    wakes a queue's ``speculate`` run when a freeze that held its builds back
    (``allow_builds`` false) ended by itself (its ``until`` or its window passed) or now
    allows builds, so they start within an interval instead of at the next resync.

    | Seen by this process | Now | Action |
    |---|---|---|
    | nothing, or a freeze that allows builds | anything | remember nothing |
    | a freeze without builds | the same | remember its end (``until_ms``, 0: none) |
    | a freeze without builds | no freeze, or one that allows builds | ``speculate`` wake-up, id ``<queue>/thaw/<end>`` (the same in every process: stored once; an unfreeze has no end and the API woke the queue already, so it gets a unique id) |

    What a process saw lives in its memory only: one that starts after the end misses
    it, and the resync job (``SQ_SPECULATE_RESYNC_MS``) still wakes the queue.
    """  # noqa: E501 - the table reads best unwrapped

    def __init__(self, deps: Deps, queues: list[str]) -> None:
        self.deps = deps
        self.queues = tuple(queues)
        self._builds_held: dict[str, int] = {}  # queue -> end of the freeze holding builds
        self.woken = 0

    async def run(self) -> int:
        now = self.deps.now()
        woke = 0
        for queue in self.queues:
            freeze = await freeze_of(self.deps, queue, now_ms=now)
            if freeze is not None and not freeze.allow_builds:
                self._builds_held[queue] = freeze.until_ms
                continue
            if queue not in self._builds_held:
                continue
            end = self._builds_held.pop(queue)
            woke += await wake(self.deps, queue,
                               message_id=f"{queue}/thaw/{end}" if end else None)
        self.woken += woke
        return woke
