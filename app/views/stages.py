"""Which stage of the pipeline a public status belongs to (the pages group by it)."""

from __future__ import annotations

from app.domain.entities import RequestSummary
from app.domain.states import PublicStatus

TERMINAL = frozenset(s.value for s in PublicStatus if s.terminal)
STAGES = ("incoming", "batching", "speculating", "landing", "cancelling")
_STAGE_OF = {
    "accepted": "incoming", "started": "incoming", "validating": "incoming",
    "validated": "incoming", "batching": "batching", "batched": "batching",
    "speculating": "speculating", "speculated": "landing", "landing": "landing",
    "cancelling": "cancelling",
}


def stage_of(status: str) -> str:
    """A terminal status is its own stage; an unknown one is ``incoming``."""
    return status if status in TERMINAL else _STAGE_OF.get(status, "incoming")


def landed_commits(s: RequestSummary) -> list[str]:
    """The commit each change of a landed request landed as (its ``landed`` status's
    metadata ``commits``, one per change URI in order); [] unless landed."""
    commits = s.metadata.get("commits") if s.status == "landed" else None
    return [str(c) for c in commits] if isinstance(commits, list) else []
