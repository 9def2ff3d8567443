"""The dead-letter reconcilers' tables, row by row (app/controllers/dlq/reconcilers.py):
request-scoped, batch-scoped, ``speculate``'s dead letters and ``log``'s.

Each case delivers one dead letter of ``<topic>_dlq`` (its original topic, attempts,
error and failure detail as the queue records them) to that topic's reconciler, which
returns its ``Outcome`` (checked as ``(action, entity, changed)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from unittest import mock

import pytest

from app.controllers.common import Deps
from app.controllers.dlq import Undecodable, reconcilers
from app.controllers.dlq.reconcilers import Unattributed
from app.controllers.pipeline import build_reconcilers
from app.db.repos import requests as request_repo
from app.domain.entities import LandRequest
from app.domain.errors import VersionMismatch
from app.domain.messages import LogMsg
from app.domain.states import BatchState, BuildStatus, LandStrategy, RequestState
from app.queue import Delivery
from tests.support.controllers import (
    CONTROLLER_ONLY,
    NOW_MS,
    Case,
    Check,
    FakeDelivery,
    Rig,
    Seed,
    StateTable,
    batch_id,
    change_uri,
    status_entry,
    unique,
)
from tests.support.tables import table_tests

R, B1 = "demo/1", batch_id(1)
ERROR = "ConnectionError: db away"
FAILED_AT = NOW_MS - 1_000
REQUEST_TOPICS = ("cancel", "validate", "mergecheck", "mergeconflictsignal", "batch")
BATCH_TOPICS = ("dependency_analysis", "speculate", "build", "merge", "conclude",
                "mergesignal")


class Reconcile:
    """The reconciler of the dead letter's original topic, as a controller."""

    def __init__(self, deps: Deps) -> None:
        self.reconcilers = build_reconcilers(deps)

    async def process(self, delivery: Delivery) -> tuple[str, str, bool]:
        msg = delivery.message
        msg = replace(msg, topic=f"{msg.original_topic}_dlq")
        out = await self.reconcilers[msg.topic].reconcile(msg)
        return out.action, out.entity, out.changed


def dead(topic: str, *, attempts: int = 3, error: str = ERROR, retryable: bool = True,
         subjects: Sequence[dict[str, str]] | None = None, **extra: Any) -> dict[str, Any]:
    """``FakeDelivery`` arguments of a dead letter from ``topic``."""
    detail: dict[str, Any] = {"retryable": retryable, "reason": "attempts-exhausted"
                              if retryable else "not-retryable"}
    if subjects is not None:
        detail["subjects"] = list(subjects)
    return {"failure": {"original_topic": topic, "failure_count": attempts,
                        "last_error": error, "failure_detail": detail,
                        "failed_at_ms": FAILED_AT}, **extra}


def why(topic: str, attempts: int = 3, error: str = ERROR) -> str:
    plural = "" if attempts == 1 else "s"
    return f"dead-lettered from {topic} after {attempts} attempt{plural}: {error}"


def md(topic: str) -> dict[str, Any]:
    return {"dlq_topic": f"{topic}_dlq", "dlq_original_topic": topic,
            "dlq_failure_count": 3, "dlq_failed_at_ms": FAILED_AT}


def req(n: int = 1) -> dict[str, str]:
    return {"id": f"demo/{n}", "queue": "demo"}


START = {"id": R, "queue": "demo", "change_uris": [change_uri(1)], "strategy": "merge",
         "received_at_ms": NOW_MS - 60_000}


def world(*requests: tuple[RequestState, int], batches: Sequence[tuple[BatchState, str]] = (),
          builds: Sequence[str] = (), reason: str = "", landed: bool = False) -> Seed:
    """Requests 1, 2, ... (state, version); batch ``n`` in its state holding the
    requests named (``"1,2"``); ``builds`` of batch 1."""
    async def seed(rig: Rig) -> None:
        for n, (st, v) in enumerate(requests, start=1):
            await rig.request(n, st, version=v, last_error="old" if st.terminal else "")
        for n, (st, members) in enumerate(batches, start=1):
            ids = [f"demo/{m}" for m in members.split(",")]
            await rig.batch(n, st, ids, version=4, failure_reason=reason,
                            landed=dict.fromkeys(ids, (f"{n:040x}",)) if landed else None)
        for b in builds:
            await rig.build(b, 1, BuildStatus.RUNNING, path_id="p" * 64)
    return seed


def stale_validated() -> Seed:
    """Request 1 is ``batched`` (v3) in batch 1 (``creating``: claimed since), but the
    reconciler reads it as it was before the claim (``validated``, v2)."""
    async def seed(rig: Rig) -> None:
        await world((RequestState.BATCHED, 3), batches=[(BatchState.CREATING, "1")])(rig)
        stale = LandRequest(queue="demo", id=R, change_uris=(change_uri(1),),
                            strategy=LandStrategy.REBASE, state=RequestState.VALIDATED,
                            version=2)
        rig.stack.enter_context(mock.patch.object(
            request_repo, "get_many", new=mock.AsyncMock(return_value={R: stale})))
    return seed


def start_raced() -> Seed:
    """The start persisted the request after the reconciler looked for it."""
    async def seed(rig: Rig) -> None:
        await world((RequestState.STARTED, 1))(rig)
        rig.stack.enter_context(mock.patch.object(
            reconcilers, "load_request", new=mock.AsyncMock(return_value=None)))
    return seed


def requests_are(*expected: tuple[RequestState, int, str]) -> Check:
    async def check(rig: Rig) -> None:
        rig.stack.close()
        for n, (st, v, error) in enumerate(expected, start=1):
            r = await rig.get_request(n)
            assert (r.state, r.version, r.last_error) == (st, v, error), r
    return check


def terminal_log(n: int, st: RequestState, version: int, error: str,
                 metadata: dict[str, Any]) -> Check:
    async def check(rig: Rig) -> None:
        p = rig.broker.payload("log", f"demo/{n}/{st.value}")
        assert (p["status"], p["request_version"], p["last_error"], p["metadata"]) == (
            st.value, version, error, metadata)
    return check


def batch_is(n: int, st: BatchState, version: int, reason: str = "") -> Check:
    async def check(rig: Rig) -> None:
        b = await rig.get_batch(n)
        assert (b.state, b.version, b.failure_reason) == (st, version, reason)
    return check


def both(*checks: Check) -> Check:
    async def check(rig: Rig) -> None:
        for c in checks:
            await c(rig)
    return check


async def retry_is_owned(rig: Rig) -> None:
    rig.stack.close()
    again = await Reconcile(rig.deps).process(FakeDelivery("x", req(), **dead("validate")))
    assert again == ("owned_by_batch", R, False)
    await requests_are((RequestState.BATCHED, 3, ""))(rig)


def errors(*ns: int) -> list[tuple[str, str, str]]:
    return [("log", f"demo/{n}", f"demo/{n}/error") for n in ns]


def wake(n: int = 1) -> tuple[str, str, str]:
    return ("speculate", "demo", f"{batch_id(n)}/dlq")


RS = RequestState
B3 = (RS.BATCHED, 3)
ST = (RS.STARTED, 1)
BAD_ID = ("payload has no string ``id`` and ``queue`` (``start``: or an ``id`` that is not "
          "``<queue>/<n>``)")
OWNED = ("request owned by a batch: any batch of it not ``creating``/``failed``, or a "
         "``creating`` one while the request is ``batched``")
OTHERWISE = "otherwise (``started``/``validated``/``batched``/``cancelling``)"
LIVE = ("batch live (``creating`` .. ``speculating``, ``cancelling``; ``merging`` for "
        "``mergesignal``)")
MERGING_LEFT = "batch ``merging``, any topic but ``merge`` / ``mergesignal``"
MERGING_MERGE = "batch ``merging``, ``merge``"
SUBJECTS = ("failure ``subjects`` name batches (``PlanRejected`` / ``PlanInvariantError``: "
            "the offending heads)")
PLAN = "speculation plan rejected: new build for demo/batch/2, which is not speculating"


def subject(n: int, reason: str = PLAN) -> dict[str, str]:
    return {"type": "batch", "id": batch_id(n), "reason": reason}


def log_msg(n: int = 1) -> dict[str, Any]:
    return LogMsg.of(status_entry(n, "started", request_version=1)).model_dump(mode="json")


def merge_reported() -> Seed:
    """A merging batch whose merge pushed and published its result (id = batch id)."""
    async def seed(rig: Rig) -> None:
        await world(B3, batches=[(BatchState.MERGING, "1")])(rig)
        await rig.broker.publish("mergesignal", {"id": B1, "queue": "demo",
                                                 "outcome": "succeeded"},
                                 partition_key="demo", message_id=B1)
    return seed


def merge_result_is(outcome: str, reason: str) -> Check:
    """The first ``mergesignal`` result stored under the batch id (the queue keeps one)."""
    async def check(rig: Rig) -> None:
        first = next(p for p in rig.broker.published if p.key == ("mergesignal", "demo", B1))
        assert (first.payload["outcome"], first.payload.get("reason", "")) == (outcome, reason)
        assert (await rig.get_batch(1)).state is BatchState.MERGING
    return check


async def logged(rig: Rig) -> None:
    assert [e.log_id for e in await rig.history(1)] == [f"{R}/started"]
    summary = await rig.get_summary(1)
    assert summary is not None and summary.status == "started"


TABLE = StateTable(reconcilers, [
    # -- request-scoped ---------------------------------------------------------------
    *[Case(BAD_ID, world(ST), payload, name=name, raises=Undecodable, published=[],
           delivery=dead(topic, **extra))
      for name, topic, payload, extra in [
          ("no-id", "validate", {"queue": "demo"}, {}),
          ("id-not-a-string", "cancel", {"id": 7, "queue": "demo"}, {}),
          ("not-json", "batch", None, {"payload_json": "{oops"}),
          ("start-of-a-batch-id", "start", {**START, "id": B1}, {}),
          ("start-of-another-queue", "start", {**START, "id": "other/1"}, {})]],
    Case("request missing, ``start``", world(), START, name="recorded-as-error",
         delivery=dead("start"), returns=("terminated", R, True), published=errors(1),
         check=both(requests_are((RS.ERROR, 1, why("start"))),
                    terminal_log(1, RS.ERROR, 1, why("start"), md("start")))),
    Case("request missing, ``start``", world(), {"id": R, "queue": "demo", "strategy": "x",
                                                "change_uris": "git://x"},
         name="unreadable-payload-recorded-as-error", delivery=dead("start"),
         returns=("terminated", R, True), published=errors(1),
         check=requests_are((RS.ERROR, 1, why("start")))),
    # The start got there first: its row is classified instead.
    Case("request missing, ``start``", start_raced(), START, name="start-persisted-meanwhile",
         delivery=dead("start"), returns=("terminated", R, True), published=errors(1),
         check=requests_are((RS.ERROR, 2, why("start")))),
    *[Case("request missing, any other topic", world(ST), req(2), name=f"{t}-not-found",
           delivery=dead(t), returns=("not_found", "demo/2", False), published=[],
           writes_nothing=True) for t in REQUEST_TOPICS],
    *[Case("request ``error``", world((RS.ERROR, 4)), req(), name=f"error-repaired-{t}",
           delivery=dead(t), returns=("repaired", R, False), published=errors(1),
           writes_nothing=True, check=terminal_log(1, RS.ERROR, 4, "old", md(t)))
      for t in ("start", "mergecheck")],
    *[Case("request ``landed`` / ``cancelled``", world((st, 4)), req(), name=st.value,
           delivery=dead("cancel"), returns=("left", R, False), published=[],
           writes_nothing=True) for st in (RS.LANDED, RS.CANCELLED)],
    *[Case(OWNED, world((rs, 3), batches=[(bs, "1")]), req(), name=f"{rs.value}-in-{bs.value}",
           delivery=dead("validate"), returns=("owned_by_batch", R, False), published=[],
           writes_nothing=True)
      for rs, bs in [(RS.BATCHED, BatchState.SPECULATING), (RS.BATCHED, BatchState.CREATING),
                     (RS.CANCELLING, BatchState.MERGING), (RS.BATCHED, BatchState.SUCCEEDED)]],
    *[Case(OTHERWISE, world((rs, 3), batches=bs), req(), name=name, delivery=dead(t),
           returns=("terminated", R, True), published=errors(1),
           check=both(requests_are((RS.ERROR, 4, why(t))),
                      terminal_log(1, RS.ERROR, 4, why(t), md(t))))
      for name, rs, bs, t in [
          ("started", RS.STARTED, [], "validate"),
          ("validated-in-an-abandoned-batch", RS.VALIDATED, [(BatchState.CREATING, "1")],
           "batch"),
          ("batched-in-a-failed-batch", RS.BATCHED, [(BatchState.FAILED, "1")], "mergecheck"),
          ("cancelling", RS.CANCELLING, [], "cancel"),
          ("started-of-a-start", RS.STARTED, [], "start")]],
    Case("not owned when read, claimed by a batch before the write", stale_validated(),
         req(), delivery=dead("validate"), raises=VersionMismatch, published=[],
         check=retry_is_owned),
    # -- batch-scoped -----------------------------------------------------------------
    *[Case("payload names no batch or build (no string ``id`` and ``queue``)", world(B3),
           payload, name=f"{t}-undecodable", delivery=dead(t), raises=Undecodable,
           published=[])
      for t, payload in [("merge", {"id": B1}), ("buildsignal", {"queue": "demo"}),
                         ("speculate", [B1])]],
    *[Case("batch (or build) missing", world(B3), payload, name=f"{t}-not-found",
           delivery=dead(t), returns=("not_found", entity, False), published=[],
           writes_nothing=True)
      for t, payload, entity in [("dependency_analysis", {"id": B1, "queue": "demo"}, B1),
                                 ("buildsignal", {"id": "build-9", "queue": "demo"},
                                  "build-9")]],
    *[Case("batch ``succeeded`` / ``cancelled``", world(B3, batches=[(st, "1")]),
           {"id": B1, "queue": "demo"}, name=f"{st.value}-left-by-merge", delivery=dead("merge"),
           returns=("left", B1, False), published=[], writes_nothing=True)
      for st in (BatchState.SUCCEEDED, BatchState.CANCELLED)],
    # conclude's own dead letter: the reconciler finishes conclude's fan-out, as conclude
    # would have (a landed member's log carries its commits).
    Case("batch ``succeeded`` / ``cancelled``", world(B3, (RS.LANDED, 4), batches=[
        (BatchState.SUCCEEDED, "1,2")], landed=True), {"id": B1, "queue": "demo"},
         name="succeeded-concluded", delivery=dead("conclude"), returns=("left", B1, False),
         published=[("log", R, f"{R}/landed"), ("log", "demo/2", "demo/2/landed")],
         check=both(requests_are((RS.LANDED, 4, ""), (RS.LANDED, 4, "old")),
                    terminal_log(1, RS.LANDED, 4, "", {"batch_id": B1,
                                                       "commits": [f"{1:040x}"]}))),
    Case("batch ``succeeded`` / ``cancelled``", world(B3, batches=[
        (BatchState.CANCELLED, "1")], reason="cancelled by request"),
         {"id": B1, "queue": "demo"}, name="cancelled-concluded", delivery=dead("conclude"),
         returns=("left", B1, False), published=[("log", R, f"{R}/cancelled")],
         check=terminal_log(1, RS.CANCELLED, 4, "cancelled by request", {"batch_id": B1})),
    Case("batch ``failed``", world(B3, (RS.ERROR, 4), batches=[(BatchState.FAILED, "1,2")],
                                   reason="merge failed: x"), {"id": B1, "queue": "demo"},
         delivery=dead("merge"), returns=("repaired", B1, False),
         published=[*errors(1, 2), wake()],
         check=both(batch_is(1, BatchState.FAILED, 4, "merge failed: x"),
                    requests_are((RS.ERROR, 4, "merge failed: x"), (RS.ERROR, 4, "old")),
                    terminal_log(1, RS.ERROR, 4, "merge failed: x", {"batch_id": B1}))),
    *[Case(LIVE, world(B3, (RS.CANCELLING, 4), batches=[(st, "1,2")], builds=["build-7"]),
           {"id": "build-7" if t == "buildsignal" else B1, "queue": "demo"},
           name=f"{st.value}-failed-by-{t}", delivery=dead(t), returns=("failed", B1, True),
           published=[*errors(1, 2), wake()],
           check=both(batch_is(1, BatchState.FAILED, 5, why(t)),
                      requests_are((RS.ERROR, 4, why(t)), (RS.ERROR, 5, why(t))),
                      terminal_log(2, RS.ERROR, 5, why(t), {"batch_id": B1})))
      for st, t in [(BatchState.CREATING, "dependency_analysis"),
                    (BatchState.CREATED, "mergesignal"), (BatchState.SPECULATING, "build"),
                    (BatchState.SPECULATING, "buildsignal"),
                    (BatchState.MERGING, "mergesignal"), (BatchState.CANCELLING, "conclude")]],
    # A merging batch's change may be on its way to trunk: only its merge decides.
    *[Case(MERGING_LEFT, world(B3, batches=[(BatchState.MERGING, "1")], builds=["build-7"]),
           {"id": "build-7" if t == "buildsignal" else B1, "queue": "demo"},
           name=f"merging-left-by-{t}", delivery=dead(t), returns=("left", B1, False),
           published=[], writes_nothing=True)
      for t in ("dependency_analysis", "build", "buildsignal", "conclude")],
    Case(MERGING_MERGE, world(B3, batches=[(BatchState.MERGING, "1")]),
         {"id": B1, "queue": "demo"}, name="merging-failed-through-mergesignal",
         delivery=dead("merge"), returns=("failed", B1, True),
         published=[("mergesignal", "demo", B1)], writes_nothing=True,
         check=merge_result_is("failed", why("merge"))),
    Case(MERGING_MERGE, merge_reported(), {"id": B1, "queue": "demo"},
         name="merging-whose-merge-reported-is-left", delivery=dead("merge"),
         returns=("left", B1, False),
         published=[("mergesignal", "demo", B1), ("mergesignal", "demo", B1)],
         writes_nothing=True, check=merge_result_is("succeeded", ""),
         replays_differ=[B1]),  # the reconciler's ``failed`` loses to the stored result
    # -- speculate ----------------------------------------------------------------------
    Case(SUBJECTS, world(B3, B3, B3, batches=[(BatchState.SPECULATING, "1"),
                                              (BatchState.SPECULATING, "2"),
                                              (BatchState.MERGING, "3")]),
         {"id": B1, "queue": "demo"}, name="fails-its-subjects-not-the-message-batch",
         delivery=dead("speculate", attempts=1, error="PlanRejected: ...", retryable=False,
                       subjects=[subject(2), subject(3), {"type": "queue", "id": "demo"}]),
         returns=("failed", f"{batch_id(2)},{batch_id(3)}", True),
         published=[("log", "demo/2", "demo/2/error"),
                    ("speculate", "demo", unique(f"{B1}/dlq"))],
         check=both(batch_is(1, BatchState.SPECULATING, 4),
                    batch_is(2, BatchState.FAILED, 5, why("speculate", 1, PLAN)),
                    batch_is(3, BatchState.MERGING, 4))),
    # Its reconciliation may have died before waking the queue: the rest re-plans.
    Case(SUBJECTS, world(B3, B3, batches=[(BatchState.FAILED, "1"),
                                          (BatchState.SPECULATING, "2")], reason="earlier"),
         {"id": B1, "queue": "demo"}, name="a-failed-subject-is-repaired",
         delivery=dead("speculate", retryable=False, subjects=[subject(1, "")]),
         returns=("repaired", B1, False),
         published=[*errors(1), ("speculate", "demo", unique(f"{batch_id(2)}/dlq"))],
         check=requests_are((RS.ERROR, 4, "earlier"), (*B3, ""))),
    Case("no batch subject, the error was not retryable (a bug, a poison payload)",
         world(B3, batches=[(BatchState.SPECULATING, "1")]), {"id": B1, "queue": "demo"},
         delivery=dead("speculate", retryable=False), raises=Unattributed, published=[]),
    Case("no batch subject, retryable attempts exhausted (the database was away)",
         world(B3, batches=[(BatchState.SPECULATING, "1")]), {"id": B1, "queue": "demo"},
         delivery=dead("speculate"), returns=("unattributed", B1, False), published=[],
         writes_nothing=True),
    # -- log ----------------------------------------------------------------------------
    Case("a ``LogMsg`` of a request the gateway has a summary of",
         lambda rig: rig.summary(1), log_msg(), delivery=dead("log"),
         returns=("persisted", R, True), published=[], check=logged),
    Case("a ``LogMsg`` of a request the gateway has no summary of", lambda rig: rig.summary(2),
         log_msg(), delivery=dead("log"), raises=Undecodable, published=[]),
    *[Case("not a ``LogMsg`` (not JSON, or not a log entry)", world(), payload, name=name,
           delivery=dead("log", **extra), raises=Undecodable, published=[])
      for name, payload, extra in [("log-not-json", None, {"payload_json": "]"}),
                                   ("not-a-log-entry", {"id": R, "queue": "demo"}, {})]],
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_every_table_is_read() -> None:
    rows = TABLE.rows()
    assert len(rows) == 8 + 7 + 3 + 3, rows


def test_every_consumed_topic_has_a_reconciler_case() -> None:
    topics = {c.delivery["failure"]["original_topic"] for c in TABLE.cases}
    assert topics == {"start", *REQUEST_TOPICS, *BATCH_TOPICS, "buildsignal", "log"}
    # notify_dlq's and github_check_dlq's reconcilers have their tables beside their
    # controllers (test_notify.py, test_github_check.py)
    assert set(build_reconcilers(mock.Mock())) == {f"{t}_dlq" for t in topics} | {
        "notify_dlq", "github_check_dlq"}


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, Reconcile, "dlq"))


@pytest.mark.parametrize("database_url", CONTROLLER_ONLY, indirect=True)
async def test_the_consumer_entry_point_reconciles(rig: Rig) -> None:
    await world(ST)(rig)
    reconciler = build_reconcilers(rig.deps)["validate_dlq"]
    await reconciler.process(FakeDelivery("validate_dlq", req(), **dead("validate")))
    await requests_are((RS.ERROR, 2, why("validate")))(rig)

