"""SQLModel table models: the typed schema of the application's tables (the queue's
own tables are in ``app/queue/schema.py``). ``orchestrator.py`` holds the tables the
orchestrator and the build runners own, ``gateway.py`` those the gateway and its admin
API own; both register on one ``metadata`` (``base.py``), which Alembic compares with
the migrations (``app.db.migrate.schema_diff``).

``app.db.tables`` re-exports each model's Core ``Table`` under its old name for the
repositories' statements.
"""

from app.db.models.base import metadata, table_of
from app.db.models.gateway import (
    AdminAuditRow,
    ApiTokenRow,
    ChangeClaimRow,
    ChangeUriRequestRow,
    GitHubDeliveryRow,
    IdempotencyKeyRow,
    QueueFreezeRow,
    RequestLogRow,
    RequestSummaryRow,
)
from app.db.models.orchestrator import (
    BatchClaimRow,
    BatchRow,
    BuildRow,
    BuildRunRow,
    ChangeRow,
    CounterRow,
    PathBuildRow,
    PathSetRow,
    RequestBatchRow,
    RequestRow,
    TrunkEpochRow,
)

__all__ = [
    "AdminAuditRow",
    "ApiTokenRow",
    "BatchClaimRow",
    "BatchRow",
    "BuildRow",
    "BuildRunRow",
    "ChangeClaimRow",
    "ChangeRow",
    "ChangeUriRequestRow",
    "CounterRow",
    "GitHubDeliveryRow",
    "IdempotencyKeyRow",
    "PathBuildRow",
    "PathSetRow",
    "QueueFreezeRow",
    "RequestBatchRow",
    "RequestLogRow",
    "RequestRow",
    "RequestSummaryRow",
    "TrunkEpochRow",
    "metadata",
    "table_of",
]
