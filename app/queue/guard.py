"""A consumer's guard: an optional policy asked before and after each handler run.

The queue knows nothing of what the guard guards (in SubmitQueue: circuits of the
external dependencies a message needs, ``app/controllers/outages.py``). It only obeys
the guard's ``Ruling``:

| Asked | Ruling | What the consumer does |
|---|---|---|
| ``before(cd)`` | ``None`` | run the handler |
| ``before(cd)`` | ``hold(ms)`` | do not run it; hold the message ``ms`` (no attempt spent) |
| ``before(cd)`` / ``failed(cd, exc)`` | ``give_up(error, detail)`` | dead-letter it with that error; ``detail`` is merged into the dead letter's failure detail |
| ``failed(cd, exc)`` | ``None`` | the usual: retry (spending an attempt) or dead-letter, as ``classify`` decides |
| ``failed(cd, exc)`` | ``hold(ms)`` | hold the message ``ms``: the failure spends no attempt |
| ``succeeded(cd, held=...)`` | - | told after the handler returned; ``held``: it asked to be seen again (a poll), not done |

A guard that raises is logged and ignored (the message is handled as without one).
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.queue.records import ClaimedDelivery


@dataclass(frozen=True, slots=True)
class Ruling:
    hold_ms: int | None = None
    error: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def hold(cls, ms: int) -> Ruling:
        return cls(hold_ms=max(0, int(ms)))

    @classmethod
    def give_up(cls, error: str, detail: Mapping[str, Any]) -> Ruling:
        return cls(error=error, detail=dict(detail))

    @property
    def gives_up(self) -> bool:
        return self.hold_ms is None


class Guard(Protocol):
    async def before(self, cd: ClaimedDelivery) -> Ruling | None: ...

    async def failed(self, cd: ClaimedDelivery, exc: BaseException) -> Ruling | None: ...

    async def succeeded(self, cd: ClaimedDelivery, *, held: bool) -> None: ...
