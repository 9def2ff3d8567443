"""``mergeconflictsignal``'s state table, row by row (app/controllers/mergeconflictsignal.py)."""

from __future__ import annotations

from typing import Any

from app.controllers import mergeconflictsignal
from app.controllers.mergeconflictsignal import MergeConflictSignalController
from app.domain.errors import NotFound
from app.domain.states import RequestState
from tests.support.controllers import (
    NOW_MS,
    Case,
    Check,
    Rig,
    Seed,
    StateTable,
)
from tests.support.tables import table_tests

R = "demo/1"
OK = {"id": R, "queue": "demo", "outcome": "succeeded", "outputs": ["abc"]}
BAD = {"id": R, "queue": "demo", "outcome": "failed", "reason": "merge conflict in a/x.py",
       "conflicting_paths": ["a/x.py", "b/y.py"]}
BARE = {"id": R, "queue": "demo", "outcome": "failed"}
VALIDATED = [("log", R, f"{R}/validated"), ("batch", "demo", R)]
TERMINAL = (RequestState.LANDED, RequestState.ERROR, RequestState.CANCELLED)


def request_in(state: RequestState, version: int = 1, last_error: str = "") -> Seed:
    async def seed(rig: Rig) -> None:
        await rig.request(1, state, version=version, last_error=last_error)
    return seed


def status_log(status: str, version: int, last_error: str = "") -> dict[str, Any]:
    return {"queue": "demo", "request_id": R, "log_id": f"{R}/{status}", "timestamp_ms": NOW_MS,
            "type": "status", "status": status, "event": "", "request_version": version,
            "last_error": last_error, "metadata": {}}


def request_is(state: RequestState, version: int, last_error: str = "",
               log: dict[str, Any] | None = None) -> Check:
    async def check(rig: Rig) -> None:
        r = await rig.get_request(1)
        assert (r.state, r.version, r.last_error) == (state, version, last_error)
        if log is not None:
            assert rig.broker.payload("log", log["log_id"]) == log
        if state is RequestState.VALIDATED:
            assert rig.broker.payload("batch", R) == {"id": R, "queue": "demo"}
    return check


CONFLICT = ("merge conflict: merge conflict in a/x.py "
            "(conflicting paths: a/x.py, b/y.py)")
AT = "request ``validated``"
BEFORE_OK = "request ``started``, check succeeded"
BEFORE_BAD = "request ``started``, check failed"

TABLE = StateTable(mergeconflictsignal, [
    *[Case("request halted", request_in(RequestState.CANCELLING, 2), msg,
           name=f"cancelling-{msg['outcome']}", published=[], writes_nothing=True,
           check=request_is(RequestState.CANCELLING, 2))
      for msg in (OK, BAD)],
    # A terminal request's log is re-published first (a crash may have lost it).
    *[Case("request halted", request_in(st, 4, "why"), msg,
           name=f"{st.value}-{msg['outcome']}-repairs-its-log",
           published=[("log", R, f"{R}/{st.value}")], writes_nothing=True,
           check=request_is(st, 4, "why", log=status_log(st.value, 4, "why")))
      for st in TERMINAL for msg in (OK, BAD)],
    Case(BEFORE_OK, request_in(RequestState.STARTED), OK, published=VALIDATED,
         check=request_is(RequestState.VALIDATED, 2, log=status_log("validated", 2))),
    Case(BEFORE_BAD, request_in(RequestState.STARTED), BAD, name="with-reason-and-paths",
         published=[("log", R, f"{R}/error")],
         check=request_is(RequestState.ERROR, 2, CONFLICT,
                          log=status_log("error", 2, CONFLICT))),
    Case(BEFORE_BAD, request_in(RequestState.STARTED), BARE, name="without-a-reason",
         published=[("log", R, f"{R}/error")],
         check=request_is(RequestState.ERROR, 2, "merge conflict: the changes do not apply")),
    # Replayed with the same ids and the same payloads as the write's own fan-out.
    Case(AT, request_in(RequestState.VALIDATED, 2), OK, name="validated-replays",
         published=VALIDATED, writes_nothing=True,
         check=request_is(RequestState.VALIDATED, 2, log=status_log("validated", 2))),
    Case(AT, request_in(RequestState.VALIDATED, 2), BAD, name="validated-keeps-its-verdict",
         published=VALIDATED, writes_nothing=True,
         check=request_is(RequestState.VALIDATED, 2, log=status_log("validated", 2))),
    *[Case("request ``batched``", request_in(RequestState.BATCHED, 3), msg,
           name=f"batched-{msg['outcome']}", published=[], writes_nothing=True,
           check=request_is(RequestState.BATCHED, 3))
      for msg in (OK, BAD)],
    Case("request missing", request_in(RequestState.STARTED), {**OK, "id": "demo/2"},
         raises=NotFound, published=[]),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, MergeConflictSignalController, "mergeconflictsignal"))
