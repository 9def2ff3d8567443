"""Member identity: a restarted process takes its own claims back at once, fenced.

A broker may be given a *member id*: a name for the process that stays the same when
the process restarts (configured, or derived from the host and the process's role).
Each start of a member is a new *generation* (``queue_members.generation``, bumped in
the same transaction that takes the claims back). Every claim records the member id
and generation (``queue_deliveries.leased_by``, ``lease_generation``).

When a member starts, it *resumes* the claims an earlier generation of it still holds
(leased by the member, receipt not settled, not taken by anyone else): each becomes
available again at once, without spending its attempt, and its receipt token is
cleared, so the earlier generation's receipts are stale: they can neither settle nor
extend (fencing), and its handlers learn it at their next renewal or
``ensure_held()`` (``app/queue/delivery.py``). The next claim, by this process or
another one, redelivers the message with the same attempt number. Without a member
id (or with another one) the claim comes back only after the visibility timeout, with
an attempt counted, as before.

A message that crashes its process is still dead-lettered: only the first resume of a
delivery is free; a delivery whose holder died again after it was resumed counts its
attempts again (``queue_deliveries.resumes``), so a crash loop ends in the DLQ after
``max_attempts`` restarts.

Two live processes given the same member id by mistake: the later start fences the
earlier one (its in-flight claims are taken over; its handlers are cancelled or get
``LeaseLost`` before an external effect). Both log a warning: the later start when
the previous generation did not stop and was heard from recently, the earlier one
when its heartbeat finds a newer generation. The earlier process keeps working (each
claim still has its own token, so no message is held twice), but every later start
of either one repeats the take-over: give each process its own member id.

Each member sends a heartbeat (``heartbeat_at_ms``) every ``heartbeat_ms`` and marks
a clean stop (``stopped_at_ms``); rows are never deleted (one per member id ever).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.queue.backends import Backend
from app.queue.dialect import Dialect, Stmt
from app.queue.ops import Op

log = logging.getLogger("submitqueue.queue")


@dataclass(frozen=True, slots=True)
class Incarnation:
    """A generation of a member as ``queue_members`` recorded it."""

    generation: int
    incarnation: str  # e.g. "host:pid"
    started_at_ms: int
    heartbeat_at_ms: int
    stopped_at_ms: int | None


@dataclass(frozen=True, slots=True)
class Joined:
    """What a start of a member found and did."""

    generation: int
    previous: Incarnation | None
    resumed: Counter[tuple[str, str]] = field(default_factory=Counter)  # (group, topic)


_MEMBER_COLUMNS = "generation, incarnation, started_at_ms, heartbeat_at_ms, stopped_at_ms"


def _incarnation(row: dict[str, Any]) -> Incarnation:
    stopped = row["stopped_at_ms"]
    return Incarnation(
        generation=int(row["generation"]), incarnation=str(row["incarnation"]),
        started_at_ms=int(row["started_at_ms"]), heartbeat_at_ms=int(row["heartbeat_at_ms"]),
        stopped_at_ms=int(stopped) if stopped is not None else None,
    )


def join(d: Dialect, *, member: str, incarnation: str, now: int) -> Op[Joined]:
    """Start a new generation of ``member`` and resume the claims earlier ones hold."""
    lock = " FOR UPDATE" if d.is_postgres else ""
    rows = yield Stmt(
        f"SELECT {_MEMBER_COLUMNS} FROM queue_members WHERE member_id = :m{lock}",
        {"m": member},
    )
    previous = _incarnation(rows[0]) if rows else None
    rows = yield Stmt(
        """INSERT INTO queue_members
             (member_id, generation, incarnation, started_at_ms, heartbeat_at_ms, stopped_at_ms)
           VALUES (:m, 1, :inc, :now, :now, NULL)
           ON CONFLICT (member_id) DO UPDATE
           SET generation = queue_members.generation + 1, incarnation = :inc,
               started_at_ms = :now, heartbeat_at_ms = :now, stopped_at_ms = NULL
           RETURNING generation""",
        {"m": member, "inc": incarnation, "now": now},
    )
    generation = int(rows[0]["generation"])
    # Only a delivery's first resume leaves its attempt unspent (a crash loop still
    # ends in the DLQ). SET expressions read the row as it was before the update.
    rows = yield Stmt(
        """UPDATE queue_deliveries
           SET available_at_ms = :now, lease_token = NULL, leased_by = NULL,
               lease_generation = NULL, resumes = resumes + 1,
               attempts = CASE WHEN resumes = 0 AND attempts > 0 THEN attempts - 1
                               ELSE attempts END
           WHERE leased_by = :m AND lease_token IS NOT NULL
             AND (lease_generation IS NULL OR lease_generation < :gen)
           RETURNING consumer_group, topic""",
        {"m": member, "gen": generation, "now": now},
    )
    resumed: Counter[tuple[str, str]] = Counter(
        (str(r["consumer_group"]), str(r["topic"])) for r in rows)
    for topic in sorted({t for _, t in resumed}):
        wake = d.notify(topic)
        if wake is not None:
            yield wake
    return Joined(generation=generation, previous=previous, resumed=resumed)


def heartbeat(*, member: str, generation: int, now: int) -> Op[Incarnation | None]:
    """Record that this generation is alive; the newer generation if it was superseded."""
    rows = yield Stmt(
        """UPDATE queue_members SET heartbeat_at_ms = :now
           WHERE member_id = :m AND generation = :gen RETURNING generation""",
        {"m": member, "gen": generation, "now": now},
    )
    if rows:
        return None
    rows = yield Stmt(f"SELECT {_MEMBER_COLUMNS} FROM queue_members WHERE member_id = :m",
                      {"m": member})
    return _incarnation(rows[0]) if rows else None


def leave(*, member: str, generation: int, now: int) -> Op[None]:
    """Record a clean stop (the consumers released their claims already)."""
    yield Stmt(
        """UPDATE queue_members SET stopped_at_ms = :now, heartbeat_at_ms = :now
           WHERE member_id = :m AND generation = :gen""",
        {"m": member, "gen": generation, "now": now},
        last=True,
    )


class Membership:
    """One member's generation: joined at broker start, heartbeat, left at close."""

    def __init__(self, backend: Backend, member_id: str, *, incarnation: str,
                 clock: Callable[[], int], heartbeat_ms: int = 10_000) -> None:
        self.backend = backend
        self.member_id = member_id
        self.incarnation = incarnation
        self.clock = clock
        self.heartbeat_ms = max(int(heartbeat_ms), 10)
        self.generation: int | None = None
        self.superseded_by: Incarnation | None = None
        self._beat: asyncio.Task[None] | None = None

    async def join(self) -> Joined:
        now = self.clock()
        joined = await self.backend.run(join(self.backend.dialect, member=self.member_id,
                                             incarnation=self.incarnation, now=now))
        self.generation = joined.generation
        self.superseded_by = None
        self._report(joined, now)
        self._beat = asyncio.create_task(self._beat_forever(joined.generation))
        return joined

    def _report(self, joined: Joined, now: int) -> None:
        prev = joined.previous
        ids = {"member_id": self.member_id, "generation": joined.generation,
               "resumed": sum(joined.resumed.values())}
        if prev is not None and prev.stopped_at_ms is None \
                and now - prev.heartbeat_at_ms < 2 * self.heartbeat_ms:
            log.warning(
                "member started while its previous generation did not stop and was heard "
                "from recently: it crashed just now, or another live process uses the same "
                "member id; that process is fenced (its claims are taken over). Give each "
                "process its own member id.",
                extra={**ids, "previous_incarnation": prev.incarnation,
                       "previous_generation": prev.generation,
                       "previous_heartbeat_age_ms": now - prev.heartbeat_at_ms})
        elif joined.resumed:
            log.info("member resumed the claims of its previous generation", extra=ids)

    async def _beat_forever(self, generation: int) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_ms / 1000)
            try:
                newer = await self.backend.run(heartbeat(
                    member=self.member_id, generation=generation, now=self.clock()))
            except Exception:
                log.warning("member heartbeat failed", extra={"member_id": self.member_id})
                continue
            if newer is not None and self.superseded_by is None:
                self.superseded_by = newer
                log.warning(
                    "this process was superseded by a later start with the same member id: "
                    "its in-flight claims were taken over. Two live processes must not "
                    "share a member id.",
                    extra={"member_id": self.member_id, "generation": generation,
                           "newer_generation": newer.generation,
                           "newer_incarnation": newer.incarnation})

    async def leave(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
            self._beat = None
        if self.generation is not None and self.superseded_by is None:
            try:
                await self.backend.run(leave(member=self.member_id,
                                             generation=self.generation, now=self.clock()))
            except Exception:
                log.warning("could not record the member's stop",
                            extra={"member_id": self.member_id})
