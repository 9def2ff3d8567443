"""``buildsignal``'s state table, row by row (app/controllers/buildsignal.py).

The runner is scripted (it reports a chosen status; ``cancel`` is recorded): the demo's
fake runner never reports ``accepted`` and reads its outcome from the wall clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from app.controllers import buildsignal
from app.controllers.buildsignal import POLL_ACCEPTED_MS, POLL_RUNNING_MS, BuildSignalController
from app.domain.errors import NotFound
from app.domain.states import BatchState, BuildStatus, PathStatus, RequestState
from app.extensions.base import BuildReport, TestedTree
from tests.conftest import BACKENDS
from tests.support.controllers import (
    Case,
    Check,
    FakeDelivery,
    Rig,
    Seed,
    SimulatedCrash,
    StateTable,
    entry,
    path,
)
from tests.support.tables import table_tests

B = "demo/batch/1"
BID = "build-7"
MSG = {"id": BID, "queue": "demo"}
P = path(1)
URL = "https://ci.example/7"
LIVE = (BuildStatus.ACCEPTED, BuildStatus.RUNNING)
TERMINAL = (BuildStatus.SUCCEEDED, BuildStatus.FAILED, BuildStatus.CANCELLED,
            BuildStatus.ERRORED)
HOLD = {BuildStatus.ACCEPTED: POLL_ACCEPTED_MS, BuildStatus.RUNNING: POLL_RUNNING_MS}


def world(status: BuildStatus, report: BuildReport | BaseException | None = None, *,
          batch: BatchState = BatchState.SPECULATING, members: int = 1,
          entry_status: PathStatus | None = PathStatus.BUILDING, entry_attempt: int = 1,
          link: str | None = BID, log_url: str = URL,
          cancel: BaseException | None = None) -> Seed:
    """Batch 1 (``members`` requests) with a path entry for ``P`` and build ``BID`` of
    ``P`` (attempt 1, version 3), linked as ``link`` says; the runner reports
    ``report`` and its ``cancel`` returns (or raises ``cancel``)."""
    async def seed(rig: Rig) -> None:
        reqs = [await rig.request(n, RequestState.BATCHED, version=2)
                for n in range(1, members + 1)]
        await rig.batch(1, batch, reqs)
        if entry_status is not None:
            await rig.path_set(1, [entry(P, entry_status, entry_attempt)])
        await rig.build(BID, 1, status, path_id=P.id, version=3, log_url=log_url, link=False)
        if link is not None:
            await rig.link(P.id, 1, link)
        rig.seam("runner").script(cancel=cancel)
        if report is not None:
            rig.seam("runner").script(status=report)
    return seed


def build_is(status: BuildStatus, version: int, log_url: str = URL) -> Check:
    async def check(rig: Rig) -> None:
        b = await rig.get_build(BID)
        assert (b.status, b.version, b.log_url) == (status, version, log_url)
    return check


def asked(*methods: str, cancelled: bool = False) -> Check:
    """The runner was asked exactly ``methods`` (in order) about ``BID``."""
    async def check(rig: Rig) -> None:
        assert rig.calls() == ({"runner": list(methods)} if methods else {})
        assert all(args == (BID,) for args in rig.seam("runner").called())
    return check


def wake(status: BuildStatus) -> tuple[str, str, str]:
    return ("speculate", "demo", f"{B}/build-signal/{BID}/{status.value}")


def building(status: BuildStatus, *members: int,
             built: bool = False) -> list[tuple[str, str, str]]:
    """The logs and the wake-up one recorded status publishes, in order."""
    logs = [("log", f"demo/{m}", f"demo/{m}/building/{BID}/{status.value}") for m in members]
    if built:
        logs += [("log", f"demo/{m}", f"demo/{m}/built/{BID}") for m in members]
    return [*logs, wake(status)]


def recorded(status: BuildStatus, log_url: str = URL, detail: str | None = None,
             cancel: bool = False) -> Check:
    """The build is written at ``status`` (v4); every log names the build, its path, its
    URL and status (and the runner's detail); the wake-up names the batch."""
    async def check(rig: Rig) -> None:
        await build_is(status, 4, log_url)(rig)
        md: dict[str, Any] = {"batch_id": B, "build_id": BID, "path_id": P.id, "attempt": 1,
                              "build_url": log_url, "build_status": status.value}
        if detail is not None:
            md["build_detail"] = detail
        logs = [p for p in rig.broker.published if p.topic == "log"]
        assert logs and all(p.payload["metadata"] == md and p.payload["type"] == "event"
                            for p in logs)
        wake = [p.payload for p in rig.broker.published if p.topic == "speculate"]
        assert wake == [{"id": B, "queue": "demo"}]
        await asked("status", *(["cancel"] if cancel else []))(rig)
    return check


TESTED = TestedTree(base="a" * 40, commit="b" * 40, tree="c" * 40, changes=("git://x",))


def tree_stored() -> Check:
    """The build row holds what the runner said it tests; the logs name it too."""
    async def check(rig: Rig) -> None:
        b = await rig.get_build(BID)
        assert (b.version, b.base_sha, b.commit_sha, b.tree_sha, b.changes) == (
            4, "a" * 40, "b" * 40, "c" * 40, ("git://x",))
        logs = [p for p in rig.broker.published if p.topic == "log"]
        assert logs and all(p.payload["metadata"]["tested_tree"] == "c" * 40 for p in logs)
    return check


def both(*checks: Check) -> Check:
    async def check(rig: Rig) -> None:
        for c in checks:
            await c(rig)
    return check


def unwanted(name: str, **world_args: Any) -> Sequence[Case]:
    """The same status, but the build is unwanted: a cancel is asked, nothing written."""
    return [Case(SAME, world(st, BuildReport(st, URL), **world_args), MSG,
                 name=f"{st.value}-{name}-is-cancelled", held=HOLD[st], published=[],
                 writes_nothing=True, check=asked("status", "cancel"))
            for st in LIVE]


SAME = "build live, runner reports the same status and log URL"
NEW = "build live, runner reports a new status, log URL or tested tree"
RUN = BuildReport(BuildStatus.RUNNING, URL)
LONG = "x" * 3000

TABLE = StateTable(buildsignal, [
    # Only buildsignal writes a build's status, so a terminal build is at its checkpoint:
    # the wake-up is replayed (a crash after the write must not strand the queue).
    *[Case("build terminal", world(st), MSG, name=st.value, published=[wake(st)],
           writes_nothing=True, check=asked()) for st in TERMINAL],
    *[Case(SAME, world(st, BuildReport(st, URL)), MSG, name=f"{st.value}-wanted-is-polled",
           held=HOLD[st], published=[], writes_nothing=True, check=asked("status"))
      for st in LIVE],
    # A redelivery (not a poll) may follow a run that died before its wake-up.
    *[Case(SAME, world(st, BuildReport(st, URL)), MSG, name=f"{st.value}-redelivered",
           delivery={"attempt": 2}, held=HOLD[st], published=[wake(st)], writes_nothing=True,
           check=asked("status")) for st in LIVE],
    *[c for st in (BatchState.CANCELLING, BatchState.CANCELLED, BatchState.FAILED,
                   BatchState.SUCCEEDED) for c in unwanted(f"batch-{st.value}", batch=st)],
    *unwanted("no-path-set", entry_status=None),
    *unwanted("path-cancelling", entry_status=PathStatus.CANCELLING),
    *unwanted("path-cancelled", entry_status=PathStatus.CANCELLED),
    *unwanted("path-at-another-attempt", entry_attempt=2),
    *unwanted("linked-to-another-build", link="build-8"),
    *unwanted("not-linked", link=None),
    # A cancel is only requested: its failure is logged, and polling goes on.
    Case(SAME, world(BuildStatus.RUNNING, RUN, batch=BatchState.CANCELLING,
                     cancel=ConnectionError("ci down")), MSG,
         name="cancel-that-fails-is-polled-again", held=POLL_RUNNING_MS, published=[],
         writes_nothing=True, check=asked("status", "cancel")),
    Case(NEW, world(BuildStatus.ACCEPTED, RUN, log_url=""), MSG, name="accepted-to-running",
         held=POLL_RUNNING_MS, published=building(BuildStatus.RUNNING, 1),
         check=recorded(BuildStatus.RUNNING)),
    Case(NEW, world(BuildStatus.RUNNING, BuildReport(BuildStatus.SUCCEEDED, URL + "/done"),
                    members=2), MSG, name="running-to-succeeded-logs-built-for-each-member",
         published=building(BuildStatus.SUCCEEDED, 1, 2, built=True),
         check=recorded(BuildStatus.SUCCEEDED, URL + "/done")),
    Case(NEW, world(BuildStatus.RUNNING, BuildReport(BuildStatus.FAILED, URL, LONG)), MSG,
         name="running-to-failed-keeps-2000-chars-of-detail",
         published=building(BuildStatus.FAILED, 1),
         check=recorded(BuildStatus.FAILED, detail=LONG[:2000])),
    *[Case(NEW, world(BuildStatus.ACCEPTED, BuildReport(st, URL, "why")), MSG,
           name=f"accepted-to-{st.value}", published=building(st, 1),
           check=recorded(st, detail="why"))
      for st in (BuildStatus.CANCELLED, BuildStatus.ERRORED)],
    # A halted batch's build is still polled: its end is recorded.
    Case(NEW, world(BuildStatus.RUNNING, BuildReport(BuildStatus.CANCELLED, URL),
                    batch=BatchState.CANCELLED), MSG, name="halted-batch-build-end-is-recorded",
         published=building(BuildStatus.CANCELLED, 1), check=recorded(BuildStatus.CANCELLED)),
    Case(NEW, world(BuildStatus.ACCEPTED, RUN, entry_status=PathStatus.CANCELLING), MSG,
         name="unwanted-build-is-cancelled-and-recorded", held=POLL_RUNNING_MS,
         published=building(BuildStatus.RUNNING, 1),
         check=recorded(BuildStatus.RUNNING, cancel=True)),
    # Only the URL changed: written; the log and wake-up ids are those already sent.
    Case(NEW, world(BuildStatus.RUNNING, BuildReport(BuildStatus.RUNNING, URL + "/v2")), MSG,
         name="same-status-new-log-url", held=POLL_RUNNING_MS,
         published=building(BuildStatus.RUNNING, 1),
         check=recorded(BuildStatus.RUNNING, URL + "/v2")),
    # Only the tested tree is new (the runner made the tree): stored on the build row.
    Case(NEW, world(BuildStatus.RUNNING, BuildReport(BuildStatus.RUNNING, URL, tested=TESTED)),
         MSG, name="same-status-tree-made-is-stored", held=POLL_RUNNING_MS,
         published=building(BuildStatus.RUNNING, 1), check=tree_stored()),
    Case("build missing", world(BuildStatus.RUNNING, RUN), {"id": "build-9", "queue": "demo"},
         raises=NotFound, published=[], check=asked()),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_the_table_covers_every_build_status() -> None:
    assert {*LIVE, *TERMINAL} == set(BuildStatus)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("final", [BuildStatus.SUCCEEDED, BuildStatus.FAILED])
async def test_a_crash_between_the_write_and_the_wake_up_is_repaired(
        rig: Rig, final: BuildStatus) -> None:
    """The build's end is written, the process dies before waking speculation; the
    redelivery must still wake it, with the id and payload the first run would have used."""
    await world(BuildStatus.RUNNING, BuildReport(final, URL))(rig)
    controller: Any = BuildSignalController(rig.deps)  # takes a FakeDelivery
    rig.broker.crash_before("speculate")
    with pytest.raises(SimulatedCrash):
        await controller.process(FakeDelivery("buildsignal", MSG))
    await build_is(final, 4)(rig)
    assert rig.broker.keys("speculate") == []
    await controller.process(FakeDelivery("buildsignal", MSG, attempt=2))
    assert rig.broker.keys("speculate") == [wake(final)]
    assert rig.broker.payload("speculate", wake(final)[2]) == {"id": B, "queue": "demo"}
    await build_is(final, 4)(rig)


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, BuildSignalController, "buildsignal"))
