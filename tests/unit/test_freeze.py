"""The freeze rules (app/domain/freeze.py) with a fixed clock: windows from cron and
duration (boundaries, chained fires, time zones), durations, a manual freeze's until,
which source wins, the hotfix rule; and the CLI's ``frozen:`` line."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from app.cli.client import waiting_lines
from app.domain.freeze import (
    FreezeSource,
    FreezeWindowConfig,
    ManualFreeze,
    current,
    hotfix_passes,
    parse_duration,
    text,
    window_span,
)


def ms(*args: int, tz: dt.tzinfo = dt.UTC) -> int:
    return int(dt.datetime(*args, tzinfo=tz).timestamp() * 1000)


WEEKEND = FreezeWindowConfig(cron="0 18 * * fri", duration="64h", reason="weekend")


@pytest.mark.parametrize(("now", "inside"), [
    (ms(2026, 12, 4, 17, 59, 59), False),  # Friday just before
    (ms(2026, 12, 4, 18, 0, 0), True),  # the fire time itself
    (ms(2026, 12, 6, 12), True),  # Sunday
    (ms(2026, 12, 7, 9, 59, 59), True),  # Monday, the last second
    (ms(2026, 12, 7, 10, 0, 0), False),  # the end is not inside
    (ms(2026, 12, 9, 12), False),  # Wednesday
])
def test_a_window_covers_fire_time_up_to_its_duration(now: int, inside: bool) -> None:
    span = window_span(WEEKEND, now)
    assert (span is not None) == inside
    if span is not None:
        assert span == (ms(2026, 12, 4, 18), ms(2026, 12, 7, 10))


def test_overlapping_fires_chain_into_one_span() -> None:
    """A chain runs from its first fire to its last fire's end; a cron that never lets
    go is followed at most 100 fires each way (and recomputed on every read)."""
    hourly = FreezeWindowConfig(cron="0 * * * *", duration="90m")
    assert window_span(hourly, ms(2026, 12, 4, 12, 30)) == (
        ms(2026, 12, 4, 12) - 100 * 3_600_000, ms(2026, 12, 4, 12) + 100 * 3_600_000 + 5_400_000)
    twice = FreezeWindowConfig(cron="0 9,10 * * mon", duration="90m")
    assert window_span(twice, ms(2026, 12, 7, 10, 45)) == (ms(2026, 12, 7, 9),
                                                           ms(2026, 12, 7, 11, 30))


def test_a_window_is_read_in_its_time_zone() -> None:
    berlin = FreezeWindowConfig(cron="0 9 * * *", duration="1h", timezone="Europe/Berlin")
    assert window_span(berlin, ms(2026, 12, 4, 8, 30)) == (ms(2026, 12, 4, 8),
                                                           ms(2026, 12, 4, 9))
    assert window_span(berlin, ms(2026, 12, 4, 9, 30)) is None  # 10:30 in Berlin


@pytest.mark.parametrize(("raw", "want"), [("64h", 64 * 3_600_000), ("1d12h", 36 * 3_600_000),
                                           ("90m", 5_400_000), ("30s", 30_000),
                                           ("1h30m", 5_400_000)])
def test_durations(raw: str, want: int) -> None:
    assert parse_duration(raw) == want


@pytest.mark.parametrize("raw", ["", "h", "64", "1x", "0s", "32d", "-1h", "1h 30m"])
def test_bad_durations_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(raw)


@pytest.mark.parametrize(("fields", "says"), [
    ({"cron": "0 18 * *", "duration": "1h"}, "five-field crontab"),
    ({"cron": "61 * * * *", "duration": "1h"}, "five-field crontab"),
    ({"cron": "0 18 * * fri", "duration": "1h", "timezone": "Mars/Olympus"}, "IANA zone"),
    ({"cron": "0 18 * * fri", "duration": "forever"}, "duration"),
    ({"cron": "0 18 * * fri", "duration": "1h", "until": "x"}, "Extra inputs"),
])
def test_bad_windows_are_refused_saying_why(fields: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        FreezeWindowConfig.model_validate(fields)


MANUAL = ManualFreeze(queue="q", frozen=True, reason="release", by="ops", since_ms=100,
                      until_ms=1000, allow_builds=False, version=1)


def test_a_manual_freeze_holds_until_its_until_and_wins_over_a_window() -> None:
    windows = (FreezeWindowConfig(cron="* * * * *", duration="1h", reason="always"),)
    during = current("q", MANUAL, windows, 999)
    assert during is not None and (during.source, during.reason, during.by,
                                   during.allow_builds) == (FreezeSource.MANUAL, "release",
                                                            "ops", False)
    after = current("q", MANUAL, windows, 1000)  # until passed: the window shows through
    assert after is not None and (after.source, after.by) == (FreezeSource.WINDOW,
                                                             "queues.yaml")
    assert current("q", MANUAL, (), 1000) is None
    assert current("q", ManualFreeze(queue="q", frozen=False, reason="old"), (), 1) is None
    forever = ManualFreeze(queue="q", frozen=True, reason="r", since_ms=1)
    assert current("q", forever, (), 10**13) is not None


def test_only_a_batch_of_hotfixes_passes_and_only_under_allow_hotfix() -> None:
    f = current("q", ManualFreeze(queue="q", frozen=True, reason="r", allow_hotfix=True), (), 1)
    assert f is not None
    assert hotfix_passes(f, priorities=("hotfix", "hotfix"))
    assert not hotfix_passes(f, priorities=("hotfix", "normal"))
    assert not hotfix_passes(f, priorities=())
    closed = current("q", ManualFreeze(queue="q", frozen=True, reason="r"), (), 1)
    assert closed is not None and not hotfix_passes(closed, priorities=("hotfix",))


def test_the_one_line_and_the_cli_status_line() -> None:
    f = current("q", MANUAL, (), 500)
    assert f is not None
    line = text(f)
    assert line == "frozen: release (manual by ops, until 1970-01-01 00:00:01 UTC)"
    view = {"request": {"status": "speculated", "health": {"state": "ok"}},
            "freeze": {"frozen": True, "text": line}, "outages": []}
    assert waiting_lines(view, "http://x") == [line]
    landed = {**view, "request": {"status": "landed"}}
    assert waiting_lines(landed, "http://x") == []  # a frozen queue no longer matters
    assert waiting_lines({**view, "freeze": {"frozen": False}}, "http://x") == []
