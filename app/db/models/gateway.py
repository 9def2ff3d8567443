"""Table models the gateway owns: the request log and its projections, the land
claims, and the admin API's audit log.

Ownership (enforced by which repository module may touch a table):
- gateway: ``counters`` (domain ``request``; the model is in ``orchestrator.py``),
  ``request_log`` (append only) and its projections ``request_summaries`` and
  ``change_uri_requests`` (``app/db/repos/request_log.py``), ``change_claims`` and
  ``idempotency_keys`` (``app/db/repos/claims.py``); the read model
  (``app/db/repos/views.py``) reads them and the orchestrator's ``builds``, never writes;
- admin API: ``admin_audit`` (append only, ``app/db/repos/audit.py``);
- access: ``api_tokens`` (``app/db/repos/tokens.py``; written by the admin API's token
  routes and, for ``last_used_at_ms`` only, by authentication);
- GitHub webhook: ``github_deliveries`` (``app/db/repos/github_deliveries.py``), the
  ``X-GitHub-Delivery`` ids already handled;
- admin API: ``queue_freezes`` (``app/db/repos/freezes.py``), each queue's manual freeze,
  written only by the freeze routes (``app/gateway/freeze.py``) and read by the merge
  and speculate stages (``app/controllers/freeze.py``): a queue owner's control, like a
  consumer pause, that every process must see.

JSON columns are stored as text (``*_json``) so both dialects read them alike.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.db.models.base import (
    ID,
    STATE,
    URI,
    Q,
    integer,
    millis,
    pk,
    serial_id,
    string,
    text,
)


class RequestSummaryRow(SQLModel, table=True):
    """The latest status of a request, folded from its log (``RequestStatus``)."""

    __tablename__ = "request_summaries"
    __table_args__ = (
        sa.Index("ix_request_summaries_received", "queue", "received_at_ms", "request_id"),
        sa.Index("ix_request_summaries_status",
                 "queue", "status", "received_at_ms", "request_id"),
        sa.Index("ix_request_summaries_actor", "queue", "submitted_by", "received_at_ms"),
    )

    queue: str = pk(Q)
    request_id: str = pk(ID)
    change_uris_json: str = text()
    received_at_ms: int = millis()
    status: str = string(STATE)
    request_version: int = integer()
    status_timestamp_ms: int = millis()
    version: int = integer()
    last_error: str = text(server_default="")
    metadata_json: str = text(server_default="{}")
    # who submitted it (the caller's actor, ``app/domain/access.py``); "" = before 0009
    submitted_by: str = string(100, server_default="")
    priority: str = string(30, server_default="normal")  # ``Priority`` (0011)


class RequestLogRow(SQLModel, table=True):
    """One entry of a request's log: a status (``type`` ``status``) or an event; at
    most once per ``log_id``."""

    __tablename__ = "request_log"
    __table_args__ = (
        sa.UniqueConstraint("queue", "request_id", "log_id", name="uq_request_log_entry"),
        sa.Index("ix_request_log_history", "queue", "request_id", "timestamp_ms", "id"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = serial_id()
    queue: str = string(Q)
    request_id: str = string(ID)
    log_id: str = string(400)
    timestamp_ms: int = millis()
    type: str = string(10)
    status: str = string(STATE, server_default="")
    event: str = string(STATE, server_default="")
    request_version: int = integer(server_default=0)
    last_error: str = text(server_default="")
    metadata_json: str = text(server_default="{}")


class ChangeUriRequestRow(SQLModel, table=True):
    """Which requests named a change URI, and when."""

    __tablename__ = "change_uri_requests"

    queue: str = pk(Q)
    change_uri: str = pk(URI)
    request_id: str = pk(ID)
    received_at_ms: int = millis()


class ChangeClaimRow(SQLModel, table=True):
    """One row per change (its identity, ``ChangeURI.identity``) that a live or landed
    request of the queue holds: the primary key is the unique claim that makes a land
    of a change already in flight or landed a 409. Inserted at acceptance (one
    transaction with the summary), deleted when its owner ends ``error``/``cancelled``
    and kept (``state`` landed, with the commit) when it lands — both in the
    transaction that folds the terminal status (``app/db/repos/claims.py``)."""

    __tablename__ = "change_claims"
    __table_args__ = (
        sa.Index("ix_change_claims_owner", "queue", "request_id"),
    )

    queue: str = pk(Q)
    change_key: str = pk(URI)
    request_id: str = string(ID)
    change_uri: str = string(URI)
    state: str = string(10)
    landed_commit: str = string(64, server_default="")
    claimed_at_ms: int = millis()


class IdempotencyKeyRow(SQLModel, table=True):
    """``Idempotency-Key`` of a land -> the request it created, with the SHA-256 of the
    body it came with (the same key with another body is refused). Kept as long as the
    request's summary (no expiry)."""

    __tablename__ = "idempotency_keys"

    queue: str = pk(Q)
    key: str = pk(255)
    request_id: str = string(ID)
    body_sha256: str = string(64)
    created_at_ms: int = millis()


class AdminAuditRow(SQLModel, table=True):
    """One admin action: who did what to which messages, when and why."""

    __tablename__ = "admin_audit"
    __table_args__ = (
        sa.Index("ix_admin_audit_at", "at_ms"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = serial_id()
    at_ms: int = millis()
    actor: str = string(100)
    action: str = string(50)
    topic: str = string(255, server_default="")
    message_ids_json: str = text(server_default="[]")
    reason: str = text(server_default="")
    result_json: str = text(server_default="{}")


class ApiTokenRow(SQLModel, table=True):
    """An API token (``app/domain/access.py``): its label, scopes and queues, and the
    scrypt hash of its secret (never the secret). Revoked tokens are kept (with
    ``revoked_at_ms``) so the audit and the history still name them."""

    __tablename__ = "api_tokens"

    id: str = pk(12)
    label: str = string(100)
    scopes_json: str = text()
    queues_json: str = text(server_default="null")
    secret_hash: str = string(200)
    created_at_ms: int = millis()
    created_by: str = string(100, server_default="")
    expires_at_ms: int = Field(default=0, sa_type=sa.BigInteger,
                               sa_column_kwargs={"server_default": "0"})
    last_used_at_ms: int = Field(default=0, sa_type=sa.BigInteger,
                                 sa_column_kwargs={"server_default": "0"})
    revoked_at_ms: int = Field(default=0, sa_type=sa.BigInteger,
                               sa_column_kwargs={"server_default": "0"})


class GitHubDeliveryRow(SQLModel, table=True):
    """One GitHub webhook delivery taken (``X-GitHub-Delivery``): a redelivery of it is
    acknowledged and not acted on again. ``outcome`` says what it did ("" while it is
    being handled)."""

    __tablename__ = "github_deliveries"
    __table_args__ = (sa.Index("ix_github_deliveries_received", "received_at_ms"),)

    delivery_id: str = pk(100)
    event: str = string(50)
    received_at_ms: int = millis()
    outcome: str = text(server_default="")


class QueueFreezeRow(SQLModel, table=True):
    """A merge queue's manual freeze (``app/domain/freeze.py``): one row per queue ever
    frozen, ``frozen`` 0 once unfrozen; ``until_ms`` 0 = until unfrozen. Written with
    ``WHERE version = old`` (the first freeze by an insert that a concurrent one loses)."""

    __tablename__ = "queue_freezes"

    queue: str = pk(Q)
    frozen: int = integer()
    reason: str = text(server_default="")
    frozen_by: str = string(100, server_default="")
    since_ms: int = millis()
    until_ms: int = millis()
    allow_builds: int = integer()
    allow_hotfix: int = integer()
    version: int = integer()
    updated_at_ms: int = millis()
    updated_by: str = string(100, server_default="")
