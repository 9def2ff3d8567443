"""The outage rules (app/domain/outages.py) with a fake clock: plain integers, no sleeps."""

from __future__ import annotations

import random
import socket

import httpx
import pytest

from app.domain import outages as o
from app.extensions.git.cli import GitError, Unreachable, is_transport_failure

POLICY = o.OutagePolicy(window_ms=60_000, threshold=3, initial_ms=1000, max_ms=8000,
                        jitter=0.0, notify_after_ms=30_000)


def test_backoff_doubles_up_to_the_cap_and_jitter_only_shortens() -> None:
    assert [POLICY.delay_ms(n) for n in range(6)] == [1000, 2000, 4000, 8000, 8000, 8000]
    jittery = o.OutagePolicy(initial_ms=1000, max_ms=8000, jitter=0.5)
    rand = random.Random(1)
    delays = [jittery.delay_ms(2, rand) for _ in range(200)]
    assert all(2000 <= d <= 4000 for d in delays)
    assert len(set(delays)) > 50  # spread out, not lockstep


def test_consecutive_failures_open_the_circuit_at_the_threshold() -> None:
    c = o.Circuit("repository:q")
    c = o.record_failure(c, now_ms=10, policy=POLICY)
    c = o.record_failure(c, now_ms=20, policy=POLICY)
    assert not c.is_open and c.failures == 2
    c = o.record_failure(c, now_ms=30, policy=POLICY)
    assert c.is_open and c.opened_at_ms == 30 and c.probe_at_ms == 30 + 1000
    assert c.status is o.CircuitStatus.OPEN


def test_a_success_closes_it_and_forgets_the_failures() -> None:
    c = o.Circuit("repository:q", failures=5, opened_at_ms=1, probe_at_ms=9, probes=2)
    closed = o.record_success(c)
    assert closed == o.Circuit("repository:q")
    assert o.decide(closed, now_ms=100, published_at_ms=0, policy=POLICY).verdict is o.Verdict.RUN


def test_while_open_messages_are_held_until_the_probe_and_probes_back_off() -> None:
    now = 1_000_000
    c = o.Circuit("builds:q", failures=3, opened_at_ms=now, probe_at_ms=now + 1000)
    d = o.decide(c, now_ms=now + 200, published_at_ms=now - 5, policy=POLICY)
    assert (d.verdict, d.hold_ms, d.down_ms) == (o.Verdict.HOLD, 800, 200)
    d = o.decide(c, now_ms=now + 1000, published_at_ms=now - 5, policy=POLICY)
    assert d.verdict is o.Verdict.PROBE
    failed = o.record_failure(c, now_ms=now + 1000, policy=POLICY)  # the probe failed
    assert failed.probes == 1 and failed.probe_at_ms == now + 1000 + 2000
    again = o.record_failure(failed, now_ms=now + 3000, policy=POLICY)
    assert again.probe_at_ms == now + 3000 + 4000
    after = o.after_failure(again, now_ms=now + 3000, published_at_ms=now, policy=POLICY)
    assert (after.verdict, after.hold_ms) == (o.Verdict.HOLD, 4000)


def test_below_the_threshold_a_failure_holds_with_backoff() -> None:
    c = o.record_failure(o.Circuit("repository:q"), now_ms=0, policy=POLICY)
    assert o.after_failure(c, now_ms=0, published_at_ms=0, policy=POLICY) == \
        o.Decision(o.Verdict.HOLD, hold_ms=1000)
    c = o.record_failure(c, now_ms=0, policy=POLICY)
    assert o.after_failure(c, now_ms=0, published_at_ms=0, policy=POLICY).hold_ms == 2000


def test_past_the_window_it_gives_up_naming_how_long_it_was_down() -> None:
    opened = 5_000_000
    c = o.Circuit("repository:q", failures=9, opened_at_ms=opened, probe_at_ms=opened + 999_999)
    inside = o.decide(c, now_ms=opened + 60_000, published_at_ms=0, policy=POLICY)
    assert inside.verdict is o.Verdict.HOLD
    past = o.decide(c, now_ms=opened + 60_001, published_at_ms=0, policy=POLICY)
    assert (past.verdict, past.down_ms) == (o.Verdict.GIVE_UP, 60_001)
    text = o.unavailable_text("repository:q", past.down_ms, "Unreachable: gone")
    assert text.startswith(o.UNAVAILABLE_PREFIX)
    assert "repository:q was unreachable for 1 min" in text and "Unreachable: gone" in text


def test_a_message_published_during_the_outage_gets_a_whole_window() -> None:
    opened = 5_000_000
    c = o.Circuit("repository:q", failures=9, opened_at_ms=opened, probe_at_ms=opened + 10**9)
    late = opened + 50_000
    d = o.decide(c, now_ms=opened + 70_000, published_at_ms=late, policy=POLICY)
    assert d.verdict is o.Verdict.HOLD
    d = o.decide(c, now_ms=late + 60_001, published_at_ms=late, policy=POLICY)
    assert d.verdict is o.Verdict.GIVE_UP


def test_notification_once_past_the_threshold() -> None:
    c = o.Circuit("repository:q", failures=3, opened_at_ms=1000, probe_at_ms=2000)
    assert not o.should_notify(c, now_ms=1000 + 29_999, policy=POLICY)
    assert o.should_notify(c, now_ms=1000 + 30_000, policy=POLICY)
    said = o.Circuit("repository:q", failures=3, opened_at_ms=1000, probe_at_ms=2000,
                     notified=1)
    assert not o.should_notify(said, now_ms=10**9, policy=POLICY)
    assert not o.should_notify(o.Circuit("repository:q"), now_ms=10**9, policy=POLICY)


def test_waiting_text() -> None:
    c = o.Circuit("repository:q", failures=3, opened_at_ms=1_764_650_000_000,
                  probe_at_ms=1_764_650_040_000)
    assert o.waiting_text(c, now_ms=1_764_650_000_000) == (
        "waiting: repository:q unreachable since 2025-12-02 04:33:20 UTC, "
        "retrying (next in 40 s)")
    assert o.waiting_text(c, now_ms=1_764_650_040_000).endswith("retrying (now)")
    assert o.format_duration(185_000) == "3 min 5 s"
    assert o.format_duration(3_660_000) == "1 h 1 min"


def _status_error(code: int) -> httpx.HTTPStatusError:
    req = httpx.Request("GET", "https://ci.example/x")
    return httpx.HTTPStatusError("x", request=req, response=httpx.Response(code, request=req))


@pytest.mark.parametrize(("exc", "kind"), [
    (Unreachable(["ls-remote", "/x"], 128, "fatal: '/x' does not appear to be a git repository"),
     "repository"),
    (ConnectionRefusedError("refused"), "builds"),
    (ConnectionResetError("reset"), "builds"),
    (TimeoutError("slow"), "builds"),
    (socket.gaierror("no such host"), "builds"),
    (_status_error(503), "builds"),
    (_status_error(429), "builds"),
    (httpx.ConnectError("down"), "builds"),
    (_status_error(404), None),
    (_status_error(501), None),
    (GitError(["merge-base"], 1, "fatal: not a valid object"), None),
    (ValueError("bad input"), None),
    (KeyError("bug"), None),
])
def test_classification(exc: BaseException, kind: str | None) -> None:
    assert o.infrastructure_kind(exc, "builds") == kind


def test_classification_follows_the_cause_chain() -> None:
    try:
        try:
            raise ConnectionRefusedError("refused")
        except ConnectionRefusedError as inner:
            raise RuntimeError("trigger failed") from inner
    except RuntimeError as outer:
        assert o.infrastructure_kind(outer, "github") == "github"


@pytest.mark.parametrize(("args", "stderr", "transport"), [
    (["ls-remote", "--refs", "--", "/gone.git"],
     "fatal: '/gone.git' does not appear to be a git repository\n"
     "fatal: Could not read from remote repository.", True),
    (["fetch", "--quiet", "--", "https://h/r"], "fatal: unable to access 'https://h/r/': "
     "Could not resolve host: h", True),
    (["push", "--", "https://h/r"], "error: The requested URL returned error: 503", True),
    (["push", "--", "https://h/r"], "! [rejected] main -> main (stale info)", False),
    (["rev-parse", "--verify", "x"], "fatal: Connection refused", False),  # not remote
])
def test_git_transport_failures(args: list[str], stderr: str, transport: bool) -> None:
    assert is_transport_failure(args, stderr) is transport
