"""Error classification: retryable infrastructure failures vs. everything else."""

from __future__ import annotations

import sqlite3

import httpx
import pytest
from sqlalchemy import exc as sa_exc

from app.domain.errors import NotFound, ValidationError, VersionMismatch
from app.queue import NonRetryable, Retryable, classify


def _status_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://127.0.0.1/x")
    return httpx.HTTPStatusError("x", request=request, response=httpx.Response(code,
                                                                               request=request))


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        (Retryable("x"), True),
        (NonRetryable("x"), False),
        (VersionMismatch("lost a race"), True),
        (NotFound("gone"), False),
        (ValidationError("bad"), False),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("no such table: x"), False),
        (sqlite3.IntegrityError("UNIQUE constraint failed"), False),
        (httpx.ConnectError("refused"), True),
        (httpx.ReadTimeout("slow"), True),
        (_status_error(408), True),
        (_status_error(429), True),
        (_status_error(500), True),
        (_status_error(503), True),
        (_status_error(501), False),
        (_status_error(505), False),
        (_status_error(404), False),
        (_status_error(422), False),
        (sa_exc.IntegrityError("INSERT", {}, Exception("dup")), False),
        (ValueError("unknown"), False),
        (KeyError("unknown"), False),
        (RuntimeError("unknown"), False),
    ],
)
def test_verdicts(exc: BaseException, retryable: bool) -> None:
    assert classify(exc) is retryable


def test_outermost_verdict_wins_then_the_cause_decides() -> None:
    try:
        try:
            raise sqlite3.OperationalError("database is locked")
        except sqlite3.OperationalError as inner:
            raise NonRetryable("give up") from inner
    except NonRetryable as outer:
        assert classify(outer) is False
    try:
        try:
            raise TimeoutError
        except TimeoutError as inner:
            raise RuntimeError("while calling the build service") from inner
    except RuntimeError as outer:
        assert classify(outer) is True


def test_operational_error_is_judged_by_its_driver_error() -> None:
    locked = sa_exc.OperationalError("UPDATE", {}, sqlite3.OperationalError("database is locked"))
    locked.__cause__ = locked.orig
    schema = sa_exc.OperationalError("SELECT", {}, sqlite3.OperationalError("no such column"))
    schema.__cause__ = schema.orig
    assert classify(locked) is True
    assert classify(schema) is False
