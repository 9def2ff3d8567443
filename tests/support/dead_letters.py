"""Test doubles shared by the state tables of dead letters and of the GitHub check-run:
the reconciler of a dead letter's DLQ as a controller, and a recording check-run
publisher."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.controllers.pipeline import build_reconcilers
from app.domain.checkrun import CheckFacts
from app.queue import Delivery
from tests.support.rig import Rig


class DeadLetters:
    """The reconciler of the dead letter's DLQ; ``failure_detail["group"]`` stands for
    the ``source_group`` the queue records."""

    def __init__(self, deps: Any) -> None:
        self.reconcilers = build_reconcilers(deps)

    async def process(self, delivery: Delivery) -> tuple[str, str, bool]:
        msg = delivery.message
        group = (msg.failure_detail or {}).get("group", "")
        msg = replace(msg, topic=f"{msg.original_topic}_dlq", source_group=group)
        out = await self.reconcilers[msg.topic].reconcile(msg)
        return out.action, out.entity, out.changed


class CheckRecorder:
    """A ``CheckPublisher`` that records the facts it was asked to write (one head
    each), or raises ``answer``; ``attempts`` counts both."""

    def __init__(self, answer: BaseException | None = None) -> None:
        self.answer = answer
        self.written: list[CheckFacts] = []
        self.attempts = 0

    async def publish(self, facts: CheckFacts) -> int:
        self.attempts += 1
        if self.answer is not None:
            raise self.answer
        self.written.append(facts)
        return 1


def checks_on(rig: Rig, answer: BaseException | None = None) -> CheckRecorder:
    """Give the rig's queue a recording check-run publisher."""
    recorder = CheckRecorder(answer)
    rig.configure(github_check=recorder)
    return recorder
