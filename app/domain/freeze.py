"""Freezes: a queue owner's decision that a merge queue lands nothing for a while.

Pure rules over plain data (no I/O; every function takes ``now_ms``), driven by
``app/controllers/freeze.py`` (reading), ``app/gateway/freeze.py`` (the admin API's
writes) and unit-tested with a fixed clock.

A queue is frozen by either source; a manual freeze wins over a window (it names the
person):

| Source | Where | Frozen while | Ends |
|---|---|---|---|
| ``manual`` | the ``queue_freezes`` row (``POST /api/v1/queues/{queue}/freeze``) | ``frozen`` and (no ``until`` or ``now < until``) | ``unfreeze``, or ``until`` passing (computed: nothing is written) |
| ``window`` | ``freeze_windows`` in ``queues.yaml`` | ``now`` is in ``[fire, fire + duration)`` for a fire time of the window's cron | the window's end (computed) |

A frozen queue accepts requests and validates them, builds (unless ``allow_builds`` is
false: no new build is funded, running ones finish) and lands nothing; with
``allow_hotfix`` a batch whose members are all ``hotfix`` requests lands through it
(``hotfix_passes``).
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MANUAL = "manual"
WINDOW = "window"
_MAX_CHAIN = 100  # overlapping fires followed when working out a window's end

_UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000}
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class FreezeSource(StrEnum):
    MANUAL = MANUAL
    WINDOW = WINDOW


def parse_duration(text: str) -> int:
    """``64h``, ``1d12h``, ``90m``, ``30s`` -> milliseconds (> 0, at most 31 days)."""
    m = _DURATION.fullmatch(text.strip())
    if not text.strip() or m is None or not any(m.groups()):
        raise ValueError(f"duration {text!r} is not like '64h', '1d12h', '90m' or '30s'")
    ms = sum(int(g) * _UNIT_MS[u] for g, u in zip(m.groups(), "dhms", strict=True) if g)
    if not 0 < ms <= 31 * 86_400_000:
        raise ValueError(f"duration {text!r} must be more than 0 and at most 31 days")
    return ms


def _trigger(cron: str, timezone: str) -> Any:
    from apscheduler.triggers.cron import CronTrigger

    return CronTrigger.from_crontab(cron, timezone=timezone)


class FreezeWindowConfig(BaseModel):
    """One scheduled freeze of a queue (``queues.yaml``, ``freeze_windows``): from each
    fire time of ``cron`` (five fields, apscheduler's ``CronTrigger.from_crontab``:
    minute hour day month day-of-week) for ``duration``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timezone: str = "UTC"  # validated first: the cron is read in it
    cron: str = Field(min_length=1, max_length=200)
    duration: str = Field(min_length=1, max_length=40)
    reason: str = Field(default="scheduled freeze", max_length=500)
    allow_builds: bool = True
    allow_hotfix: bool = False

    @field_validator("duration")
    @classmethod
    def _duration(cls, v: str) -> str:
        parse_duration(v)
        return v

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        try:
            _trigger("0 0 * * *", v)
        except Exception:
            raise ValueError(f"timezone {v!r} is not an IANA zone such as 'UTC' or "
                             "'Europe/Berlin'") from None
        return v

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str, info: ValidationInfo) -> str:
        try:
            _trigger(v, info.data.get("timezone", "UTC"))
        except Exception as exc:  # apscheduler raises ValueError
            raise ValueError(f"{v!r} is not a five-field crontab (minute hour day month "
                             f"day-of-week) such as '0 18 * * fri': {exc}") from None
        return v

    @property
    def duration_ms(self) -> int:
        return parse_duration(self.duration)


@dataclass(frozen=True, slots=True)
class ManualFreeze:
    """The stored row of a queue's manual freeze (``frozen`` false: unfrozen)."""

    queue: str
    frozen: bool = False
    reason: str = ""
    by: str = ""
    since_ms: int = 0
    until_ms: int = 0  # 0: until unfrozen
    allow_builds: bool = True
    allow_hotfix: bool = False
    version: int = 0  # 0: no row yet
    updated_at_ms: int = 0
    updated_by: str = ""

    def active(self, now_ms: int) -> bool:
        return self.frozen and (not self.until_ms or now_ms < self.until_ms)


@dataclass(frozen=True, slots=True)
class Freeze:
    """A queue's freeze in effect now: what the views, the CLI and the stages see."""

    queue: str
    source: FreezeSource
    reason: str
    since_ms: int
    until_ms: int  # 0: until unfrozen
    by: str
    allow_builds: bool
    allow_hotfix: bool

    def as_dict(self) -> dict[str, Any]:
        return {"frozen": True, "reason": self.reason, "since_ms": self.since_ms,
                "until_ms": self.until_ms or None, "by": self.by,
                "allow_builds": self.allow_builds, "allow_hotfix": self.allow_hotfix,
                "source": self.source.value}

    def remaining_ms(self, now_ms: int) -> int | None:
        return max(0, self.until_ms - now_ms) if self.until_ms else None


def _ms(t: dt.datetime) -> int:
    return int(t.timestamp() * 1000)


def window_span(w: FreezeWindowConfig, now_ms: int) -> tuple[int, int] | None:
    """``(since_ms, until_ms)`` of ``w``'s freeze containing ``now_ms``, else None.
    Overlapping fires (a duration longer than the cron's period) chain into one span,
    followed at most 100 fires each way (a cron that never lets go is then reported
    with the ends found so far; it is recomputed on every read)."""
    trig = _trigger(w.cron, w.timezone)
    d = w.duration_ms
    # the first fire strictly after now - d; now is inside iff that fire is <= now
    start = dt.datetime.fromtimestamp((now_ms - d + 1) / 1000, tz=dt.UTC)
    first = trig.get_next_fire_time(None, start)
    if first is None or _ms(first) > now_ms:
        return None
    since, until, fire = _ms(first), _ms(first) + d, first
    for _ in range(_MAX_CHAIN):  # back: an earlier fire whose window reaches ``since``
        back = trig.get_next_fire_time(None, dt.datetime.fromtimestamp((since - d) / 1000,
                                                                       tz=dt.UTC))
        if back is None or _ms(back) >= since:
            break
        since = _ms(back)
    for _ in range(_MAX_CHAIN):
        nxt = trig.get_next_fire_time(fire, fire + dt.timedelta(milliseconds=1))
        if nxt is None or _ms(nxt) > until:
            break
        fire, until = nxt, _ms(nxt) + d
    return since, until


def current(queue: str, manual: ManualFreeze | None,
            windows: tuple[FreezeWindowConfig, ...], now_ms: int) -> Freeze | None:
    """The freeze of ``queue`` in effect at ``now_ms``, or None (not frozen)."""
    if manual is not None and manual.active(now_ms):
        return Freeze(queue=queue, source=FreezeSource.MANUAL, reason=manual.reason,
                      since_ms=manual.since_ms, until_ms=manual.until_ms, by=manual.by,
                      allow_builds=manual.allow_builds, allow_hotfix=manual.allow_hotfix)
    for w in windows:
        span = window_span(w, now_ms)
        if span is not None:
            return Freeze(queue=queue, source=FreezeSource.WINDOW, reason=w.reason,
                          since_ms=span[0], until_ms=span[1], by="queues.yaml",
                          allow_builds=w.allow_builds, allow_hotfix=w.allow_hotfix)
    return None


def hotfix_passes(freeze: Freeze, *, priorities: tuple[str, ...]) -> bool:
    """Whether a batch whose members carry ``priorities`` may land through ``freeze``:
    only with ``allow_hotfix`` and every member a ``hotfix`` (a normal request batched
    with a hotfix does not slip through)."""
    return freeze.allow_hotfix and bool(priorities) and all(p == "hotfix" for p in priorities)


def text(freeze: Freeze) -> str:
    """``frozen: weekend (window, until 2026-12-07 10:00:00 UTC)``: the CLI's and the
    pages' one line."""
    until = f", until {format_time(freeze.until_ms)}" if freeze.until_ms else ""
    who = f" by {freeze.by}" if freeze.source is FreezeSource.MANUAL and freeze.by else ""
    return f"frozen: {freeze.reason} ({freeze.source.value}{who}{until})"


def format_time(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
