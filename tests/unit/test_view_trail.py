"""The request page's stage trail and typed removal reasons (pure), the URL filter, and
the event stream's log cursor."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.entities import RequestLog
from app.domain.states import Assumption, LogType
from app.speculation.core import NO_PATH_PASSED
from app.views.events import LogCursor
from app.views.trail import BuildFact, removal, safe_url, trail

TERMINAL = frozenset({"landed", "error", "cancelled"})


def st(ts: int, status: str, last_error: str = "", **md: Any) -> RequestLog:
    return RequestLog(queue="q", request_id="q/1", timestamp_ms=ts, type=LogType.STATUS,
                      status=status, last_error=last_error, metadata=md)


def ev(ts: int, event: str, **md: Any) -> RequestLog:
    return RequestLog(queue="q", request_id="q/1", timestamp_ms=ts, type=LogType.EVENT,
                      event=event, metadata=md)


def test_events_sit_under_the_status_they_happened_in_counted_in_order() -> None:
    history = [st(0, "accepted"), st(5, "speculating"), ev(6, "building", build_id="b1"),
               ev(7, "building", build_id="b2"), ev(8, "built"), ev(9, "building"),
               ev(10, "waiting"), st(20, "landed")]
    stages = trail(history, now_ms=100, terminal=TERMINAL)
    assert [s.label for s in stages] == [
        "accepted", "speculating [building \u00d73, built, waiting]", "landed"]
    assert [s.duration_ms for s in stages] == [5, 15, None]
    assert stages[1].entries[0].build_id == "b1"


def test_a_live_last_stage_lasts_until_now_and_early_events_open_accepted() -> None:
    stages = trail([ev(3, "building"), st(10, "speculating")], now_ms=50, terminal=TERMINAL)
    assert [(s.status, s.at_ms, s.duration_ms) for s in stages] == [
        ("accepted", 3, 7), ("speculating", 10, 40)]


@pytest.mark.parametrize(("url", "kept"), [
    ("/api/v1/builds/b1/log", True), ("https://ci.example/b/1", True),
    ("HTTP://ci.example/x", True), ("javascript:alert(1)", False), ("//evil.example/x", False),
    ("data:text/html,<b>", False), ("", False), (None, False), ("/\\evil", False),
])
def test_only_http_and_site_relative_urls_survive(url: Any, kept: bool) -> None:
    assert (safe_url(url) is not None) is kept


def reason(status: str, err: str = "", history: list[RequestLog] | None = None,
           batch: str | None = "q/batch/1", **kw: Any) -> Any:
    return removal(status=status, last_error=err, history=history or [], batch_id=batch,
                   assumptions=kw.pop("assumptions", {}), queue="q", **kw)


def test_landed_and_live_requests_have_no_removal() -> None:
    assert reason("landed") is None and reason("speculating") is None


def test_build_failure_names_path_assumptions_and_log() -> None:
    deps = (("q/batch/7", Assumption.SUCCEEDS), ("q/batch/8", Assumption.FAILS))
    r = reason("error", NO_PATH_PASSED, assumptions={"p" * 64: deps},
               builds=[BuildFact("b-1", "p" * 64, "failed", "/api/v1/builds/b-1/log"),
                       BuildFact("b-0", "p" * 64, "succeeded", "javascript:x")])
    assert r.kind == "build_failed"
    assert "path pppppppppp (on top of q/batch/7, without q/batch/8)" in r.text
    assert [(e.label, e.url) for e in r.evidence] == [
        ("log of build b-1 (path pppppppppp)", "/api/v1/builds/b-1/log")]


def test_build_failure_falls_back_to_failed_building_events_and_missing_logs() -> None:
    history = [ev(1, "building", build_id="b9", build_status="failed", path_id="x" * 64,
                  build_url="javascript:alert(1)")]
    r = reason("error", NO_PATH_PASSED, history)
    assert r.kind == "build_failed" and "with unknown assumptions" in r.text
    assert r.evidence[0].url is None and "published no log" in r.evidence[0].label


def test_merge_conflict_lists_its_paths() -> None:
    r = reason("error", "merge conflict: does not apply (conflicting paths: a/x.py, b/y.py)",
               batch=None)
    assert r.kind == "merge_conflict" and "before batching" in r.text
    assert [e.label for e in r.evidence] == ["a/x.py", "b/y.py"]
    landing = reason("error", "merge failed: rejected by the remote")
    assert landing.kind == "merge_conflict" and "while landing" in landing.text


def test_dead_letters_name_their_stage() -> None:
    r = reason("error", "dead-lettered from build after 2 attempts: ConnectionError: down")
    assert (r.kind, r.stage) == ("dead_lettered", "build")
    assert "failed 2 times (ConnectionError: down)" in r.text
    assert r.evidence[0].url == "/admin"


def test_cancelled_by_itself_or_with_its_batch() -> None:
    own = reason("cancelled", history=[st(1, "cancelling", reason="wrong branch")])
    assert "reason given: wrong branch" in own.text
    other = reason("cancelled", history=[st(1, "speculating")])
    assert "together with its batch q/batch/1" in other.text


def test_duplicates_link_to_the_request_that_holds_the_change() -> None:
    r = reason("error", "duplicate of in-flight request q/3: it already claims git://x",
               batch=None)
    assert r.kind == "duplicate" and r.evidence[0].url == "/queues/q/requests/3"
    foreign = reason("error", "duplicate of in-flight request other/3: it already claims x")
    assert foreign.evidence[0].url is None


def test_rejected_before_batching_and_any_other_error() -> None:
    assert reason("error", "stale: ref moved", batch=None).kind == "rejected"
    assert reason("error", "something odd").kind == "error"
    assert reason("error", "").text == "no reason was recorded"


def test_cursor_delivers_each_id_once_and_waits_for_late_commits() -> None:
    c = LogCursor(10, grace_ms=1000)
    assert c.fold([11, 13], now_ms=0) == [11, 13]
    assert (c.position, c.gaps) == (11, 1)  # 12 may still commit
    assert c.fold([13], now_ms=10) == []  # re-read, not re-delivered
    assert c.fold([12, 13, 14], now_ms=20) == [12, 14]  # the late one arrives
    assert (c.position, c.gaps) == (14, 0)


def test_cursor_gives_up_on_gaps_after_the_grace_or_when_the_window_is_full() -> None:
    c = LogCursor(0, grace_ms=1000)
    c.fold([2], now_ms=0)
    assert c.position == 0
    c.fold([2], now_ms=999)
    assert c.position == 0
    assert c.fold([2, 3], now_ms=1000) == [3]
    assert c.position == 3
    full = LogCursor(0, grace_ms=10_000)
    full.fold([5, 6], now_ms=0, full=True)
    assert full.position == 6


def test_cursor_does_not_track_a_huge_jump_in_the_sequence_id_by_id() -> None:
    c = LogCursor(0, grace_ms=10_000)
    assert c.fold([5_000_000], now_ms=0) == [5_000_000]
    assert c.gaps < 10_001 and c.position >= 5_000_000 - 10_000
