"""Wires topics to controllers: the topology every process shares, and its consumers.

The land pipeline's stages are added here as they are built; the foundation
declares no topics yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.queue import ConsumerSpec, Topology


@dataclass
class Pipeline:
    topology: Topology = field(default_factory=Topology)
    consumers: list[ConsumerSpec] = field(default_factory=list)


def build_pipeline() -> Pipeline:
    return Pipeline()
