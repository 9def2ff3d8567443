"""Application tables. The queue's tables live in ``app/queue/schema.py``; both
metadata objects are handed to Alembic (``alembic/env.py``).

Ownership (enforced by which repository module may touch a table):
- orchestrator: ``counters`` (domains ``batch`` and ``speculation_plan``, the plan
  version that fences a speculate run's write), ``requests``, ``changes``, ``batches``,
  ``request_batches``, ``batch_claims``, ``path_sets``, ``builds``, ``path_builds``,
  ``trunk_epochs``;
- gateway: ``counters`` (domain ``request``), ``request_summaries``, ``request_log``,
  ``change_uri_requests``, ``change_claims``, ``idempotency_keys``;
- admin API: ``admin_audit`` (append only);
- build runners: ``build_runs`` (``app/db/repos/build_runs.py``).

JSON columns are stored as text (``*_json``) so both dialects read them alike.
Every versioned row starts at version 1 and is written with ``WHERE version = old``.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import SQLModel

metadata = SQLModel.metadata
metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

Q = 100  # queue name length
ID = 200  # request / batch / build / path ids
URI = 1024
_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts() -> list[sa.Column[int]]:
    return [
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger, nullable=False),
    ]


counters = sa.Table(
    "counters",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("domain", sa.String(50), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

requests = sa.Table(
    "requests",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("id", sa.String(ID), primary_key=True),
    sa.Column("change_uris_json", sa.Text, nullable=False),
    sa.Column("strategy", sa.String(30), nullable=False),
    sa.Column("state", sa.String(30), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("last_error", sa.Text, nullable=False, server_default=""),
    *_ts(),
)

changes = sa.Table(
    "changes",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("uri", sa.String(URI), primary_key=True),
    sa.Column("request_id", sa.String(ID), primary_key=True),
    sa.Column("details_json", sa.Text, nullable=False),
    sa.Column("created_at_ms", sa.BigInteger, nullable=False),
    sa.Index("ix_changes_request", "queue", "request_id"),
)

batches = sa.Table(
    "batches",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("id", sa.String(ID), primary_key=True),
    sa.Column("contains_json", sa.Text, nullable=False),
    sa.Column("dependencies_json", sa.Text, nullable=False),
    sa.Column("state", sa.String(30), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("failure_reason", sa.Text, nullable=False, server_default=""),
    # {sqid: [landed commit per change]} of a succeeded batch, written with `succeeded`
    sa.Column("landed_json", sa.Text, nullable=False, server_default="{}"),
    *_ts(),
    sa.Index("ix_batches_state", "queue", "state"),
)

request_batches = sa.Table(
    "request_batches",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("request_id", sa.String(ID), primary_key=True),
    sa.Column("batch_id", sa.String(ID), primary_key=True),
    sa.Index("ix_request_batches_batch", "queue", "batch_id"),
)

# One row per batching intent of a request (``cause``: the validated request version):
# the batch minted for it. Inserted with the batch, in one transaction and only if
# absent, so two concurrent runs of one ``batch`` message create one batch.
batch_claims = sa.Table(
    "batch_claims",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("request_id", sa.String(ID), primary_key=True),
    sa.Column("cause", sa.String(100), primary_key=True),
    sa.Column("batch_id", sa.String(ID), nullable=False),
    sa.Column("created_at_ms", sa.BigInteger, nullable=False),
)

path_sets = sa.Table(
    "path_sets",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("head", sa.String(ID), primary_key=True),
    sa.Column("entries_json", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
)

builds = sa.Table(
    "builds",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("id", sa.String(ID), primary_key=True),
    sa.Column("batch_id", sa.String(ID), nullable=False),
    sa.Column("path_id", sa.String(64), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("status", sa.String(30), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("log_url", sa.Text, nullable=False, server_default=""),
    # what it tested (revision 0008): target tip, changes applied, commit, tree
    sa.Column("base_sha", sa.String(64), nullable=False, server_default=""),
    sa.Column("commit_sha", sa.String(64), nullable=False, server_default=""),
    sa.Column("tree_sha", sa.String(64), nullable=False, server_default=""),
    sa.Column("changes_json", sa.Text, nullable=False, server_default="[]"),
    sa.Column("epoch", sa.Integer, nullable=False, server_default="0"),
    *_ts(),
    sa.Index("ix_builds_batch", "queue", "batch_id"),
)

# The trunk's epochs (revision 0008): one row per tip the merger found no passed build of
# the batch had (a move outside the queue, or another batch the queue landed);
# ``rebuilt`` counts the paths the speculation refuted and rebuilt because of it.
trunk_epochs = sa.Table(
    "trunk_epochs",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("epoch", sa.Integer, primary_key=True),
    sa.Column("tip_sha", sa.String(64), nullable=False),
    sa.Column("batch_id", sa.String(ID), nullable=False, server_default=""),
    sa.Column("rebuilt", sa.Integer, nullable=False, server_default="0"),
    # False: the tip is one the queue landed (another batch), yet this batch's builds
    # did not have it: only this batch is rebuilt, and it is no move "outside the queue"
    sa.Column("outside", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("detected_at_ms", sa.BigInteger, nullable=False),
)

path_builds = sa.Table(
    "path_builds",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("path_id", sa.String(64), primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True),
    sa.Column("build_id", sa.String(ID), nullable=False),
)

# --- build runners (app/extensions/builds: command, webhook) --------------------
# One row per build run by a runner of ours: its status as the runner knows it, who
# runs it (owner instance, heartbeat) and its log (the last MiB). Written by the
# runners and the CI status callback; only status-guarded writes (a finished run is
# never changed), hence no version column.

build_runs = sa.Table(
    "build_runs",
    metadata,
    sa.Column("id", sa.String(ID), primary_key=True),
    sa.Column("queue", sa.String(Q), nullable=False),
    sa.Column("runner", sa.String(30), nullable=False),
    sa.Column("batch_id", sa.String(ID), nullable=False),
    sa.Column("path_id", sa.String(64), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("status", sa.String(30), nullable=False),
    sa.Column("owner", sa.String(ID), nullable=False, server_default=""),
    sa.Column("owner_group", sa.String(URI), nullable=False, server_default=""),
    sa.Column("detail", sa.Text, nullable=False, server_default=""),
    sa.Column("exit_code", sa.Integer, nullable=True),
    sa.Column("log_url", sa.Text, nullable=False, server_default=""),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("heartbeat_ms", sa.BigInteger, nullable=False),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("log", sa.Text, nullable=False, server_default=""),
    sa.Column("tested_json", sa.Text, nullable=False, server_default=""),  # 0008
    *_ts(),
    sa.Index("ix_build_runs_owner", "owner", "status"),
    sa.Index("ix_build_runs_owner_group", "owner_group", "status"),
)

# --- gateway-owned -------------------------------------------------------------

request_summaries = sa.Table(
    "request_summaries",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("request_id", sa.String(ID), primary_key=True),
    sa.Column("change_uris_json", sa.Text, nullable=False),
    sa.Column("received_at_ms", sa.BigInteger, nullable=False),
    sa.Column("status", sa.String(30), nullable=False),
    sa.Column("request_version", sa.Integer, nullable=False),
    sa.Column("status_timestamp_ms", sa.BigInteger, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("last_error", sa.Text, nullable=False, server_default=""),
    sa.Column("metadata_json", sa.Text, nullable=False, server_default="{}"),
    sa.Index("ix_request_summaries_received", "queue", "received_at_ms", "request_id"),
    sa.Index("ix_request_summaries_status", "queue", "status", "received_at_ms", "request_id"),
)

request_log = sa.Table(
    "request_log",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("queue", sa.String(Q), nullable=False),
    sa.Column("request_id", sa.String(ID), nullable=False),
    sa.Column("log_id", sa.String(400), nullable=False),
    sa.Column("timestamp_ms", sa.BigInteger, nullable=False),
    sa.Column("type", sa.String(10), nullable=False),
    sa.Column("status", sa.String(30), nullable=False, server_default=""),
    sa.Column("event", sa.String(30), nullable=False, server_default=""),
    sa.Column("request_version", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text, nullable=False, server_default=""),
    sa.Column("metadata_json", sa.Text, nullable=False, server_default="{}"),
    sa.UniqueConstraint("queue", "request_id", "log_id", name="uq_request_log_entry"),
    sa.Index("ix_request_log_history", "queue", "request_id", "timestamp_ms", "id"),
    sqlite_autoincrement=True,
)

change_uri_requests = sa.Table(
    "change_uri_requests",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("change_uri", sa.String(URI), primary_key=True),
    sa.Column("request_id", sa.String(ID), primary_key=True),
    sa.Column("received_at_ms", sa.BigInteger, nullable=False),
)

# One row per change (its identity, ``ChangeURI.identity``) that a live or landed
# request of the queue holds: the primary key is the unique claim that makes a land
# of a change already in flight or landed a 409. Inserted at acceptance (one
# transaction with the summary), deleted when its owner ends ``error``/``cancelled``
# and kept (``state`` landed, with the commit) when it lands — both in the transaction
# that folds the terminal status (``app/db/repos/claims.py``).
change_claims = sa.Table(
    "change_claims",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("change_key", sa.String(URI), primary_key=True),
    sa.Column("request_id", sa.String(ID), nullable=False),
    sa.Column("change_uri", sa.String(URI), nullable=False),
    sa.Column("state", sa.String(10), nullable=False),
    sa.Column("landed_commit", sa.String(64), nullable=False, server_default=""),
    sa.Column("claimed_at_ms", sa.BigInteger, nullable=False),
    sa.Index("ix_change_claims_owner", "queue", "request_id"),
)

# ``Idempotency-Key`` of a land -> the request it created, with the SHA-256 of the body
# it came with (the same key with another body is refused). Kept as long as the
# request's summary (no expiry).
idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("queue", sa.String(Q), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("request_id", sa.String(ID), nullable=False),
    sa.Column("body_sha256", sa.String(64), nullable=False),
    sa.Column("created_at_ms", sa.BigInteger, nullable=False),
)

admin_audit = sa.Table(
    "admin_audit",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("at_ms", sa.BigInteger, nullable=False),
    sa.Column("actor", sa.String(100), nullable=False),
    sa.Column("action", sa.String(50), nullable=False),
    sa.Column("topic", sa.String(255), nullable=False, server_default=""),
    sa.Column("message_ids_json", sa.Text, nullable=False, server_default="[]"),
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
    sa.Column("result_json", sa.Text, nullable=False, server_default="{}"),
    sa.Index("ix_admin_audit_at", "at_ms"),
    sqlite_autoincrement=True,
)
