"""Outages: which errors mean "a dependency is down", and how to ride them out.

Pure rules over plain data (no I/O, no clock of their own: every function takes
``now_ms``), driven by ``app/controllers/outages.py`` and unit-tested with a fake clock.

**Classification.** ``infrastructure_kind(exc)`` walks the exception chain and returns
the kind of dependency an *infrastructure* error is about, or ``None`` for a logic or
input error (which keeps the queue's short retry budget and reaches the DLQ):

| Error (anywhere in the chain) | Kind |
|---|---|
| has ``dependency_kind: str`` (e.g. git's ``Unreachable``: ``repository``) | that kind |
| ``TimeoutError``, ``ConnectionError`` (refused, reset, aborted), DNS (``socket.gaierror``) | the topic's default kind (none: not counted) |
| an HTTP error with status 408, 429 or 5xx (not 501/505); an httpx transport error | the topic's default kind |
| a database that is not answering (connection lost / refused, driver connection errors) | ``database`` |
| an error with ``infrastructure = False`` (the fakes' error markers), anything else | ``None`` (logic / input) |

**Circuit** (one per dependency, e.g. ``repository:sandbox``):

| State | Event | Next |
|---|---|---|
| closed, ``failures < threshold - 1`` | infrastructure failure | closed, ``failures + 1`` (the message is held ``delay(failures)``) |
| closed, ``failures = threshold - 1`` | infrastructure failure | **open** since now; next probe after ``delay(0)`` |
| open | a message that needs it arrives before the probe is due | held until the probe is due (no attempt spent) |
| open | the probe is due | one message (the winner of a conditional write) runs as the probe; the next probe moves ``delay(probes)`` on |
| open | the probe fails | open, ``probes + 1`` |
| any | a success | **closed**, ``failures = 0`` |
| open longer than the window, and the message has waited longer than the window | a message arrives or fails | give up: ``dependency_unavailable`` |

``delay(n) = min(max, initial * 2**n)``, then "full jitter" of ``jitter`` (a fraction)
subtracted at random, so many waiting processes do not probe in lockstep.
"""  # noqa: E501 - the tables read best unwrapped

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import StrEnum

DATABASE = "database"
REPOSITORY = "repository"
BUILDS = "builds"
GITHUB = "github"
NOTIFY = "notify"


@dataclass(frozen=True, slots=True)
class OutagePolicy:
    """How long and how often to retry a dependency that is down."""

    window_ms: int = 30 * 60_000
    threshold: int = 3
    initial_ms: int = 1_000
    max_ms: int = 30_000
    jitter: float = 0.2
    notify_after_ms: int = 5 * 60_000

    def delay_ms(self, n: int, rand: random.Random | None = None) -> int:
        base = min(self.max_ms, self.initial_ms * 2 ** min(max(n, 0), 30))
        if not self.jitter:
            return int(base)
        r = (rand or random).random()
        return max(1, int(base * (1 - self.jitter * r)))


class CircuitStatus(StrEnum):
    CLOSED = "closed"
    OPEN = "open"


@dataclass(frozen=True, slots=True)
class Circuit:
    """The shared state of one dependency's circuit (``opened_at_ms = 0``: closed)."""

    dependency: str
    failures: int = 0
    opened_at_ms: int = 0
    probe_at_ms: int = 0
    probes: int = 0
    notified: int = 0

    @property
    def status(self) -> CircuitStatus:
        return CircuitStatus.OPEN if self.opened_at_ms else CircuitStatus.CLOSED

    @property
    def is_open(self) -> bool:
        return self.opened_at_ms > 0

    def open_for_ms(self, now_ms: int) -> int:
        return max(0, now_ms - self.opened_at_ms) if self.opened_at_ms else 0


def record_failure(c: Circuit, *, now_ms: int, policy: OutagePolicy,
                   rand: random.Random | None = None) -> Circuit:
    """The circuit after one more infrastructure failure."""
    if c.is_open:
        return replace(c, failures=c.failures + 1, probes=c.probes + 1,
                       probe_at_ms=max(c.probe_at_ms,
                                       now_ms + policy.delay_ms(c.probes + 1, rand)))
    failures = c.failures + 1
    if failures >= policy.threshold:
        return replace(c, failures=failures, opened_at_ms=now_ms, probes=0, notified=0,
                       probe_at_ms=now_ms + policy.delay_ms(0, rand))
    return replace(c, failures=failures)


def record_success(c: Circuit) -> Circuit:
    """The circuit after a success: closed, nothing counted."""
    return Circuit(dependency=c.dependency)


class Verdict(StrEnum):
    RUN = "run"  # run the handler (closed circuit)
    PROBE = "probe"  # run the handler as the open circuit's probe
    HOLD = "hold"  # do not run; see the message again in ``hold_ms``
    GIVE_UP = "give_up"  # past the window: ``dependency_unavailable``


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    hold_ms: int = 0
    down_ms: int = 0


def waited_ms(c: Circuit, *, now_ms: int, published_at_ms: int) -> int:
    """How long a message published at ``published_at_ms`` has waited for ``c``: since
    the outage began, or since it was published if that was later."""
    return max(0, now_ms - max(c.opened_at_ms, published_at_ms))


def decide(c: Circuit, *, now_ms: int, published_at_ms: int, policy: OutagePolicy) -> Decision:
    """What to do with a message that needs ``c``'s dependency, before running it.
    ``PROBE`` means the probe is due: the caller must win it (a conditional write of
    the next probe time) before running, else hold."""
    if not c.is_open:
        return Decision(Verdict.RUN)
    down = c.open_for_ms(now_ms)
    if waited_ms(c, now_ms=now_ms, published_at_ms=published_at_ms) > policy.window_ms:
        return Decision(Verdict.GIVE_UP, down_ms=down)
    if now_ms >= c.probe_at_ms:
        return Decision(Verdict.PROBE, down_ms=down)
    return Decision(Verdict.HOLD, hold_ms=c.probe_at_ms - now_ms, down_ms=down)


def after_failure(c: Circuit, *, now_ms: int, published_at_ms: int, policy: OutagePolicy,
                  rand: random.Random | None = None) -> Decision:
    """What to do with a message whose handler failed with an infrastructure error;
    ``c`` is the circuit *after* ``record_failure``."""
    down = c.open_for_ms(now_ms)
    if c.is_open and waited_ms(c, now_ms=now_ms, published_at_ms=published_at_ms) \
            > policy.window_ms:
        return Decision(Verdict.GIVE_UP, down_ms=down)
    if c.is_open:
        return Decision(Verdict.HOLD, hold_ms=max(1, c.probe_at_ms - now_ms), down_ms=down)
    return Decision(Verdict.HOLD, hold_ms=policy.delay_ms(c.failures - 1, rand))


def should_notify(c: Circuit, *, now_ms: int, policy: OutagePolicy) -> bool:
    """The circuit has stayed open past the notification threshold and nobody said so."""
    return c.is_open and not c.notified and c.open_for_ms(now_ms) >= policy.notify_after_ms


def format_duration(ms: int) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 1 min``."""
    s = max(0, ms) // 1000
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    return f"{h} h {m} min" if m else f"{h} h"


def format_time(ms: int) -> str:
    """``2026-12-02 04:50:12 UTC``."""
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def waiting_text(c: Circuit, *, now_ms: int) -> str:
    """What the pages and the CLI say about an open circuit: ``waiting: repository:q
    unreachable since 2026-12-02 04:50:12 UTC, retrying (next in 40 s)``."""
    nxt = max(0, c.probe_at_ms - now_ms)
    when = f"next in {format_duration(nxt)}" if nxt >= 1000 else "now"
    return (f"waiting: {c.dependency} unreachable since {format_time(c.opened_at_ms)}, "
            f"retrying ({when})")


UNAVAILABLE_PREFIX = "dependency unavailable:"


def unavailable_text(dependency: str, down_ms: int, error: str) -> str:
    """The ``last_error`` of a request given up on (the ``dependency_unavailable`` reason)."""
    return (f"{UNAVAILABLE_PREFIX} {dependency} was unreachable for {format_duration(down_ms)} "
            f"(longer than the retry window); last error: {error}")


# --- classification ---------------------------------------------------------------

_RETRYABLE_HTTP = {408, 429}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)


def _http_status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def _kind_of(err: BaseException, default: str) -> str | None:
    kind = getattr(err, "dependency_kind", None)
    if isinstance(kind, str) and kind:
        return kind
    module = type(err).__module__
    name = type(err).__name__
    if module.startswith("asyncpg") and ("Connection" in name or "CannotConnect" in name):
        return DATABASE
    if module.startswith("sqlalchemy") and getattr(err, "connection_invalidated", False):
        return DATABASE
    if isinstance(err, (TimeoutError, ConnectionError, socket.gaierror)):
        return default
    code = _http_status(err)
    if code is not None:
        return default if code in _RETRYABLE_HTTP or (
            code >= 500 and code not in (501, 505)) else None
    if module.startswith("httpx") and name.endswith(("TransportError", "ConnectError",
                                                      "ReadError", "WriteError",
                                                      "RemoteProtocolError")):
        return default
    return None


def infrastructure_kind(exc: BaseException, default: str) -> str | None:
    """The dependency kind an infrastructure error is about, else ``None``."""
    for err in _chain(exc):
        if getattr(err, "infrastructure", None) is False:
            return None  # an error that says it is not (e.g. a rejected change)
        kind = _kind_of(err, default)
        if kind is not None:
            return kind
    return None
