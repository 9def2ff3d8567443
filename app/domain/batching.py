"""Multi-request batches: how many requests one batch may take, and how a failed batch
is bisected. Pure; the ``batch``, ``dependency_analysis`` and ``conclude`` controllers
apply it.

**Size.** ``batching.max_size`` requests at most; with ``adaptive`` the limit follows
an AIMD rule over the queue's most recent concluded batches, oldest first: start at
``max_size``, +1 per batch that landed, halved (at least 1) per batch that failed.
Recomputed from the stored outcomes every time (nothing kept in memory), so every
process and every redelivery agree. AIMD rather than following the backlog: a
failure costs a bisection (more builds, later landings) whatever the backlog, so the
size should shrink when changes are failing and grow back while they land (Zuul's
window does the same for its pipeline depth).

**Bisection.** A failed batch of several requests is not the members' verdict: its
live members are split into ``ways`` consecutive parts (``split``), each a new batch
in the original's order, so each part is built on top of the parts before it (it
depends on them when they conflict, like any later batch) and speculation builds the
parts side by side within the budget. A part that lands is done; a failing part of
several is split again; a failing part of one member is that member's verdict, and its
reason names the build that failed and the bisection that isolated it. Every split
halves a part at least, so a batch of ``n`` is decided after at most ``ceil(log2 n)``
levels. A cancelled batch's members that were not cancelled are batched again as one
part (a cancel is not a failure).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.domain.ids import batch_id, batch_number

SPLIT_CAUSE = "split:"  # a part's claim cause: split:<the failed batch's number>
RECENT_OUTCOMES = 20  # concluded batches the adaptive size looks back over


def window(max_size: int, *, adaptive: bool, recent: Iterable[bool]) -> int:
    """How many requests a new batch may take. ``recent``: whether each of the queue's
    most recent concluded batches landed, oldest first (ignored unless ``adaptive``)."""
    size = max_size
    if adaptive:
        for landed in recent:
            size = min(max_size, size + 1) if landed else max(1, size // 2)
    return max(1, size)


def split(members: Sequence[str], *, ways: int) -> list[tuple[str, ...]]:
    """``members`` in ``ways`` (2 or more, at most one part per member) consecutive
    parts, in order, the earlier parts no smaller than the later ones."""
    n = len(members)
    ways = max(2, min(ways, n))
    base, extra = divmod(n, ways)
    parts: list[tuple[str, ...]] = []
    at = 0
    for i in range(ways):
        size = base + (1 if i < extra else 0)
        parts.append(tuple(members[at:at + size]))
        at += size
    return [p for p in parts if p]


def split_cause(parent: str) -> str:
    """The claim cause of the parts of batch ``parent`` (its number: a cause fits in
    100 characters whatever the queue's name)."""
    return f"{SPLIT_CAUSE}{batch_number(parent)}"


def parent_of(queue: str, cause: str) -> str | None:
    """The failed batch a part was split from, or None for a batch of new requests."""
    if not cause.startswith(SPLIT_CAUSE):
        return None
    return batch_id(queue, int(cause[len(SPLIT_CAUSE):]))
