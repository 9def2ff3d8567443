"""What a controller sees of one delivered message, and how it learns its lease is gone.

A handler holds its message by a lease: the receipt token of its claim. While the
handler runs, the consumer framework renews the lease every third of the visibility
timeout. The lease is *lost* when the token is no longer the delivery's: the lease
lapsed (the process was paused, or the renewals failed, for longer than the
visibility timeout) and another consumer claimed the message; a restart of this
member took its claims back (see ``app/queue/members.py``); or an operator discarded
the message. From then on the holder must not act on the message:

- a renewal that finds the token stale marks the lease lost and cancels the handler
  (asyncio cancellation, delivered at its next ``await``); the framework then discards
  the handler's outcome without settling anything: no attempt is counted, nothing is
  retried or dead-lettered, the successor owns the message;
- ``await delivery.ensure_held()`` raises ``LeaseLost``. It asks the database (a
  renewal conditional on the token), not a cached flag, so a holder frozen for longer
  than the visibility timeout (a GC pause, SIGSTOP) learns there that it lost the
  message even when no renewal ran meanwhile. Call it right before an external effect
  (a push, a build trigger); it also renews the lease for a full visibility timeout,
  so the effect starts with the whole timeout ahead of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.queue.broker import Broker
from app.queue.errors import LeaseLost
from app.queue.records import ClaimedDelivery, StoredMessage

LeaseExpired = LeaseLost
"""The former name of ``LeaseLost`` (raised by ``Delivery.extend``), kept as an alias."""


class Lease:
    """The lease state shared by every ``Delivery`` of one claim."""

    __slots__ = ("cancelled_handler", "lost")

    def __init__(self) -> None:
        self.lost = False
        self.cancelled_handler = False  # the framework cancelled the handler for it


class Delivery:
    """What a controller sees of one delivered message."""

    __slots__ = ("_broker", "_claimed", "_hold_ms", "_lease", "_lease_ms")

    def __init__(self, broker: Broker, claimed: ClaimedDelivery, lease_ms: int,
                 lease: Lease | None = None) -> None:
        self._broker = broker
        self._claimed = claimed
        self._hold_ms: int | None = None
        self._lease_ms = lease_ms
        self._lease = lease if lease is not None else Lease()

    @property
    def message(self) -> StoredMessage:
        return self._claimed.message

    @property
    def payload(self) -> Any:
        return self._claimed.message.payload

    @property
    def message_id(self) -> str:
        return self._claimed.message.message_id

    @property
    def topic(self) -> str:
        return self._claimed.message.topic

    @property
    def partition_key(self) -> str:
        return self._claimed.message.partition_key

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._claimed.message.metadata

    @property
    def attempt(self) -> int:
        """1 on first delivery; holds and resumed claims do not count, retries and
        lapsed leases do."""
        return self._claimed.attempt

    @property
    def consumer_group(self) -> str:
        return self._claimed.consumer_group

    @property
    def held_ms(self) -> int | None:
        return self._hold_ms

    @property
    def lease_lost(self) -> bool:
        """The lease is known to be lost (a renewal or ``ensure_held`` found it stale)."""
        return self._lease.lost

    def hold(self, ms: int) -> None:
        """Ask to see this message again in ``ms`` without spending an attempt."""
        self._hold_ms = max(int(ms), 0)

    async def extend(self, ms: int | None = None) -> None:
        """Renew the lease for ``ms`` (default: the visibility timeout); the framework
        also does this on its own while you run. Raises ``LeaseLost`` if it is gone."""
        if self._lease.lost:
            raise self._lost()
        ok = await self._broker.extend(self._claimed, lease_ms=ms or self._lease_ms)
        if not ok:
            self._lease.lost = True
            raise self._lost()

    async def ensure_held(self) -> None:
        """Check against the database that this delivery still holds its message, and
        renew the lease; raises ``LeaseLost`` if not. Call it right before an external
        effect that a successor may also perform (push, trigger, notify)."""
        await self.extend()

    def _lost(self) -> LeaseLost:
        return LeaseLost(
            f"the lease of message {self.message_id!r} (topic {self.topic!r}, attempt "
            f"{self.attempt}) was lost: another consumer may hold it now, so this "
            "handler must not act on it"
        )
