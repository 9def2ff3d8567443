"""What the GitHub resync cancels (pure; ``app/gateway/github_resync.py`` acts).

GitHub does not retry a lost delivery, so the resync compares each live request of a
``github`` queue with its pull request as GitHub has it now and cancels what a lost
``unlabeled``, ``synchronize`` or ``closed`` delivery would have cancelled:

| The request (live, not yet landing) | Its pull request now | Cancel with |
|---|---|---|
| any | not found (404: deleted, or our credentials lost sight of it) | nothing: a credentials problem must not empty the queue |
| any | merged, or closed with the ``merged-by-queue`` label | nothing: it may be the queue's own landing, which the request's status may not show yet |
| any | closed | "pull request #<n> was closed" |
| any | open, into another base | "pull request #<n> now targets '<base>'; this queue lands on '<target>'" |
| at another head | open | "superseded by a new push" (removal ``superseded``) |
| queued by the land label (``origin`` ``label``) | open, without the label | "the <label> label was removed" |
| queued by a comment or REST | open, without the label | nothing: the label never queued it |

Every reason but the push's ends with ``RESYNC_NOTE``. ``landing`` and
``cancelling`` requests are left alone (past the point of no return, or already asked).
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.domain.github_config import MERGED_LABEL
from app.domain.removals import SUPERSEDED_BY_PUSH

RESYNC_NOTE = " (seen by the resync: GitHub's delivery saying so was lost)"
#: the statuses the resync may cancel from
CANCELLABLE = frozenset({"accepted", "started", "validating", "validated", "batching",
                         "batched", "speculating", "speculated"})


@dataclass(frozen=True, slots=True)
class PullNow:
    """A pull request as GitHub answers now."""

    number: int
    head: str
    base: str
    state: Literal["open", "closed", "merged"]
    labels: frozenset[str] = frozenset()
    draft: bool = False


@dataclass(frozen=True, slots=True)
class Queued:
    """A live request of one pull request at one head."""

    sqid: str
    number: int
    head: str
    status: str
    origin: str = ""  # "label", "comment", "" (REST, or before origins were kept)


def lost_cancel(queued: Queued, now: PullNow | None, *, target: str,
                land_label: str) -> str | None:
    """The cancel reason for ``queued`` given its pull request ``now`` (None: leave it)."""
    if queued.status not in CANCELLABLE or now is None:
        return None
    n = now.number
    if now.state == "merged" or (now.state == "closed" and MERGED_LABEL in now.labels):
        return None
    if now.state == "closed":
        return f"pull request #{n} was closed{RESYNC_NOTE}"
    if now.base != target:
        return f"pull request #{n} now targets {now.base!r}; this queue lands on " \
               f"{target!r}{RESYNC_NOTE}"
    if now.head != queued.head:
        return SUPERSEDED_BY_PUSH
    if queued.origin == "label" and land_label not in now.labels:
        return f"the {land_label} label was removed{RESYNC_NOTE}"
    return None
