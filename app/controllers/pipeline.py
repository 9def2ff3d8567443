"""Wires the stage registry (``stages.py``) into the queue: the topology every process
shares, its consumers, and the DLQ reconcilers.

Every topic has a ``{topic}_dlq`` companion. Each orchestrator topic's DLQ is read by
group ``orchestrator-dlq``, ``log_dlq`` by ``gateway-dlq``; the reconcilers
(``app/controllers/dlq/reconcilers.py``) drive the entity to its terminal failure.
The table of topics, keys, serial topics and controllers is ``stages.table()``,
printed in ``docs/pipeline.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.controllers import stages as registry
from app.controllers.common import Deps
from app.controllers.dlq.reconcilers import Reconciler
from app.controllers.stages import Stage, Tap
from app.queue import DLQ_SUFFIX, Backoff, ConsumerSpec, TopicSpec, Topology


@dataclass(frozen=True)
class TopicSettings:
    max_attempts: int = 10
    visibility_timeout_ms: int = 60_000
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_ms=100, max_ms=10_000))


def build_topology(settings: TopicSettings | None = None,
                   stages: Sequence[Stage] | None = None) -> Topology:
    cfg = settings or TopicSettings()
    topo = Topology()
    for s in registry.STAGES if stages is None else stages:
        topo.declare(TopicSpec(
            s.topic, serial=bool(s.serial), max_attempts=cfg.max_attempts,
            backoff=cfg.backoff, visibility_timeout_ms=cfg.visibility_timeout_ms))
        topo.subscribe(s.topic, s.group)
        topo.subscribe(s.topic + DLQ_SUFFIX, s.dlq_group)
    for t in _taps(stages):
        topo.subscribe(t.topic, t.group)
    return topo


def install_filters(topology: Topology, deps: Deps,
                    stages: Sequence[Stage] | None = None) -> None:
    """The taps' publish-time filters, which need the queues' configuration: a relay
    group gets no delivery (no row, claim or ack) of a message it would only ack
    unread — e.g. every ``log`` entry of a queue with no notification endpoint."""
    for t in _taps(stages):
        if t.wants is not None:
            topology.filter(t.topic, t.group, functools.partial(t.wants, deps))


def _taps(stages: Sequence[Stage] | None) -> list[Tap]:
    """The taps on the topics of ``stages`` (default: the registry's)."""
    topics = {s.topic for s in (registry.STAGES if stages is None else stages)}
    return [t for t in registry.TAPS if t.topic in topics]


def build_reconcilers(deps: Deps, stages: Sequence[Stage] | None = None,
                      ) -> dict[str, Reconciler]:
    """Every DLQ topic's reconciler, keyed by the DLQ topic name."""
    out: dict[str, Reconciler] = {}
    for s in registry.STAGES if stages is None else stages:
        r = s.reconciler(deps, s.topic)
        out[r.dlq_topic] = r
    return out


def build_consumers(deps: Deps, *, orchestrator: bool = True, gateway: bool = True,
                    concurrency: int = 8, stages: Sequence[Stage] | None = None,
                    ) -> list[ConsumerSpec]:
    """A consumer per stage and per DLQ, for the roles this process plays."""
    stages = registry.STAGES if stages is None else stages
    reconcilers = build_reconcilers(deps, stages)
    mine = [s for s in stages if (gateway if s.gateway else orchestrator)]
    specs = [ConsumerSpec(s.topic, s.group, s.controller(deps), concurrency=concurrency)
             for s in mine]
    specs += [ConsumerSpec(t.topic, t.group, t.controller(deps), concurrency=concurrency)
              for t in _taps(stages) if orchestrator]
    specs += [ConsumerSpec(s.topic + DLQ_SUFFIX, s.dlq_group, reconcilers[s.topic + DLQ_SUFFIX],
                           concurrency=concurrency) for s in mine]
    return specs
