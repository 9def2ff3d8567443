"""Status precedence of the request log: which entry becomes a request's status.

``log_wins(entry, current)`` is a pure function, so redelivered and reordered log
messages fold into the same summary whatever order they arrive in:

1. events never change the status;
2. a summary still ``accepting`` takes any other status (even an older one);
3. an incoming ``accepting`` never wins; an incoming ``accepted`` never replaces
   another status;
4. a *versioned terminal* status (``landed``/``error``/``cancelled`` written with a
   request version > 0) beats anything that is not one; between two of them the
   higher request version wins, then the strictly later timestamp;
5. otherwise the strictly later timestamp wins; an exact tie keeps the current one.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.states import LogType, PublicStatus

_TERMINAL = {PublicStatus.LANDED.value, PublicStatus.ERROR.value, PublicStatus.CANCELLED.value}


@dataclass(frozen=True, slots=True)
class StatusPoint:
    """The fields precedence looks at, for the incoming entry or the current summary."""

    status: str
    request_version: int
    timestamp_ms: int

    @property
    def versioned_terminal(self) -> bool:
        return self.request_version > 0 and self.status in _TERMINAL


def log_wins(entry_type: LogType, incoming: StatusPoint, current: StatusPoint) -> bool:
    if entry_type is not LogType.STATUS:
        return False
    if current.status == PublicStatus.ACCEPTING:
        return incoming.status != PublicStatus.ACCEPTING
    if incoming.status == PublicStatus.ACCEPTING:
        return False
    if incoming.status == PublicStatus.ACCEPTED and current.status != PublicStatus.ACCEPTED:
        return False
    if incoming.versioned_terminal != current.versioned_terminal:
        return incoming.versioned_terminal
    if incoming.versioned_terminal and incoming.request_version != current.request_version:
        return incoming.request_version > current.request_version
    return incoming.timestamp_ms > current.timestamp_ms
