"""The stage registry: every topic of the pipeline declared once.

An entry says what a topic carries (``payload``), how its messages are partitioned
(``key``: a function of the payload, so no publisher types a partition key), which
controller consumes it in which group, whether it is consumed serially per partition,
and how its dead letters are reconciled (``reconciler``). Everything else derives
from here: the topology (``pipeline.build_topology``), the consumers and the DLQ
wiring (``pipeline.build_consumers``), every publish's partition key
(``Deps.publish``, ``partition_key``), the reconcilers
(``pipeline.build_reconcilers``), and the table in ``docs/pipeline.md`` (a test checks
it against :func:`table`).

Adding a stage is one :class:`Stage` entry plus its controller module
(``docs/pipeline.md``, "Adding a stage", has a worked example).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from app.controllers import github_check, notify
from app.controllers.batch import BatchController
from app.controllers.build import BuildController
from app.controllers.buildsignal import BuildSignalController
from app.controllers.cancel import CancelController
from app.controllers.common import Deps, use_registry
from app.controllers.conclude import ConcludeController
from app.controllers.dependency_analysis import DependencyAnalysisController
from app.controllers.dlq.reconcilers import (
    BatchReconciler,
    BuildReconciler,
    Reconciler,
    RequestReconciler,
)
from app.controllers.gateway_log import GatewayLogController
from app.controllers.github_check import (
    GitHubCheckController,
    GitHubCheckReconciler,
    GitHubCheckRelayController,
)
from app.controllers.merge import MergeController
from app.controllers.mergecheck import MergeCheckController
from app.controllers.mergeconflictsignal import MergeConflictSignalController
from app.controllers.mergesignal import MergeSignalController
from app.controllers.notify import (
    LogDeadLetters,
    NotifyController,
    NotifyReconciler,
    NotifyRelayController,
)
from app.controllers.speculate import SpeculateController
from app.controllers.start import StartController
from app.controllers.validate import ValidateController
from app.domain import messages as m
from app.queue import Controller


def by_queue(msg: Any) -> str:
    return str(msg.queue)


def by_id(msg: Any) -> str:
    return str(msg.id)


def by_request(msg: Any) -> str:
    return str(msg.request_id)


def by_endpoint(msg: Any) -> str:
    return f"{msg.queue}/{msg.endpoint}"


@dataclass(frozen=True)
class Stage:
    topic: str
    payload: type[BaseModel]
    key: Callable[[Any], str]
    key_name: str  # what the key is, for the docs: queue, sqid, batch id, build id
    controller: Callable[[Deps], Controller]
    reconciler: Callable[[Deps, str], Reconciler]
    group: str = m.ORCHESTRATOR_GROUP
    dlq_group: str = m.ORCHESTRATOR_DLQ_GROUP
    serial: str = ""  # why the topic is consumed one message at a time per partition

    @property
    def gateway(self) -> bool:
        """Consumed by the gateway role (else by the orchestrator's workers)."""
        return self.group == m.GATEWAY_LOG_GROUP


def _log_reconciler(deps: Deps, _topic: str) -> Reconciler:
    return LogDeadLetters(deps)  # a LogReconciler that also re-relays the taps'


def _log_controller(deps: Deps) -> Controller:
    return GatewayLogController(deps.db, deps.metrics)


STAGES: tuple[Stage, ...] = (
    Stage(m.START, m.LandRequestMsg, by_queue, "queue", StartController, RequestReconciler),
    Stage(m.CANCEL, m.CancelRequestMsg, by_id, "sqid", CancelController, RequestReconciler),
    Stage(m.VALIDATE, m.EntityMsg, by_queue, "queue", ValidateController, RequestReconciler,
          serial="the duplicate check and the claim"),
    Stage(m.MERGECHECK, m.EntityMsg, by_id, "sqid", MergeCheckController,
          RequestReconciler),
    Stage(m.MERGECONFLICTSIGNAL, m.ResultMsg, by_id, "sqid", MergeConflictSignalController,
          RequestReconciler),
    Stage(m.BATCH, m.EntityMsg, by_queue, "queue", BatchController, RequestReconciler,
          serial="one open batch to join"),
    Stage(m.DEPENDENCY_ANALYSIS, m.EntityMsg, by_queue, "queue",
          DependencyAnalysisController, BatchReconciler, serial="one order of batches"),
    Stage(m.SPECULATE, m.EntityMsg, by_queue, "queue", SpeculateController, BatchReconciler,
          serial="one run per queue"),
    Stage(m.BUILD, m.BuildMsg, by_id, "batch id", BuildController, BatchReconciler),
    Stage(m.BUILDSIGNAL, m.EntityMsg, by_id, "build id", BuildSignalController,
          BuildReconciler, serial="polling"),
    Stage(m.MERGE, m.EntityMsg, by_queue, "queue", MergeController, BatchReconciler,
          serial="one landing at a time"),
    Stage(m.MERGESIGNAL, m.ResultMsg, by_queue, "queue", MergeSignalController,
          BatchReconciler),
    Stage(m.CONCLUDE, m.ConcludeMsg, by_queue, "queue", ConcludeController, BatchReconciler),
    Stage(m.LOG, m.LogMsg, by_request, "sqid", _log_controller, _log_reconciler,
          group=m.GATEWAY_LOG_GROUP, dlq_group=m.GATEWAY_DLQ_GROUP,
          serial="one request's history in order"),
    Stage(m.NOTIFY, m.NotifyMsg, by_endpoint, "queue/endpoint", NotifyController,
          NotifyReconciler, group=m.NOTIFIER_GROUP, dlq_group=m.NOTIFIER_DLQ_GROUP),
    Stage(m.GITHUB_CHECK, m.GitHubCheckMsg, by_id, "sqid", GitHubCheckController,
          GitHubCheckReconciler, group=m.GITHUB_CHECK_GROUP, dlq_group=m.GITHUB_CHECK_DLQ_GROUP,
          serial="one check-run per request, never created twice"),
)


@dataclass(frozen=True)
class Tap:
    """A further consumer group on a stage's topic, run by the worker roles. Its dead
    letters go to that topic's DLQ (``source_group`` = this group), whose reconciler
    must know them (``log_dlq``: ``LogDeadLetters``)."""

    topic: str
    group: str
    controller: Callable[[Deps], Controller]
    #: publish-time filter (``Topology.filter``): which messages the group gets at all
    wants: Callable[[Deps, Any], bool] | None = None


TAPS: tuple[Tap, ...] = (
    Tap(m.LOG, m.NOTIFY_RELAY_GROUP, NotifyRelayController, notify.wants),  # log -> notify
    Tap(m.LOG, m.GITHUB_CHECK_RELAY_GROUP, GitHubCheckRelayController,  # log -> github_check
        github_check.wants),
)


def stage(topic: str) -> Stage:
    """The registry's entry for ``topic`` (``KeyError`` names the known topics)."""
    for s in STAGES:  # read at call time: 15 entries, and a test may extend the registry
        if s.topic == topic:
            return s
    raise KeyError(f"no stage {topic!r} in the registry (known: {topics()})")


def partition_key(topic: str, msg: BaseModel) -> str:
    """The partition key of ``msg`` on ``topic``; a payload of another type is a bug."""
    entry = stage(topic)
    if not isinstance(msg, entry.payload):
        raise TypeError(f"{topic!r} carries {entry.payload.__name__}, "
                        f"not {type(msg).__name__}")
    return entry.key(msg)


def topics() -> list[str]:
    return [s.topic for s in STAGES]


def table() -> str:
    """The registry as the markdown table of ``docs/pipeline.md``."""
    rows = ["| Topic | Payload | Partition | Serial | Consumer group -> controller | DLQ |",
            "|---|---|---|---|---|---|"]
    for s in STAGES:
        name = getattr(s.controller, "__name__", "")
        if name.startswith("_"):  # a factory: name what it builds
            name = {"_log_controller": "GatewayLogController"}.get(name, name)
        serial = f"yes ({s.serial})" if s.serial else ""
        name = "; ".join([f"{s.group} -> {name}", *(
            f"{t.group} -> {t.controller.__name__}" for t in TAPS if t.topic == s.topic)])
        fix = getattr(s.reconciler, "__name__", "")
        fix = {"_log_reconciler": "LogDeadLetters"}.get(fix, fix)
        rows.append(f"| `{s.topic}` | `{s.payload.__name__}` | {s.key_name} | {serial} "
                    f"| {name} | `{s.topic}_dlq`: {s.dlq_group} -> {fix} |")
    return "\n".join(rows)


use_registry(partition_key)
