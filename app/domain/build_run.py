"""The durable record of a build run by one of SubmitQueue's own build runners
(``app/extensions/builds/command.py``, ``webhook.py``), stored through a ``BuildStore``
(``app/extensions/base.py``; the SQL one is ``app/db/repos/build_runs.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.states import BuildStatus


@dataclass(frozen=True, slots=True)
class TestedTree:
    """What one build tested: the target tip it started from, the change URIs it applied
    in order, the commit it built (``HEAD``) and that commit's tree hash."""

    __test__ = False  # not a pytest test class, whatever its name

    base: str
    commit: str
    tree: str
    changes: tuple[str, ...] = ()
    build_id: str = ""


@dataclass(frozen=True, slots=True)
class BuildRun:
    """The durable record of one build run by a build runner of ours.

    ``owner`` is the runner instance (one per process and queue) that runs it and
    ``owner_group`` that instance's identity (host and build directory) shared by
    its previous and later instances; both are empty for a webhook build (external
    CI runs it). ``heartbeat_ms`` is when the owner last said it was alive.
    """

    id: str
    queue: str
    runner: str  # "command" | "webhook"
    batch_id: str
    path_id: str
    attempt: int
    status: BuildStatus
    owner: str = ""
    owner_group: str = ""
    detail: str = ""
    exit_code: int | None = None
    log_url: str = ""
    pid: int | None = None
    heartbeat_ms: int = 0
    cancel_requested: bool = False
    created_at_ms: int = 0
    updated_at_ms: int = 0
    tested: TestedTree | None = None  # what it builds, once the runner made the tree
