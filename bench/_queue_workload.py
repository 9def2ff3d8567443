"""The queue benchmark's workload shape and handler hook, shared with its competitors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

OnStart = Callable[[str, int, int], None]  # (phase, partition, index) at handler start


@dataclass(frozen=True)
class Workload:
    messages: int
    partitions: int
    publishers: int
    consumers: int
    concurrency: int
    latency_messages: int
    latency_rate: float
    timeout: float

    def plan(self) -> list[list[tuple[int, int]]]:
        """Per publisher, the (partition, index) pairs it publishes, in order."""
        plans: list[list[tuple[int, int]]] = [[] for _ in range(self.publishers)]
        for k in range(self.messages):
            p = k % self.partitions
            plans[p % self.publishers].append((p, k // self.partitions))
        return plans
