"""The seams a merge queue plugs into, one protocol each (fakes and real ones).

Errors: an extension raises ``ChangeRejected`` / returns a failed outcome for a
*permanent* problem with the change (a person must act), and lets infrastructure
errors (timeouts, connection errors, HTTP 5xx) propagate: the queue classifies
those as retryable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from app.domain.build_run import BuildRun, TestedTree
from app.domain.checkrun import CheckFacts
from app.domain.entities import ChangeDetails
from app.domain.errors import ChangeRejected as ChangeRejected  # re-exported
from app.domain.queue_config import BatchingConfig, SpeculationConfig
from app.domain.states import BuildStatus, LandStrategy
from app.extensions.notify.webhook import WebhookSink

__all__ = ["TestedTree"]  # re-exported: runners and mergers name it from here


class ChangeProvider(Protocol):
    async def get(self, queue: str, change_uris: Sequence[str]) -> list[ChangeDetails]:
        """Details of each change of a stack, in order."""
        ...


@dataclass(frozen=True, slots=True)
class BatchChanges:
    """What a conflict analyzer knows of a batch: its id and the files it touches."""

    batch_id: str
    files: tuple[str, ...]


class ConflictAnalyzer(Protocol):
    def analyze(self, candidate: BatchChanges, in_flight: Sequence[BatchChanges]) -> list[str]:
        """Ids of the in-flight batches the candidate conflicts with, in input order."""
        ...


@dataclass(frozen=True, slots=True)
class BuildRequest:
    """Build the head batch's changes on top of the base changes (assumed to land).

    ``batch_created_at_ms`` is the head batch's creation time: with the queue, the path
    and the attempt it names this one build across database lifetimes (a database that
    is reset numbers its batches, hence its paths, from 1 again).
    """

    queue: str
    batch_id: str
    path_id: str
    attempt: int
    base_changes: tuple[str, ...]
    head_changes: tuple[str, ...]
    batch_created_at_ms: int = 0
    # The same changes as merge steps (base batches' members, then the head's), so a
    # runner that makes the tree makes it in the shape the strategies land it.
    steps: tuple[MergeStep, ...] = ()

    @property
    def idempotency_key(self) -> str:
        """The same for every trigger of one (queue, path, attempt): a redelivered
        trigger carries it again, a new attempt gets a new one. ASCII, no spaces (queue
        names are ``[A-Za-z0-9._-]``, path ids hex), so it fits an HTTP header."""
        return f"{self.queue}:{self.path_id}:{self.attempt}:{self.batch_created_at_ms}"

    def build_id(self, prefix: str) -> str:
        """A build id derived from ``idempotency_key``: ``<prefix>-<32 hex>``, unique per
        queue, path and attempt, and a valid URL path segment."""
        digest = hashlib.sha256(self.idempotency_key.encode()).hexdigest()[:32]
        return f"{prefix}-{digest}"


@dataclass(frozen=True, slots=True)
class BuildReport:
    status: BuildStatus
    log_url: str = ""
    detail: str = ""
    tested: TestedTree | None = None  # what it builds, once the runner made the tree


class FakeConnectionError(ConnectionError):
    """What the fakes' error markers raise: retryable, but *not* an infrastructure
    outage the outage guard rides out (``infrastructure = False``), so the markers keep
    exercising the retry budget and the dead-letter path (docs/outages.md)."""

    infrastructure = False


class BuildSystemUnavailable(Exception):
    """A runner's build system could not give a verdict for want of itself (the build
    command exited with an infrastructure code; CI not answering): the ``builds``
    dependency is down, not the change's fault (``app/domain/outages.py``)."""

    dependency_kind = "builds"
    retryable = True


class BuildRunner(Protocol):
    async def trigger(self, request: BuildRequest) -> str:
        """Start a build promptly and return its id.

        The queue may deliver a trigger more than once (a lost reply, a crash before the
        build was linked). A runner whose build lives outside this process (webhook)
        must then start no second build: it derives the id from the request
        (``request.build_id``), records the trigger before its external call, and
        returns the same id for the same ``idempotency_key``. Ids are unique across
        queues and attempts and match ``[A-Za-z0-9._-]{1,200}``."""
        ...

    async def status(self, build_id: str) -> BuildReport: ...

    async def cancel(self, build_id: str) -> None:
        """Ask the build to stop (best effort; the status reports when it did)."""
        ...


@dataclass(frozen=True, slots=True)
class PeriodicJob:
    """Work a service wants run every ``interval_ms`` by the runtime's one scheduler
    (``app/scheduler.py``); ``name`` is unique among all jobs of the process."""

    name: str
    interval_ms: int
    run: Callable[[], Awaitable[Any]]


@runtime_checkable
class Service(Protocol):
    """An extension with background work (e.g. the command runner's heartbeat).

    The composition root calls ``start()`` once the database is migrated and ``stop()``
    before it closes the database; between the two, its scheduler runs each of
    ``periodic_jobs()`` (a service starts no loop of its own).
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def periodic_jobs(self) -> Sequence[PeriodicJob]: ...


class BuildStore(Protocol):
    """Where build runners keep their runs, shared by every process of a deployment
    (``app/db/repos/build_runs.py``; ``builds/memory.py`` for a single process).

    A run is *finished* once its status is terminal; ``update`` never changes a
    finished run, so the first verdict stands (the owner's, a lost-run sweep's or a
    CI callback's, whichever came first).
    """

    async def create(self, run: BuildRun) -> None: ...

    async def get(self, build_id: str) -> BuildRun | None: ...

    async def update(
        self, build_id: str, *, now_ms: int, status: BuildStatus | None = None,
        detail: str | None = None, exit_code: int | None = None, log_url: str | None = None,
        pid: int | None = None, tested: TestedTree | None = None,
        heartbeat_ms: int | None = None,
    ) -> BuildRun | None:
        """Change an unfinished run; returns the run as stored afterwards (None if unknown)."""
        ...

    async def nudge(self, queue: str, path_id: str, attempt: int) -> int:
        """Zero ``heartbeat_ms`` of the unfinished runs of (queue, path, attempt), so a
        runner that asks its CI at most so often (``github_checks``) asks at its next
        status; returns how many runs it changed."""
        ...

    async def set_log(self, build_id: str, text: str) -> None:
        """Replace the run's stored log (the runner keeps it bounded)."""
        ...

    async def get_log(self, build_id: str) -> str | None: ...

    async def heartbeat(self, owner: str, now_ms: int, live: Sequence[str]) -> list[str]:
        """Mark ``owner``'s unfinished runs alive; return those of ``live`` it must stop
        (a cancel was requested, or the run was finished by someone else)."""
        ...

    async def request_cancel(self, build_id: str) -> None: ...

    async def unfinished(self, owner_group: str) -> list[BuildRun]:
        """Unfinished runs of every instance of ``owner_group``."""
        ...


Gate = Callable[[], Awaitable[str]]
HELD = "held"  # MergeOutcome.code: the gate refused; nothing was updated


@dataclass(frozen=True, slots=True)
class MergeStep:
    step_id: str  # the request's sqid
    change_uris: tuple[str, ...]
    strategy: LandStrategy


@dataclass(frozen=True, slots=True)
class MergeSpec:
    queue: str
    id: str  # sqid for a check, batch id for a merge
    steps: tuple[MergeStep, ...]
    # For a merge: the trees of the batch's passed builds whose assumptions came true.
    # ``None`` when its runner records no trees (the fake runners); a git merger then
    # lands only a tip whose tree is one of these, else refuses with ``untested_tree``.
    tested: tuple[TestedTree, ...] | None = None
    # For a merge: asked right before the target's ref is updated (a merger that
    # updates a ref in several steps asks after the last step that changes nothing);
    # a non-empty answer (why, e.g. the queue's freeze) means: update nothing, return
    # ``MergeOutcome(succeeded=False, code=HELD, reason=<the answer>)``. The merge
    # stage holds such a message and asks again later (app/controllers/freeze.py).
    gate: Gate | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    """A merger's answer. On success ``outputs`` holds the commit each change landed as
    (one per change, in step order) and ``commits`` the same per step id (request)."""

    succeeded: bool
    reason: str = ""
    outputs: tuple[str, ...] = ()
    conflicting_paths: tuple[str, ...] = field(default_factory=tuple)
    commits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    code: str = ""  # a typed reason for a failure: "untested_tree"
    tip: str = ""  # untested_tree: the target tip the merger found
    moved: bool = False  # untested_tree: that tip is the base of none of the tested trees


class Merger(Protocol):
    async def check(self, spec: MergeSpec) -> MergeOutcome:
        """Dry run: would the steps apply cleanly onto the target now?"""
        ...

    async def merge(self, spec: MergeSpec) -> MergeOutcome:
        """Apply the steps onto the target and publish them as one update.

        Must be idempotent: a step already on the target is recognised, not re-applied.
        """
        ...


class Scorer(Protocol):
    def score(self, batch_id: str, changes: Sequence[ChangeDetails]) -> float:
        """Probability in (0, 1) that the batch ultimately lands."""
        ...


class CheckPublisher(Protocol):
    """Writes a request's ``SubmitQueue`` check-run on its pull requests
    (``app/extensions/github/checkrun.py``)."""

    async def publish(self, facts: CheckFacts) -> int:
        """Bring the check-run of every pull request of ``facts`` up to date; how many."""
        ...


@dataclass(frozen=True, slots=True)
class QueueExtensions:
    provider: ChangeProvider
    analyzer: ConflictAnalyzer
    runner: BuildRunner
    merger: Merger
    scorer: Scorer
    build_budget: int
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    notify: tuple[WebhookSink, ...] = ()  # the queue's notify: endpoints
    github_check: CheckPublisher | None = None  # a GitHub queue's SubmitQueue check-run
