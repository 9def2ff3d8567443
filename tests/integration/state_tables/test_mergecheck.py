"""``mergecheck``'s state table, row by row (app/controllers/mergecheck.py).

The merger is the demo queue's fake (outcomes from ``sq-fake`` markers), wrapped in a
recorder: the acknowledged rows must not even ask it.
"""

from __future__ import annotations

from app.controllers import mergecheck
from app.controllers.mergecheck import MergeCheckController
from app.domain.errors import NotFound
from app.domain.states import LandStrategy, RequestState
from app.extensions.base import MergeOutcome, MergeSpec, MergeStep
from app.extensions.merger.fake import landed_sha
from tests.support.controllers import (
    Case,
    Check,
    Rig,
    Seed,
    StateTable,
    change_uri,
)
from tests.support.tables import table_tests

R = "demo/1"
MSG = {"id": R, "queue": "demo"}
SIGNAL = [("mergeconflictsignal", R, R)]  # partitioned and identified by the sqid
HALTED = (RequestState.CANCELLING, RequestState.LANDED, RequestState.ERROR,
          RequestState.CANCELLED)


RESULT_DEFAULTS = {"code": "", "tip": "", "moved": False, "round": 0}  # not untested_tree

def request_in(state: RequestState, *uris: str, script: MergeOutcome | None = None) -> Seed:
    async def seed(rig: Rig) -> None:
        await rig.request(1, state, version=3, uris=uris or None)
        if script is not None:
            rig.seam("merger").script(check=script)
    return seed


def raising(error: BaseException) -> Seed:
    async def seed(rig: Rig) -> None:
        await rig.request(1, RequestState.STARTED, uris=(change_uri(1),))
        rig.seam("merger").script(check=error)
    return seed


async def asked_nothing(rig: Rig) -> None:
    assert rig.calls() == {}


def checked_and_signalled(uris: tuple[str, ...], **result: object) -> Check:
    """One dry run of the request's steps; the published result says ``result``."""
    async def check(rig: Rig) -> None:
        spec = MergeSpec(queue="demo", id=R, steps=(MergeStep(R, uris, LandStrategy.REBASE),))
        assert rig.seam("merger").calls == [("check", (spec,))]
        expected = {"id": R, "queue": "demo", "reason": "", "outputs": [],
                    "conflicting_paths": [], "commits": {}, **RESULT_DEFAULTS, **result}
        assert rig.broker.payload("mergeconflictsignal", R) == expected
    return check


ONE = (change_uri(1),)
STACK = (change_uri(1), change_uri(2))
CONFLICT = (change_uri(1, fake="merge-conflict", files="a/x.py,b/y.py"),)
STARTED = "request ``started``"

TABLE = StateTable(mergecheck, [
    *[Case("request halted", request_in(st), MSG, name=st.value, published=[],
           writes_nothing=True, check=asked_nothing) for st in HALTED],
    *[Case("request ``validated`` / ``batched``", request_in(st), MSG, name=st.value,
           published=[], writes_nothing=True, check=asked_nothing)
      for st in (RequestState.VALIDATED, RequestState.BATCHED)],
    Case(STARTED, request_in(RequestState.STARTED, *ONE), MSG, name="check-passes",
         published=SIGNAL, writes_nothing=True,
         check=checked_and_signalled(ONE, outcome="succeeded", outputs=[landed_sha(ONE[0])])),
    Case(STARTED, request_in(RequestState.STARTED, *STACK), MSG, name="stack-passes",
         published=SIGNAL, writes_nothing=True,
         check=checked_and_signalled(STACK, outcome="succeeded",
                                     outputs=[landed_sha(u) for u in STACK])),
    Case(STARTED, request_in(RequestState.STARTED, *CONFLICT), MSG, name="check-conflicts",
         published=SIGNAL, writes_nothing=True,
         check=checked_and_signalled(
             CONFLICT, outcome="failed", conflicting_paths=["a/x.py", "b/y.py"],
             reason=f"merge conflict in a/x.py, b/y.py (change {CONFLICT[0]})")),
    Case(STARTED, request_in(RequestState.STARTED, *ONE, script=MergeOutcome(
        succeeded=False, reason="no", outputs=("o",), conflicting_paths=("p",))), MSG,
         name="every-field-of-the-outcome-is-carried", published=SIGNAL, writes_nothing=True,
         check=checked_and_signalled(ONE, outcome="failed", reason="no", outputs=["o"],
                                     conflicting_paths=["p"])),
    # Infrastructure errors propagate (the queue retries them); nothing is published.
    Case(STARTED, request_in(RequestState.STARTED,
                             change_uri(1, fake="merge-error")), MSG,
         name="merger-unavailable", raises=ConnectionError, published=[]),
    Case(STARTED, raising(TimeoutError("merge service timed out")), MSG,
         name="merger-times-out", raises=TimeoutError, published=[]),
    Case("request missing", lambda rig: rig.request(2, RequestState.STARTED), MSG,
         raises=NotFound, published=[], check=asked_nothing),
])


def test_every_documented_row_has_a_case() -> None:
    assert TABLE.missing() == [] and TABLE.unknown() == []


def test_the_table_covers_every_request_state() -> None:
    covered = {*HALTED, RequestState.VALIDATED, RequestState.BATCHED, RequestState.STARTED}
    assert covered == set(RequestState)


test_row, test_crash_before_publishing_is_repaired, test_a_duplicate_delivery_writes_nothing = (
    table_tests(TABLE, MergeCheckController, "mergecheck"))
