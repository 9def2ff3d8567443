"""Fake clocks: time that moves only when a test says so."""

from __future__ import annotations


class FakeClock:
    """Epoch milliseconds that move only when a test advances them (``clock.now += ms``)."""

    def __init__(self, now: int = 1_800_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class TickingClock(FakeClock):
    """Deterministic time that moves 1 ms on every reading (distinct, ordered stamps)."""

    def __call__(self) -> int:
        self.now += 1
        return self.now
