"""The live-update service behind ``GET /api/v1/events`` (``app/api/events.py``): one
request-log poller per process (:class:`EventHub`) feeding every open stream. The
runtime owns the hub (``Runtime.event_hub``) and closes it at shutdown.

**Across processes.** Nothing is broadcast in memory: the poller (started by the first
stream, stopped after the last) reads the request log every :data:`POLL_MS` ms from
where it left off, so a change written by any gateway sharing the database reaches
every stream. Log ids come from a sequence, and on PostgreSQL a transaction can commit
a lower id after a higher one was read: :class:`LogCursor` keeps re-reading such gaps
for :data:`GAP_GRACE_MS` before it gives up on them (a rolled-back or ignored insert
leaves a gap forever).

**Bounds and shutdown.** At most :data:`MAX_STREAMS` streams per process (more ->
``TooManyStreams``, a 503 with ``Retry-After``; a stream's slot is taken in the same
step as the count is checked, so a burst of connections cannot overshoot). A stream
ends when its client disconnects, when it falls more than :data:`MAX_BACKLOG` events
behind (``overflow``), and when the process is told to stop: uvicorn waits for open
responses before it shuts down (and so before the lifespan closes the hub), so while
streams are open the hub chains itself in front of the SIGINT and SIGTERM handlers and
ends every stream at once (the previous handler still runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable
from types import FrameType
from typing import Any

from app.db.engine import Database
from app.db.repos import views as view_repo
from app.domain.entities import RequestSummary
from app.domain.errors import TooManyStreams

log = logging.getLogger("submitqueue.views")

POLL_MS = 500
MAX_STREAMS = 100
MAX_BACKLOG = 1000
GAP_GRACE_MS = 5000
MAX_GAP_SPAN = 10_000  # ids tracked as possible late commits below the highest seen
BATCH_LIMIT = 1000
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class LogCursor:
    """The read position in the request log, tolerant of ids that commit late.

    ``position``: every id up to it was delivered or given up on. Ids above it that
    were delivered are remembered so a re-read does not deliver them twice; a missing
    id below the highest one seen is a *gap*, re-read until it shows up or is older
    than ``grace_ms`` (or the read came back full, so the window must move on).
    """

    def __init__(self, position: int, grace_ms: int = GAP_GRACE_MS) -> None:
        self.position = position
        self.grace_ms = grace_ms
        self._delivered: set[int] = set()
        self._gaps: dict[int, int] = {}

    def fold(self, ids: Iterable[int], *, now_ms: int, full: bool = False) -> list[int]:
        """The ids not delivered before (ascending); moves ``position`` on."""
        fresh = sorted(i for i in set(ids) if i > self.position and i not in self._delivered)
        self._delivered.update(fresh)
        if not self._delivered:
            return fresh
        top = max(self._delivered)
        if top - self.position > MAX_GAP_SPAN:  # a jump in the sequence, not late commits
            self._skip_to(top - MAX_GAP_SPAN)
        for gap in range(self.position + 1, top):
            if gap not in self._delivered:
                self._gaps.setdefault(gap, now_ms)
        while self.position < top:
            nxt = self.position + 1
            if nxt in self._delivered:
                self._delivered.discard(nxt)
            elif full or now_ms - self._gaps.get(nxt, now_ms) >= self.grace_ms:
                pass  # given up: rolled back, or an insert that was ignored
            else:
                break
            self._gaps.pop(nxt, None)
            self.position = nxt
        return fresh

    def _skip_to(self, position: int) -> None:
        self.position = position
        self._delivered = {i for i in self._delivered if i > position}
        self._gaps = {i: t for i, t in self._gaps.items() if i > position}

    @property
    def gaps(self) -> int:
        return len(self._gaps)


class Subscriber:
    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.items: deque[tuple[int, RequestSummary]] = deque()
        self.wake = asyncio.Event()
        self.ended: str | None = None  # "closing" | "overflow"

    def push(self, item: tuple[int, RequestSummary]) -> None:
        if self.ended:
            return
        if len(self.items) >= MAX_BACKLOG:
            self.end("overflow")
            return
        self.items.append(item)
        self.wake.set()

    def end(self, why: str) -> None:
        self.ended = self.ended or why
        self.wake.set()


class EventHub:
    """One request-log poller per process feeding every open stream."""

    def __init__(self, db: Database, *, poll_ms: int = POLL_MS,
                 max_streams: int = MAX_STREAMS) -> None:
        self.db = db
        self.poll_ms = poll_ms
        self.max_streams = max_streams
        self.subscribers: set[Subscriber] = set()
        self.closing = False
        self._task: asyncio.Task[None] | None = None
        self._cursor: LogCursor | None = None
        self._stop = asyncio.Event()
        self._cursor_lock = asyncio.Lock()
        self._previous: dict[int, Any] = {}

    async def subscribe(self, queue: str) -> Subscriber:
        if self.closing:
            raise TooManyStreams("no more live streams: the server is shutting down")
        if len(self.subscribers) >= self.max_streams:
            raise TooManyStreams(
                f"no more live streams: {self.max_streams} are open already")
        # The slot is taken before the first await: the check and the take are one step,
        # so a burst of connections cannot all pass the check while one awaits the read.
        sub = Subscriber(queue)
        self.subscribers.add(sub)
        try:
            await self._ensure_cursor()
        except BaseException:
            self.unsubscribe(sub)
            raise
        if self.closing:
            self.unsubscribe(sub)
            raise TooManyStreams("no more live streams: the server is shutting down")
        if self._task is None or self._task.done():
            self._stop.clear()
            self._task = asyncio.create_task(self._run(), name="sq-event-hub")
            self._chain_signals()
        return sub

    async def _ensure_cursor(self) -> None:
        if self._cursor is not None:
            return
        async with self._cursor_lock:  # one read for a burst, not one per stream
            if self._cursor is None:
                async with self.db.read() as s:
                    self._cursor = LogCursor(await view_repo.last_log_id(s))

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        if not self.subscribers:
            self._stop.set()

    def close(self) -> None:
        """End every stream now and refuse new ones."""
        self.closing = True
        for sub in list(self.subscribers):
            sub.end("closing")
        self._stop.set()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """``close``, then wait (bounded) for the poller to finish its read, so the
        database can be disposed without a connection still checked out."""
        self.close()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout_s)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _run(self) -> None:
        try:
            while self.subscribers and not self.closing:
                try:
                    await self.poll()
                except Exception:
                    log.warning("event poll failed; retrying", exc_info=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.poll_ms / 1000)
                if not self.closing:
                    self._stop.clear()  # set by a last unsubscribe; the loop re-checks
        finally:
            self._cursor = None if not self.subscribers else self._cursor
            self._unchain_signals()

    async def poll(self) -> int:
        """One read of the log; returns how many events were handed out."""
        cursor = self._cursor
        if cursor is None:
            return 0
        async with self.db.read() as s:
            marks = await view_repo.log_marks(s, after_id=cursor.position, limit=BATCH_LIMIT)
        fresh = set(cursor.fold([m.id for m in marks], now_ms=int(time.monotonic() * 1000),
                                full=len(marks) >= BATCH_LIMIT))
        wanted = {sub.queue for sub in self.subscribers}
        changed: dict[str, dict[str, int]] = {}
        for m in marks:
            if m.id in fresh and m.queue in wanted:
                changed.setdefault(m.queue, {})[m.request_id] = m.id
        if not changed:
            return 0
        sent = 0
        async with self.db.read() as s:
            for queue, requests in changed.items():
                found = await view_repo.summaries(s, queue=queue, request_ids=requests)
                for rid, summary in sorted(found.items(), key=lambda kv: requests[kv[0]]):
                    for sub in list(self.subscribers):
                        if sub.queue == queue:
                            sub.push((requests[rid], summary))
                            sent += 1
        return sent

    # -- shutdown on SIGINT/SIGTERM while streams are open ---------------------------

    def _chain_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            previous = signal.getsignal(sig)

            def handler(signum: int, frame: FrameType | None,
                        previous: Any = previous) -> None:
                with contextlib.suppress(RuntimeError):  # its loop may be gone already
                    loop.call_soon_threadsafe(self.close)
                if callable(previous):
                    previous(signum, frame)
                elif previous == signal.SIG_DFL and signum == signal.SIGINT:
                    signal.default_int_handler(signum, frame)

            try:
                signal.signal(sig, handler)
            except (ValueError, OSError):  # not allowed here: leave it
                continue
            self._previous[sig] = (previous, handler)

    def _unchain_signals(self) -> None:
        for sig, (previous, handler) in list(self._previous.items()):
            if signal.getsignal(sig) is handler:
                with contextlib.suppress(ValueError, OSError):
                    signal.signal(sig, previous)
        self._previous.clear()
