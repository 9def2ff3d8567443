"""Logging: JSON or console output, levels from the settings, ids bound per unit of work,
and secrets that never reach the output."""

from __future__ import annotations

import json
import logging

import pytest
import structlog
from pydantic import ValidationError

from app.logs import REDACTED, redact_text
from app.settings import Settings
from tests.support.logs import captured_logs


def test_json_lines_carry_the_ids_bound_for_the_unit_of_work() -> None:
    with captured_logs() as out:
        structlog.contextvars.bind_contextvars(queue="demo", sqid="demo/7", topic="merge")
        logging.getLogger("submitqueue.controllers").info("merging", extra={"batch_id": "b1"})
        structlog.get_logger("submitqueue").info("structlog event", attempt=2)
        structlog.contextvars.clear_contextvars()
        logging.getLogger("submitqueue").info("unbound")
    first, second, third = out.records()
    assert first["event"] == "merging" and first["level"] == "info"
    assert (first["queue"], first["sqid"], first["topic"], first["batch_id"]) == \
        ("demo", "demo/7", "merge", "b1")
    assert second["sqid"] == "demo/7" and second["attempt"] == 2
    assert "sqid" not in third and "timestamp" in third


def test_console_lines_when_asked() -> None:
    with captured_logs(json_lines=False) as out:
        logging.getLogger("submitqueue").warning("hello console", extra={"queue": "demo"})
    line = out.text.strip()
    assert "hello console" in line and "queue" in line and "demo" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_queue_logger_has_its_own_level() -> None:
    with captured_logs("INFO", "WARNING") as out:
        logging.getLogger("submitqueue.queue").info("queue chatter")
        logging.getLogger("submitqueue.queue").warning("queue warning")
        logging.getLogger("submitqueue").info("app info")
    assert [r["event"] for r in out.records()] == ["queue warning", "app info"]
    with captured_logs("WARNING", "DEBUG") as out:
        logging.getLogger("submitqueue.queue").debug("queue debug")
        logging.getLogger("submitqueue").info("app info")
        logging.getLogger("submitqueue").error("app error")
    assert [r["event"] for r in out.records()] == ["queue debug", "app error"]


def test_levels_come_from_the_environment_and_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SQ_LOG_LEVEL", "warning")
    monkeypatch.setenv("SQ_QUEUE_LOG_LEVEL", "Debug")
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert (s.log_level, s.queue_log_level) == ("WARNING", "DEBUG")
    monkeypatch.setenv("SQ_QUEUE_LOG_LEVEL", "chatty")
    with pytest.raises(ValidationError, match="not a log level; use one of DEBUG"):
        Settings(_env_file=None)  # type: ignore[call-arg]


def test_secrets_never_reach_the_output() -> None:
    with captured_logs() as out:
        logging.getLogger("submitqueue").warning(
            "calling https://ci.example with Bearer abc.def-123",
            extra={"admin_token": "ops:t0p-s3cret", "webhook_secret": "whsec-42",
                   "headers": {"Authorization": "Bearer hdr-999", "Accept": "json"},
                   "database_url": "postgresql+asyncpg://sq:pg-pass-7@db:5432/sq",
                   "secret_env": "CI_WEBHOOK_SECRET"})
        structlog.get_logger("submitqueue").info("login", password="hunter2",
                                                 nested=[{"api_key": "k-1"}])
        try:
            raise RuntimeError("cannot connect to postgresql://sq:pg-pass-8@db/sq")
        except RuntimeError:
            logging.getLogger("submitqueue").exception("boom")
    text = out.text
    for secret in ("t0p-s3cret", "whsec-42", "hdr-999", "abc.def-123", "pg-pass-7",
                   "hunter2", "k-1", "pg-pass-8"):
        assert secret not in text, secret
    first, second, third = out.records()
    assert first["admin_token"] == first["webhook_secret"] == REDACTED
    assert first["headers"] == {"Authorization": REDACTED, "Accept": "json"}
    assert first["database_url"] == f"postgresql+asyncpg://sq:{REDACTED}@db:5432/sq"
    assert first["secret_env"] == "CI_WEBHOOK_SECRET"  # the variable's name, not a secret
    assert first["event"] == f"calling https://ci.example with Bearer {REDACTED}"
    assert second["password"] == REDACTED and second["nested"] == [{"api_key": REDACTED}]
    assert "RuntimeError" in third["exception"] and REDACTED in third["exception"]


def test_redact_text_leaves_ordinary_text_alone() -> None:
    plain = "git://demo.example.com/demo/refs%2Fheads%2Fx/abc?sq-files=a.py at 12:30"
    assert redact_text(plain) == plain
    assert redact_text("https://u:p@h/x") == f"https://u:{REDACTED}@h/x"


def test_settings_repr_hides_the_admin_token() -> None:
    s = Settings(_env_file=None, admin_token="ops:t0p-s3cret")  # type: ignore[call-arg]
    assert "t0p-s3cret" not in repr(s) and "t0p-s3cret" not in str(s)
    assert s.admin_token == "ops:t0p-s3cret"
