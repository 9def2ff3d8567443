"""Application tables as Core ``Table`` objects, for the repositories' statements (the
hot paths). Each is the table of a SQLModel model in ``app/db/models/`` — the typed
schema, with the ownership of each table in its module's docstring. The queue's
tables live in ``app/queue/schema.py``; both metadata objects are handed to Alembic
(``alembic/env.py``).
"""

from __future__ import annotations

from app.db.models import (
    AdminAuditRow,
    ApiTokenRow,
    BatchClaimRow,
    BatchRow,
    BuildRow,
    BuildRunRow,
    ChangeClaimRow,
    ChangeRow,
    ChangeUriRequestRow,
    CounterRow,
    GitHubDeliveryRow,
    IdempotencyKeyRow,
    PathBuildRow,
    PathSetRow,
    QueueFreezeRow,
    RequestBatchRow,
    RequestLogRow,
    RequestRow,
    RequestSummaryRow,
    TrunkEpochRow,
    metadata,
    table_of,
)
from app.db.models.base import ID, URI, Q

__all__ = [
    "ID",
    "URI",
    "Q",
    "admin_audit",
    "api_tokens",
    "batch_claims",
    "batches",
    "build_runs",
    "builds",
    "change_claims",
    "change_uri_requests",
    "changes",
    "counters",
    "github_deliveries",
    "idempotency_keys",
    "metadata",
    "path_builds",
    "path_sets",
    "queue_freezes",
    "request_batches",
    "request_log",
    "request_summaries",
    "requests",
    "trunk_epochs",
]

# orchestrator (app/db/models/orchestrator.py)
counters = table_of(CounterRow)
requests = table_of(RequestRow)
changes = table_of(ChangeRow)
batches = table_of(BatchRow)
request_batches = table_of(RequestBatchRow)
batch_claims = table_of(BatchClaimRow)
path_sets = table_of(PathSetRow)
builds = table_of(BuildRow)
path_builds = table_of(PathBuildRow)
build_runs = table_of(BuildRunRow)
trunk_epochs = table_of(TrunkEpochRow)

# gateway and admin API (app/db/models/gateway.py)
request_summaries = table_of(RequestSummaryRow)
request_log = table_of(RequestLogRow)
change_uri_requests = table_of(ChangeUriRequestRow)
change_claims = table_of(ChangeClaimRow)
idempotency_keys = table_of(IdempotencyKeyRow)
admin_audit = table_of(AdminAuditRow)
api_tokens = table_of(ApiTokenRow)
github_deliveries = table_of(GitHubDeliveryRow)
queue_freezes = table_of(QueueFreezeRow)
