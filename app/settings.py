"""Settings, read from the environment (prefix ``SQ_``) and an optional ``.env`` file.

Every setting is listed with its default in ``.env.example``; keep the two in step.
"""

from __future__ import annotations

import ipaddress
import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./var/submitqueue.db"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SQ_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # Server
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    role: Literal["all", "gateway", "worker"] = "all"

    # Database
    database_url: str = DEFAULT_DATABASE_URL
    queue_database_url: str | None = Field(
        default=None, description="Separate database for the message queue; default: database_url"
    )
    auto_migrate: bool = True

    # Merge queues
    queues_file: Path = Path("./queues.yaml")
    # This server's address as CI reaches it: webhook builds' callback URLs start with it.
    public_url: str = Field(default="http://127.0.0.1:8000", pattern=r"^https?://[^\s/]+")

    # Logging
    log_level: str = "INFO"
    queue_log_level: str = "WARNING"

    @field_validator("log_level", "queue_log_level", mode="before")
    @classmethod
    def _known_level(cls, value: object) -> str:
        level = str(value).strip().upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"{value!r} is not a log level; use one of {', '.join(LOG_LEVELS)}")
        return level

    # Durable queue
    queue_poll_interval_ms: int = Field(default=500, ge=10)
    queue_visibility_timeout_ms: int = Field(default=60_000, ge=1000)
    queue_max_attempts: int = Field(default=10, ge=1, le=1000)
    queue_max_payload_bytes: int = Field(default=1_048_576, ge=1024)
    queue_retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=0)
    queue_gc_interval_ms: int = Field(default=60_000, ge=1000)
    queue_shutdown_grace_ms: int = Field(default=10_000, ge=0)
    queue_concurrency: int = Field(default=8, ge=1, le=256)
    # This process's stable name in the queue: claims are recorded under it, and a
    # process restarted with the same id takes its in-flight claims back at once
    # (fenced, no attempt spent) instead of after the visibility timeout. Empty =
    # "<hostname>:<role>:<port>". Two live processes must not share one.
    member_id: str = Field(default="", max_length=200, pattern=r"^[^\s\x00]*$")
    # Chaos delivery mode, for tests: run every handler twice and fail a fraction of
    # runs after their writes, so every controller proves itself idempotent.
    queue_chaos_duplicate: bool = False
    queue_chaos_fail_rate: float = Field(default=0.0, ge=0.0, lt=1.0)

    # Outages (app/domain/outages.py; per queue and dependency in queues.yaml `outages:`):
    # an infrastructure error is retried with backoff for up to the window, spending no
    # attempt; `threshold` consecutive ones open the dependency's circuit; while open, one
    # probe runs every probe_initial_ms * 2^n (capped at probe_max_ms, with jitter), and
    # held messages look again at least every outage_recheck_ms; a circuit open longer
    # than notify_after_s is announced once (log, /metrics, optional webhook).
    outage_window_s: float = Field(default=1800.0, gt=0, le=7 * 24 * 3600)
    outage_threshold: int = Field(default=3, ge=1, le=1000)
    outage_probe_initial_ms: int = Field(default=1000, ge=10, le=3_600_000)
    outage_probe_max_ms: int = Field(default=30_000, ge=10, le=3_600_000)
    outage_recheck_ms: int = Field(default=5000, ge=10, le=3_600_000)
    outage_notify_after_s: float = Field(default=300.0, ge=0, le=7 * 24 * 3600)
    outage_notify_url: str = Field(default="", repr=False)

    # Freezes (docs/freeze.md): a merge held by a queue's freeze looks again at least
    # this often, so an unfreeze (or a new `until`) lands it within this interval.
    freeze_recheck_ms: int = Field(default=2000, ge=10, le=600_000)

    # Speculation: every this often, a speculate wake-up per queue with active batches
    # (one message id per queue per interval across processes); 0 = off.
    speculate_resync_ms: int = Field(default=30_000, ge=0)

    @field_validator("speculate_resync_ms")
    @classmethod
    def _resync_interval(cls, value: int) -> int:
        if 0 < value < 100:
            raise ValueError(f"{value} ms is too short for a resync interval; use 0 (off) "
                             "or at least 100")
        return value

    # Stall detector (app/views/stalls.py): a queue is flagged stalled when its oldest
    # in-flight request's history has not grown for longer than the threshold (0 = off);
    # checked every stall_check_ms.
    stall_threshold_ms: int = Field(default=30 * 60_000, ge=0)
    stall_check_ms: int = Field(default=60_000, ge=100)

    # GitHub (docs/github.md): every this often, each github queue lands the labelled
    # open pull requests a lost webhook delivery left out; 0 = off.
    github_resync_ms: int = Field(default=300_000, ge=0)

    @field_validator("github_resync_ms")
    @classmethod
    def _github_resync(cls, value: int) -> int:
        if 0 < value < 1000:
            raise ValueError(f"{value} ms is too short for the GitHub resync (it reads every "
                             "open pull request); use 0 (off) or at least 1000")
        return value

    # Admin API (kept out of repr() so a logged Settings never shows it)
    admin_token: str | None = Field(default=None, repr=False)

    # Access (docs/access.md). required: land and cancel need a token with the scope;
    # open: anyone may (the demo). Unset: open while the server listens on loopback,
    # required otherwise. auth_reads=required: reads need a token with `read` too.
    auth: Literal["required", "open", ""] = ""
    auth_reads: Literal["public", "required"] = "public"

    @property
    def loopback(self) -> bool:
        """Whether ``host`` is a loopback address (nothing off this machine can connect)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def effective_auth(self) -> Literal["required", "open"]:
        if self.auth:
            return self.auth
        return "open" if self.loopback else "required"

    @property
    def open_exposed(self) -> bool:
        """``SQ_AUTH=open`` on an address others can reach: warned about."""
        return self.effective_auth == "open" and not self.loopback

    # Observability and HTTP hardening
    metrics_refresh_ms: int = Field(
        default=5000, ge=0,
        description="Least interval between reads of the database state behind /metrics",
    )
    cors_origins: str = Field(
        default="", description="Comma-separated origins allowed by CORS; empty = CORS off"
    )

    @property
    def effective_queue_database_url(self) -> str:
        return self.queue_database_url or self.database_url

    def secret_values(self) -> list[str]:
        """Values that must never be shown (masked in stored build logs): the admin token
        (and its secret part when written ``label:secret``) and the database passwords."""
        values = [self.admin_token or ""]
        if self.admin_token and ":" in self.admin_token:
            values.append(self.admin_token.partition(":")[2])
        for url in (self.database_url, self.queue_database_url or ""):
            try:
                values.append(urlsplit(url).password or "")
            except ValueError:  # not a URL we can read: nothing to mask in it
                continue
        return [v for v in values if v]

    @property
    def effective_member_id(self) -> str:
        """``SQ_MEMBER_ID``, else derived from what tells this process's restarts apart
        from its neighbours: the host, the role and the port (two processes on one host
        cannot share a port)."""
        return self.member_id or f"{socket.gethostname()}:{self.role}:{self.port}"[:255]

    @property
    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def setting_errors(exc: ValidationError) -> list[str]:
    """One line a person can act on per invalid setting, named as it is set:
    ``SQ_LOG_LEVEL='LOUD': 'LOUD' is not a log level; use one of DEBUG, ...``."""
    lines = []
    for err in exc.errors():
        name = "SQ_" + "_".join(str(part) for part in err["loc"]).upper()
        message = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{name}={err.get('input')!r}: {message}")
    return lines
