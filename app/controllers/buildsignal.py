"""``buildsignal``: poll one build until it is terminal; record what changed.

Partitioned by build id; polling is a ``hold``, never a spent attempt. Halted
batches are still polled so their builds' ends are recorded.

| Loaded state | Relative to checkpoint | Action |
|---|---|---|
| build terminal | at | replay the ``speculate`` wake-up of its status (same id; only this controller writes a build's status, so a crash between that write and the wake-up would otherwise strand the queue); ack |
| build live, runner reports the same status and log URL | at | cancel it if unwanted; on a redelivery (attempt > 1: an earlier run failed or died, maybe between its write and its wake-up) replay the wake-up of that status (same id); hold and poll again |
| build live, runner reports a new status, log URL or tested tree | before | in one transaction: conditional write of the status, URL, the runner's detail and tested base / commit / tree / changes, and log ``building`` (one per status reached, with the runner's detail and what it tests: base, commit, tree) and ``built`` on success for each member (and ``flake_suspected`` when the path's earlier attempts failed and were built again: ``speculation.retries``, or a vindication by a dependent's passed build); then a ``speculate`` wake-up (id names build and status); hold unless terminal |
| build missing | invalid | raise ``NotFound`` |

*Unwanted*: the batch is halted, or its path entry is missing, cancelling, cancelled,
at another attempt, or linked to another build. A cancel is only requested; the
status reports when it took effect.
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from app.controllers.common import StageController, event_log
from app.db.repos import batches as batch_repo
from app.db.repos import speculation as spec_repo
from app.domain.entities import Batch, Build
from app.domain.messages import SPECULATE, EntityMsg
from app.domain.states import BuildStatus, PathStatus
from app.extensions.base import BuildReport, TestedTree
from app.queue import Delivery

log = logging.getLogger("submitqueue.controllers")

POLL_ACCEPTED_MS = 500
POLL_RUNNING_MS = 250


class BuildSignalController(StageController):
    async def process(self, delivery: Delivery) -> None:
        msg = EntityMsg.model_validate(delivery.payload)
        q = msg.queue
        async with self.deps.db.read() as s:
            build = await spec_repo.get_build(s, queue=q, id=msg.id)
            batch = await batch_repo.get(s, queue=q, id=build.batch_id)
        if build.status.terminal:
            await self._wake(batch, build.id, build.status)
            return
        runner = self.deps.extensions(q).runner
        report = await runner.status(build.id)
        if not report.status.terminal and await self._unwanted(batch, build):
            try:
                await runner.cancel(build.id)
            except Exception:
                log.warning("could not cancel an unwanted build", extra={"build_id": build.id})
        if report.status is not build.status or report.log_url != build.log_url \
                or _tested_changed(build, report):
            await self._record(batch, build, report)
        elif delivery.attempt > 1:  # polls keep attempt 1: a hold spends none
            await self._wake(batch, build.id, build.status)
        if not report.status.terminal:
            delivery.hold(POLL_RUNNING_MS if report.status is BuildStatus.RUNNING
                          else POLL_ACCEPTED_MS)

    async def _unwanted(self, batch: Batch, build: Build) -> bool:
        if batch.state.halted:
            return True
        async with self.deps.db.read() as s:
            path_set = (await spec_repo.path_sets(s, queue=batch.queue, heads=[batch.id]))[batch.id]
            linked = await spec_repo.get_link(s, queue=batch.queue, path_id=build.path_id,
                                              attempt=build.attempt)
        entry = path_set.get(build.path_id)
        return (entry is None or entry.attempt != build.attempt or linked != build.id
                or entry.status in (PathStatus.CANCELLING, PathStatus.CANCELLED))

    async def _retried(self, batch: Batch, build: Build) -> tuple[int, int]:
        """How many failed builds of this build's path were built again before it: by
        ``speculation.retries`` and by a vindication (``(0, 0)`` for a first attempt,
        read only then)."""
        if build.attempt == 1:
            return 0, 0
        async with self.deps.db.read() as s:
            sets = await spec_repo.path_sets(s, queue=batch.queue, heads=[batch.id])
        entry = sets[batch.id].get(build.path_id)
        if entry is None or entry.attempt != build.attempt:
            return 0, 0
        return entry.retried, entry.vindicated

    async def _record(self, batch: Batch, build: Build, report: BuildReport) -> None:
        status, url, detail = report.status, report.log_url, report.detail
        now = self.deps.now()
        md = {"batch_id": batch.id, "build_id": build.id, "path_id": build.path_id,
              "attempt": build.attempt, "build_url": url, "build_status": status.value}
        if detail:
            md["build_detail"] = detail[:2000]
        tested = report.tested
        if tested is not None:
            md |= {"tested_base": tested.base, "tested_commit": tested.commit,
                   "tested_tree": tested.tree}
        occurrence = f"{build.id}/{status.value}"  # one history event per status reached
        entries = [event_log(batch.queue, m, "building", now=now, occurrence=occurrence,
                             metadata=md) for m in batch.contains]
        if status is BuildStatus.SUCCEEDED:
            entries += [event_log(batch.queue, m, "built", now=now, occurrence=build.id,
                                  metadata=md) for m in batch.contains]
            retried, vindicated = await self._retried(batch, build)
            flaky = retried + vindicated
            if flaky:
                why = " (a build of a dependent that contained it had passed)" \
                    if vindicated else ""
                note = {**md, "retried": retried, "vindicated": vindicated, "detail": (
                    f"path {build.path_id[:10]}: {flaky} earlier attempt"
                    f"{'s' if flaky != 1 else ''} failed{why} and attempt "
                    f"{build.attempt} passed: the failure is suspected flaky")}
                entries += [event_log(batch.queue, m, "flake_suspected", now=now,
                                      occurrence=build.id, metadata=note)
                            for m in batch.contains]
        async with self.deps.transaction() as (s, outbox):
            await spec_repo.update_build(s, old=build, new=replace(
                build, status=status, log_url=url, version=build.version + 1,
                detail=(detail or "")[:2000], **_tested_fields(build, tested)), now_ms=now)
            await outbox.logs(entries)
        await self._wake(batch, build.id, status)

    async def _wake(self, batch: Batch, build_id: str, status: BuildStatus) -> None:
        await self.deps.publish(
            SPECULATE, EntityMsg(id=batch.id, queue=batch.queue),
            message_id=f"{batch.id}/build-signal/{build_id}/{status.value}")


def _tested_changed(build: Build, report: BuildReport) -> bool:
    t = report.tested
    return t is not None and (t.commit, t.tree) != (build.commit_sha, build.tree_sha)


def _tested_fields(build: Build, tested: TestedTree | None) -> dict[str, Any]:
    if tested is None:
        return {}
    return {"base_sha": tested.base, "commit_sha": tested.commit, "tree_sha": tested.tree,
            "changes": tuple(tested.changes)}
