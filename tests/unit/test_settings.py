"""Settings: defaults, validation, and .env.example listing every one of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.settings import DEFAULT_DATABASE_URL, Settings

ROOT = Path(__file__).resolve().parents[2]


def test_env_example_lists_every_setting_with_its_default() -> None:
    text = (ROOT / ".env.example").read_text()
    listed = dict(re.findall(r"^(SQ_[A-Z_]+)=(.*)$", text, flags=re.MULTILINE))
    fields = {f"SQ_{name.upper()}": f for name, f in Settings.model_fields.items()}
    assert set(listed) == set(fields)
    defaults = Settings(_env_file=None)  # type: ignore[call-arg]
    for env_name, shown in listed.items():
        assert shown == _as_env(getattr(defaults, env_name[3:].lower())), env_name


def _as_env(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Path):
        return f"./{value}"
    return str(value)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.database_url == DEFAULT_DATABASE_URL
    assert (s.host, s.port) == ("127.0.0.1", 8000)
    assert s.effective_queue_database_url == DEFAULT_DATABASE_URL


def test_environment_overrides_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SQ_PORT", "9001")
    monkeypatch.setenv("SQ_QUEUE_DATABASE_URL", "sqlite+aiosqlite:///./var/q.db")
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert s.port == 9001
    assert s.effective_queue_database_url.endswith("q.db")
    monkeypatch.setenv("SQ_PORT", "70000")
    with pytest.raises(ValidationError, match="port"):
        Settings(_env_file=None)  # type: ignore[call-arg]


def test_member_id_is_configured_or_derived_from_host_role_and_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "build-7")
    s = Settings(_env_file=None, role="worker", port=8100)  # type: ignore[call-arg]
    assert s.effective_member_id == "build-7:worker:8100"
    monkeypatch.setenv("SQ_MEMBER_ID", "sq-worker-2")
    assert Settings(_env_file=None).effective_member_id == "sq-worker-2"  # type: ignore[call-arg]
    monkeypatch.setenv("SQ_MEMBER_ID", "two words")
    with pytest.raises(ValidationError, match="member_id"):
        Settings(_env_file=None)  # type: ignore[call-arg]
