"""A queue's freeze as the pages, the view APIs, the CLI and ``/metrics`` show it
(``app/domain/freeze.py``; read fresh, manual freeze and ``queues.yaml`` windows)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from app.db.engine import Database
from app.db.repos import freezes as freeze_repo
from app.domain.freeze import Freeze, FreezeWindowConfig, current, text


class FreezeView(BaseModel):
    """``frozen`` false (and nothing else set) when the queue lands as usual."""

    frozen: bool = False
    reason: str = ""
    since_ms: int | None = Field(default=None, description="when it began (epoch ms)")
    until_ms: int | None = Field(default=None, description="when it ends by itself; "
                                 "null: until unfrozen")
    by: str = Field(default="", description="who froze it (a token's label), or "
                    "queues.yaml for a window")
    allow_builds: bool = True
    allow_hotfix: bool = False
    source: str | None = Field(default=None, description="manual | window")
    text: str = Field(default="", description="one line: 'frozen: <reason> (...)'")

    @classmethod
    def of(cls, freeze: Freeze | None) -> FreezeView:
        if freeze is None:
            return cls()
        return cls(frozen=True, reason=freeze.reason, since_ms=freeze.since_ms,
                   until_ms=freeze.until_ms or None, by=freeze.by,
                   allow_builds=freeze.allow_builds, allow_hotfix=freeze.allow_hotfix,
                   source=freeze.source.value, text=text(freeze))


async def freeze_view(db: Database, queue: str, now_ms: int,
                      windows: tuple[FreezeWindowConfig, ...]) -> FreezeView:
    async with db.read() as s:
        manual = await freeze_repo.get(s, queue=queue)
    return FreezeView.of(current(queue, manual, windows, now_ms))


async def frozen_queues(db: Database, windows: Mapping[str, tuple[FreezeWindowConfig, ...]],
                        now_ms: int) -> dict[str, bool]:
    """Whether each queue is frozen now (``submitqueue_queue_frozen``)."""
    async with db.read() as s:
        manual = await freeze_repo.get_many(s, queues=list(windows))
    return {q: current(q, manual.get(q), w, now_ms) is not None for q, w in windows.items()}
