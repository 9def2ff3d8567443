"""Error classification: the framework, not the controller, decides whether to retry.

``classify(exc)`` walks the exception chain from the outermost error inwards
(``__cause__`` then ``__context__``) and returns the first verdict a classifier
gives. Unknown errors are **not** retryable: a bug should reach the dead-letter
queue quickly rather than spin.

Verdicts, in the order they are tried on each error:
1. An explicit wrapper: ``Retryable`` / ``NonRetryable``.
2. An attribute ``retryable: bool`` on the exception (domain errors such as
   ``VersionMismatch`` declare themselves this way, without the queue importing them).
3. Timeouts and cancelled operations of a dependency -> retryable.
4. httpx: transport errors -> retryable; HTTP 408, 429 and 5xx except 501/505 ->
   retryable; other statuses -> not.
5. Databases: connection loss, lock timeouts, deadlocks, serialization failures,
   read-only replicas -> retryable; integrity, data and programming errors -> not.
6. ``ConnectionError`` (an ``OSError``) -> retryable.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator

Verdict = bool | None


class Retryable(Exception):
    """Wrap an error to mark it retryable explicitly."""


class NonRetryable(Exception):
    """Wrap an error to send it to the dead-letter queue without retrying."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)


def _explicit(exc: BaseException) -> Verdict:
    if isinstance(exc, Retryable):
        return True
    if isinstance(exc, NonRetryable):
        return False
    flag = getattr(exc, "retryable", None)
    return flag if isinstance(flag, bool) else None


def _timeouts(exc: BaseException) -> Verdict:
    return True if isinstance(exc, TimeoutError) else None


_RETRYABLE_HTTP = {408, 429}


def _http(exc: BaseException) -> Verdict:
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx is a dependency
        return None
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        return code in _RETRYABLE_HTTP or (code >= 500 and code not in (501, 505))
    if isinstance(exc, httpx.TransportError):
        return True
    return None


_SQLITE_RETRYABLE = ("locked", "busy", "disk i/o", "unable to open")
_PG_RETRYABLE_SQLSTATE_PREFIXES = ("08", "40", "53", "57P", "55P03", "25006")


def _database(exc: BaseException) -> Verdict:
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(s in text for s in _SQLITE_RETRYABLE)
    if isinstance(exc, (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError)):
        return False
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if isinstance(sqlstate, str) and type(exc).__module__.startswith("asyncpg"):
        return sqlstate.startswith(_PG_RETRYABLE_SQLSTATE_PREFIXES)
    try:
        from sqlalchemy import exc as sa_exc
    except ImportError:  # pragma: no cover
        return None
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, (sa_exc.DisconnectionError, sa_exc.TimeoutError)):
        return True
    if isinstance(exc, (sa_exc.IntegrityError, sa_exc.DataError, sa_exc.ProgrammingError)):
        return False
    return None  # an OperationalError: let the driver's own error (its cause) decide


def _connection(exc: BaseException) -> Verdict:
    if isinstance(exc, ConnectionError):
        return True
    name = type(exc).__name__
    if type(exc).__module__.startswith("asyncpg") and "Connection" in name:
        return True
    return None


CLASSIFIERS: tuple[Callable[[BaseException], Verdict], ...] = (
    _explicit,
    _timeouts,
    _http,
    _database,
    _connection,
)


def classify(exc: BaseException) -> bool:
    """True if the error is worth retrying."""
    for err in _chain(exc):
        for classifier in CLASSIFIERS:
            verdict = classifier(err)
            if verdict is not None:
                return verdict
    return False
