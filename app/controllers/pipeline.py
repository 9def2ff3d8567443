"""Wires topics to controllers: the topology every process shares, and its consumers.

| Topic | Partition | Serial | Consumer group -> controller |
|---|---|---|---|
| ``start`` | queue | | orchestrator -> StartController |
| ``validate`` | queue | yes (duplicate check + claim) | orchestrator -> ValidateController |
| ``mergecheck`` | sqid | | orchestrator -> MergeCheckController |
| ``mergeconflictsignal`` | sqid | | orchestrator -> MergeConflictSignalController |
| ``batch`` | queue | | orchestrator -> BatchController |
| ``dependency_analysis`` | queue | yes (one order of batches) | orchestrator -> DependencyAnalysisController |
| ``speculate`` | queue | yes (one run per queue) | orchestrator -> SpeculateController |
| ``build`` | batch id | | orchestrator -> BuildController |
| ``buildsignal`` | build id | yes (polling) | orchestrator -> BuildSignalController |
| ``merge`` | queue | yes (one landing at a time) | orchestrator -> MergeController |
| ``mergesignal`` | queue | | orchestrator -> MergeSignalController |
| ``conclude`` | queue | | orchestrator -> ConcludeController |
| ``cancel`` | sqid | | orchestrator -> CancelController |
| ``log`` | sqid | yes | gateway-log -> GatewayLogController |

Every topic has a ``{topic}_dlq`` companion. Each orchestrator topic's DLQ is read by
group ``orchestrator-dlq``, ``log_dlq`` by ``gateway-dlq``; the reconcilers
(``app/controllers/dlq/reconcilers.py``) drive the entity to its terminal failure.
"""  # noqa: E501 - state tables read best unwrapped

from __future__ import annotations

from dataclasses import dataclass, field

from app.controllers.batch import BatchController
from app.controllers.build import BuildController
from app.controllers.buildsignal import BuildSignalController
from app.controllers.cancel import CancelController
from app.controllers.common import Deps
from app.controllers.conclude import ConcludeController
from app.controllers.dependency_analysis import DependencyAnalysisController
from app.controllers.dlq import build_reconcilers
from app.controllers.gateway_log import GatewayLogController
from app.controllers.merge import MergeController
from app.controllers.mergecheck import MergeCheckController
from app.controllers.mergeconflictsignal import MergeConflictSignalController
from app.controllers.mergesignal import MergeSignalController
from app.controllers.speculate import SpeculateController
from app.controllers.start import StartController
from app.controllers.validate import ValidateController
from app.domain import messages as m
from app.queue import DLQ_SUFFIX, Backoff, ConsumerSpec, Controller, TopicSpec, Topology

SERIAL = {m.VALIDATE, m.DEPENDENCY_ANALYSIS, m.SPECULATE, m.BUILDSIGNAL, m.MERGE, m.LOG}


@dataclass(frozen=True)
class TopicSettings:
    max_attempts: int = 10
    visibility_timeout_ms: int = 60_000
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_ms=100, max_ms=10_000))


def build_topology(settings: TopicSettings | None = None) -> Topology:
    cfg = settings or TopicSettings()
    topo = Topology()
    for name in (*m.ORCHESTRATOR_TOPICS, m.LOG):
        topo.declare(TopicSpec(
            name, serial=name in SERIAL, max_attempts=cfg.max_attempts,
            backoff=cfg.backoff, visibility_timeout_ms=cfg.visibility_timeout_ms))
        topo.subscribe(name, m.GATEWAY_LOG_GROUP if name == m.LOG else m.ORCHESTRATOR_GROUP)
        topo.subscribe(name + DLQ_SUFFIX, dlq_group(name))
    return topo


def dlq_group(topic: str) -> str:
    """The consumer group that reconciles ``{topic}_dlq``."""
    return m.GATEWAY_DLQ_GROUP if topic == m.LOG else m.ORCHESTRATOR_DLQ_GROUP


def build_consumers(deps: Deps, *, orchestrator: bool = True, gateway: bool = True,
                    concurrency: int = 8) -> list[ConsumerSpec]:
    controllers: dict[str, Controller] = {
        m.START: StartController(deps),
        m.VALIDATE: ValidateController(deps),
        m.MERGECHECK: MergeCheckController(deps),
        m.MERGECONFLICTSIGNAL: MergeConflictSignalController(deps),
        m.BATCH: BatchController(deps),
        m.DEPENDENCY_ANALYSIS: DependencyAnalysisController(deps),
        m.SPECULATE: SpeculateController(deps),
        m.BUILD: BuildController(deps),
        m.BUILDSIGNAL: BuildSignalController(deps),
        m.MERGE: MergeController(deps),
        m.MERGESIGNAL: MergeSignalController(deps),
        m.CONCLUDE: ConcludeController(deps),
        m.CANCEL: CancelController(deps),
    }
    reconcilers = build_reconcilers(deps)
    specs: list[ConsumerSpec] = []
    if orchestrator:
        specs += [ConsumerSpec(topic, m.ORCHESTRATOR_GROUP, c, concurrency=concurrency)
                  for topic, c in controllers.items()]
        specs += [ConsumerSpec(topic + DLQ_SUFFIX, m.ORCHESTRATOR_DLQ_GROUP,
                               reconcilers[topic + DLQ_SUFFIX], concurrency=concurrency)
                  for topic in controllers]
    if gateway:
        specs.append(ConsumerSpec(m.LOG, m.GATEWAY_LOG_GROUP,
                                  GatewayLogController(deps.db, deps.metrics),
                                  concurrency=concurrency))
        specs.append(ConsumerSpec(m.LOG + DLQ_SUFFIX, m.GATEWAY_DLQ_GROUP,
                                  reconcilers[m.LOG + DLQ_SUFFIX], concurrency=concurrency))
    return specs
