"""Topics, their delivery settings, and the consumer groups that read them.

The topology is declared in code by the composition root and is the same in every
process, so a publisher knows which groups a message must be delivered to
without asking the database. A group added later starts from new messages.

A group may have a *filter* (``Topology.filter``): asked at publish time with the
message's payload, it says whether the group wants the message at all; a message it
refuses gets no delivery for that group (no row, no claim, no ack). A filter that
raises is treated as "wanted", so a filter's bug costs work, never a lost delivery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from app.queue.errors import UnknownTopic

log = logging.getLogger("submitqueue.queue")

Wants = Callable[[Any], bool]

DLQ_SUFFIX = "_dlq"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff between retries: ``initial_ms * 2**(attempt-1)``, capped."""

    initial_ms: int = 200
    max_ms: int = 30_000

    def delay_ms(self, attempt: int) -> int:
        attempt = max(attempt, 1)
        return int(min(self.max_ms, self.initial_ms * (2 ** min(attempt - 1, 30))))


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """How one topic is delivered.

    ``serial``: at most one message of a partition in flight, and a message waiting
    for its retry blocks its partition (strict order). Otherwise messages of one
    partition start in publish order but may overlap; only a ``hold`` blocks the
    partition.
    """

    name: str
    serial: bool = False
    max_attempts: int = 5
    backoff: Backoff = field(default_factory=Backoff)
    visibility_timeout_ms: int = 60_000
    dlq: bool = True
    always_retry: bool = False

    @property
    def dlq_name(self) -> str:
        return self.name + DLQ_SUFFIX

    @property
    def is_dlq(self) -> bool:
        return self.name.endswith(DLQ_SUFFIX)


def dlq_spec_for(spec: TopicSpec) -> TopicSpec:
    """The companion dead-letter topic: always retryable, very high cap, no DLQ of its own."""
    return TopicSpec(
        name=spec.dlq_name,
        serial=False,
        max_attempts=1000,
        backoff=Backoff(initial_ms=500, max_ms=60_000),
        visibility_timeout_ms=spec.visibility_timeout_ms,
        dlq=False,
        always_retry=True,
    )


class Topology:
    """Registry of topics and the consumer groups subscribed to each."""

    def __init__(self) -> None:
        self._topics: dict[str, TopicSpec] = {}
        self._groups: dict[str, list[str]] = {}
        self._filters: dict[tuple[str, str], Wants] = {}

    def declare(self, spec: TopicSpec) -> TopicSpec:
        if not spec.name or len(spec.name) > 200:
            raise ValueError(f"topic name must be 1..200 characters: {spec.name!r}")
        existing = self._topics.get(spec.name)
        if existing is not None and existing != spec:
            raise ValueError(f"topic {spec.name!r} declared twice with different settings")
        self._topics[spec.name] = spec
        self._groups.setdefault(spec.name, [])
        if spec.dlq:
            self.declare(dlq_spec_for(spec))
        return spec

    def subscribe(self, topic: str, group: str) -> None:
        self.spec(topic)
        groups = self._groups[topic]
        if group not in groups:
            groups.append(group)
            groups.sort()

    def filter(self, topic: str, group: str, wants: Wants) -> None:
        """Deliver ``topic``'s messages to ``group`` only when ``wants(payload)``."""
        if group not in self.groups(topic):
            raise ValueError(f"group {group!r} is not subscribed to {topic!r}")
        self._filters[(topic, group)] = wants

    def groups_for(self, topic: str, payload: Any) -> list[str]:
        """The groups that get a delivery of a message of ``topic`` with ``payload``."""
        groups = self.groups(topic)
        if not self._filters:
            return groups
        return [g for g in groups if self._wanted(topic, g, payload)]

    def _wanted(self, topic: str, group: str, payload: Any) -> bool:
        wants = self._filters.get((topic, group))
        if wants is None:
            return True
        try:
            return bool(wants(payload))
        except Exception:  # a filter's bug must not lose a delivery
            log.warning("a group's filter failed; the message is delivered to it",
                        exc_info=True, extra={"topic": topic, "group": group})
            return True

    def spec(self, topic: str) -> TopicSpec:
        try:
            return self._topics[topic]
        except KeyError:
            raise UnknownTopic(
                f"topic {topic!r} is not declared; declared topics: {sorted(self._topics)}"
            ) from None

    def groups(self, topic: str) -> list[str]:
        self.spec(topic)
        return list(self._groups[topic])

    def topics(self) -> Iterable[TopicSpec]:
        return list(self._topics.values())
