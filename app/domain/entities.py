"""Entities of the orchestrator and the gateway, as plain immutable values.

Writers build a new value with ``dataclasses.replace`` and persist it with a
conditional write (``version`` = old + 1); the in-memory copy is replaced only
after the write succeeded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from app.domain.states import (
    Assumption,
    BatchState,
    BuildStatus,
    LandStrategy,
    LogType,
    PathStatus,
    Priority,
    RequestState,
)


@dataclass(frozen=True, slots=True)
class LandRequest:
    queue: str
    id: str
    change_uris: tuple[str, ...]
    strategy: LandStrategy
    state: RequestState
    version: int
    last_error: str = ""
    created_at_ms: int = 0
    priority: Priority = Priority.NORMAL


@dataclass(frozen=True, slots=True)
class ChangedFile:
    path: str
    lines_added: int = 0
    lines_deleted: int = 0


@dataclass(frozen=True, slots=True)
class ChangeDetails:
    """What a change provider reports about one change. ``title``: the head commit's
    subject (or the pull request's title); "" when the provider does not know it (details
    stored before titles existed read back as "")."""

    uri: str
    author_name: str = ""
    author_email: str = ""
    changed_files: tuple[ChangedFile, ...] = ()
    title: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "author": {"name": self.author_name, "email": self.author_email},
            "title": self.title,
            "changed_files": [
                {"path": f.path, "lines_added": f.lines_added, "lines_deleted": f.lines_deleted}
                for f in self.changed_files
            ],
        }

    @classmethod
    def from_json(cls, uri: str, data: dict[str, Any]) -> ChangeDetails:
        author = data.get("author") or {}
        return cls(
            uri=uri,
            author_name=author.get("name", ""),
            author_email=author.get("email", ""),
            title=str(data.get("title") or ""),
            changed_files=tuple(
                ChangedFile(f["path"], int(f.get("lines_added", 0)), int(f.get("lines_deleted", 0)))
                for f in data.get("changed_files", [])
            ),
        )


@dataclass(frozen=True, slots=True)
class Batch:
    queue: str
    id: str
    contains: tuple[str, ...]
    dependencies: tuple[str, ...]
    state: BatchState
    version: int
    failure_reason: str = ""
    created_at_ms: int = 0
    updated_at_ms: int = 0
    # a succeeded batch's landed commits: sqid -> one commit per change of the request
    landed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # its members' highest priority, and the conflicting batches of a lower priority
    # (not yet merging) it went ahead of: each gains it as a dependency (the planner,
    # ``app/speculation/priority.py``)
    priority: Priority = Priority.NORMAL
    overtakes: tuple[str, ...] = ()
    # 1: minted for a request whose batch of one failed (its second chance,
    # ``app/domain/second_chance.py``); 0 otherwise
    chance: int = 0


@dataclass(frozen=True, slots=True)
class SpeculationPath:
    """One assumption per dependency of ``head``, in the head's dependency order."""

    head: str
    dependencies: tuple[tuple[str, Assumption], ...]
    _id: str = field(default="", init=False, repr=False, compare=False)
    _sides: tuple[frozenset[str], frozenset[str]] | None = field(
        default=None, init=False, repr=False, compare=False)
    _names: tuple[str, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _base: tuple[str, ...] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def id(self) -> str:
        """A digest of the head and every assumption: worked out once per path (a deep
        queue's planner asks for it many times per run)."""
        if not self._id:
            text = self.head + "".join(f"\n{dep}={a.value}" for dep, a in self.dependencies)
            object.__setattr__(self, "_id", hashlib.sha256(text.encode("utf-8")).hexdigest())
        return self._id

    @property
    def sides(self) -> tuple[frozenset[str], frozenset[str]]:
        """(dependencies assumed to succeed, those assumed to fail), worked out once."""
        if self._sides is None:
            object.__setattr__(self, "_sides", (
                frozenset(d for d, a in self.dependencies if a is Assumption.SUCCEEDS),
                frozenset(d for d, a in self.dependencies if a is Assumption.FAILS)))
        assert self._sides is not None
        return self._sides

    @property
    def names(self) -> tuple[str, ...]:
        """The dependencies it makes an assumption about, in order, worked out once (a
        path is valid for its head while these equal the head's dependency list)."""
        if self._names is None:
            object.__setattr__(self, "_names", tuple(d for d, _ in self.dependencies))
        assert self._names is not None
        return self._names

    @property
    def base(self) -> tuple[str, ...]:
        """Dependencies built underneath the head (assumed to land), in order; worked out
        once."""
        if self._base is None:
            object.__setattr__(self, "_base", tuple(
                dep for dep, a in self.dependencies if a is Assumption.SUCCEEDS))
        assert self._base is not None
        return self._base


@dataclass(frozen=True, slots=True)
class PathEntry:
    path: SpeculationPath
    status: PathStatus
    attempt: int = 1
    created_at_ms: int = 0
    updated_at_ms: int = 0
    rebuilds: int = 0  # new attempts because the target moved (they spend no build budget)
    retried: int = 0  # new attempts after a failed build (``speculation.retries``)
    vindicated: int = 0  # new attempts after a failure a dependent's passed build cleared

    @property
    def id(self) -> str:
        return self.path.id


@dataclass(frozen=True, slots=True)
class PathSet:
    queue: str
    head: str
    entries: tuple[PathEntry, ...] = ()
    version: int = 0  # 0 = not stored yet

    def get(self, path_id: str) -> PathEntry | None:
        return next((e for e in self.entries if e.id == path_id), None)


@dataclass(frozen=True, slots=True)
class Build:
    queue: str
    id: str
    batch_id: str
    path_id: str
    attempt: int
    status: BuildStatus
    version: int
    log_url: str = ""
    created_at_ms: int = 0
    updated_at_ms: int = 0
    # What it tested, as its runner reported (empty until the tree is made, and for
    # runners that record no trees): the target tip, the changes applied, the commit
    # and its tree hash. ``epoch``: the queue's trunk epoch when it was triggered.
    base_sha: str = ""
    commit_sha: str = ""
    tree_sha: str = ""
    changes: tuple[str, ...] = ()
    epoch: int = 0
    # The runner's last words on it (``BuildReport.detail``, at most 2,000 characters),
    # e.g. why it ended ``errored``.
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RequestLog:
    """One entry of a request's history (gateway-owned), as carried on the ``log`` topic."""

    queue: str
    request_id: str
    timestamp_ms: int
    type: LogType
    status: str = ""
    event: str = ""
    request_version: int = 0
    last_error: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    log_id: str = ""


@dataclass(frozen=True, slots=True)
class RequestSummary:
    queue: str
    request_id: str
    change_uris: tuple[str, ...]
    received_at_ms: int
    status: str
    request_version: int
    status_timestamp_ms: int
    version: int
    last_error: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    submitted_by: str = ""  # the actor who asked (app/domain/access.py); "" = unknown
    priority: Priority = Priority.NORMAL  # as accepted (normal before 0011)
