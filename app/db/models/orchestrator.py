"""Table models the orchestrator owns, and the build runners' table.

Ownership (enforced by which repository module may touch a table):
- orchestrator: ``counters`` (domains ``batch`` and ``speculation_plan``, the plan
  version that fences a speculate run's write; the gateway owns domain ``request``),
  ``requests``, ``changes``, ``batches``, ``request_batches``, ``batch_claims``,
  ``path_sets``, ``builds``, ``path_builds``;
- build runners: ``build_runs`` (``app/db/repos/build_runs.py``).

Every versioned row starts at version 1 and is written with ``WHERE version = old``.
The repositories' hot paths use Core statements over ``table_of(Model)``.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.db.models.base import ID, PATH_ID, SHA, STATE, URI, Q, integer, millis, pk, string, text


class CounterRow(SQLModel, table=True):
    """A per-queue sequence (``domain``: ``batch``, ``request``, ``speculation_plan``)."""

    __tablename__ = "counters"

    queue: str = pk(Q)
    domain: str = pk(50)
    value: int = Field(sa_type=sa.BigInteger)


class RequestRow(SQLModel, table=True):
    """A land request as the orchestrator tracks it (``RequestState``)."""

    __tablename__ = "requests"

    queue: str = pk(Q)
    id: str = pk(ID)
    change_uris_json: str = text()
    strategy: str = string(STATE)
    state: str = string(STATE)
    version: int = integer()
    last_error: str = text(server_default="")
    created_at_ms: int = millis()
    updated_at_ms: int = millis()
    priority: str = string(STATE, server_default="normal")  # ``Priority`` (0011)


class ChangeRow(SQLModel, table=True):
    """One change of a request, with the details its provider reported."""

    __tablename__ = "changes"
    __table_args__ = (
        sa.Index("ix_changes_request", "queue", "request_id"),
    )

    queue: str = pk(Q)
    uri: str = pk(URI)
    request_id: str = pk(ID)
    details_json: str = text()
    created_at_ms: int = millis()


class BatchRow(SQLModel, table=True):
    """A batch of requests built and landed together (``BatchState``)."""

    __tablename__ = "batches"
    __table_args__ = (
        sa.Index("ix_batches_state", "queue", "state"),
    )

    queue: str = pk(Q)
    id: str = pk(ID)
    contains_json: str = text()
    dependencies_json: str = text()
    state: str = string(STATE)
    version: int = integer()
    failure_reason: str = text(server_default="")
    # {sqid: [landed commit per change]} of a succeeded batch, written with `succeeded`
    landed_json: str = text(server_default="{}")
    created_at_ms: int = millis()
    updated_at_ms: int = millis()
    # its members' highest ``Priority`` and the batches it went ahead of (0011)
    priority: str = string(STATE, server_default="normal")
    overtakes_json: str = text(server_default="[]")
    # 1 for a request's second chance after its batch of one failed (0014)
    chance: int = integer(server_default=0)


class RequestBatchRow(SQLModel, table=True):
    """Which batches a request belongs to."""

    __tablename__ = "request_batches"
    __table_args__ = (
        sa.Index("ix_request_batches_batch", "queue", "batch_id"),
    )

    queue: str = pk(Q)
    request_id: str = pk(ID)
    batch_id: str = pk(ID)


class BatchClaimRow(SQLModel, table=True):
    """One row per batching intent of a request (``cause``: the validated request
    version): the batch minted for it. Inserted with the batch, in one transaction and
    only if absent, so two concurrent runs of one ``batch`` message create one batch."""

    __tablename__ = "batch_claims"

    queue: str = pk(Q)
    request_id: str = pk(ID)
    cause: str = pk(100)
    batch_id: str = string(ID)
    created_at_ms: int = millis()


class PathSetRow(SQLModel, table=True):
    """The speculation paths planned on top of one head batch (``entries_json``)."""

    __tablename__ = "path_sets"

    queue: str = pk(Q)
    head: str = pk(ID)
    entries_json: str = text()
    version: int = integer()


class BuildRow(SQLModel, table=True):
    """One build of one speculation path (``BuildStatus``)."""

    __tablename__ = "builds"
    __table_args__ = (
        sa.Index("ix_builds_batch", "queue", "batch_id"),
    )

    queue: str = pk(Q)
    id: str = pk(ID)
    batch_id: str = string(ID)
    path_id: str = string(PATH_ID)
    attempt: int = integer()
    status: str = string(STATE)
    version: int = integer()
    log_url: str = text(server_default="")
    # what it tested (revision 0008): target tip, changes applied, commit, tree, epoch
    base_sha: str = string(SHA, server_default="")
    commit_sha: str = string(SHA, server_default="")
    tree_sha: str = string(SHA, server_default="")
    changes_json: str = text(server_default="[]")
    epoch: int = integer(server_default=0)
    # the runner's last words on it (revision 0013), e.g. why it ended errored
    detail: str = text(server_default="")
    created_at_ms: int = millis()
    updated_at_ms: int = millis()


class TrunkEpochRow(SQLModel, table=True):
    """The trunk's epochs (revision 0008): one row per tip the merger found that no
    passed build of the batch had (a move outside the queue, or another batch the queue
    landed); ``rebuilt`` counts the paths refuted and rebuilt because of it.
    ``outside`` False: the tip is one the queue landed (another batch), so only this
    batch is rebuilt and it is no move "outside the queue"."""

    __tablename__ = "trunk_epochs"

    queue: str = pk(Q)
    epoch: int = Field(primary_key=True, sa_type=sa.Integer,
                       sa_column_kwargs={"autoincrement": False})
    tip_sha: str = string(SHA)
    batch_id: str = string(ID, server_default="")
    rebuilt: int = integer(server_default=0)
    outside: bool = Field(default=True, sa_type=sa.Boolean,
                          sa_column_kwargs={"server_default": sa.true()})
    detected_at_ms: int = millis()


class PathBuildRow(SQLModel, table=True):
    """The build of each attempt of a path."""

    __tablename__ = "path_builds"

    queue: str = pk(Q)
    path_id: str = pk(PATH_ID)
    attempt: int = Field(primary_key=True, sa_type=sa.Integer)
    build_id: str = string(ID)


class BuildRunRow(SQLModel, table=True):
    """One build run by a runner of ours (``app/extensions/builds``: command, webhook):
    its status as the runner knows it, who runs it (owner instance, heartbeat) and its
    log (the last MiB). Written by the runners and the CI status callback; only
    status-guarded writes (a finished run is never changed), hence no version column.
    (``app.domain.build_run.BuildRun`` is the domain's view of a row.)"""

    __tablename__ = "build_runs"
    __table_args__ = (
        sa.Index("ix_build_runs_owner", "owner", "status"),
        sa.Index("ix_build_runs_owner_group", "owner_group", "status"),
        # a check webhook names the build by its branch: queue, path and attempt (0013)
        sa.Index("ix_build_runs_path", "queue", "path_id", "attempt"),
    )

    id: str = pk(ID)
    queue: str = string(Q)
    runner: str = string(STATE)
    batch_id: str = string(ID)
    path_id: str = string(PATH_ID)
    attempt: int = integer()
    status: str = string(STATE)
    owner: str = string(ID, server_default="")
    owner_group: str = string(URI, server_default="")
    detail: str = text(server_default="")
    exit_code: int | None = Field(default=None, sa_type=sa.Integer)
    log_url: str = text(server_default="")
    pid: int | None = Field(default=None, sa_type=sa.Integer)
    heartbeat_ms: int = millis()
    cancel_requested: bool = Field(default=False, sa_type=sa.Boolean,
                                   sa_column_kwargs={"server_default": sa.false()})
    log: str = text(server_default="")
    tested_json: str = text(server_default="")  # revision 0008: what the run tested
    created_at_ms: int = millis()
    updated_at_ms: int = millis()
