"""Follow land requests until they settle, drawing one line per request.

``Watcher`` polls the gateway (summary, and the history when it may have grown) for
every request not yet settled; ``LiveTable`` draws the rows: redrawn in place with ANSI
cursor moves on a terminal, or one plain line per change of a request otherwise (logs,
CI, pipes). Used by ``submitqueue watch`` and ``submitqueue demo``.

A row: request, changes, elapsed, status, and the stage trail, e.g.
``accepted > started > validating > validated > batching > batched > speculating >
buildingx2 > builtx2 > speculated > landing > landed`` (drawn with U+203A and U+00D7
when the output is UTF-8).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from app.cli.client import TERMINAL, ClientError, GatewayClient, HistoryEntry, RequestSummary

CONSECUTIVE_FAILURES = 10  # polls that may fail on a transient error before giving up
HISTORY_EVERY = 4  # refresh an unchanged request's history every n-th poll (for events)
PLAIN_WIDTH = 130  # progress lines off a terminal elide the trail's middle to fit this


def trail(entries: Sequence[HistoryEntry], *, fancy: bool = True) -> list[str]:
    """The stage trail of a history: statuses in order (repeats dropped), and each run of
    one event under a status counted, e.g. ``buildingx2``."""
    times = "\u00d7" if fancy else "x"
    out: list[str] = []
    counts: dict[str, int] = {}
    order: list[str] = []

    def flush() -> None:
        out.extend(f"{e}{times}{counts[e]}" if counts[e] > 1 else e for e in order)
        counts.clear()
        order.clear()

    for e in entries:
        if e.type == "status":
            flush()
            if not out or out[-1] != e.name:
                out.append(e.name)
        else:
            if e.name not in counts:
                order.append(e.name)
                counts[e.name] = 0
            counts[e.name] += 1
    flush()
    return out


@dataclass
class Row:
    sqid: str
    changes: str
    status: str = "?"
    received_at_ms: int | None = None
    ended_at_ms: int | None = None
    last_error: str = ""
    history: list[HistoryEntry] = field(default_factory=list)
    settled: bool = False

    def elapsed_s(self, now_ms: int) -> float:
        if self.received_at_ms is None:
            return 0.0
        end = self.ended_at_ms if self.ended_at_ms is not None else now_ms
        return max(0.0, (end - self.received_at_ms) / 1000)

    def update(self, summary: RequestSummary, history: list[HistoryEntry] | None) -> None:
        self.status = summary.status
        self.received_at_ms = summary.received_at_ms
        self.last_error = summary.last_error
        if history is not None:
            self.history = history
        if summary.terminal and history is not None:
            ends = [e.timestamp_ms for e in history if e.type == "status"
                    and e.name == summary.status]
            self.ended_at_ms = ends[-1] if ends else summary.received_at_ms
            self.settled = True


def _elide(tokens: list[str], width: int, sep: str, dots: str) -> str:
    """The trail in at most ``width`` characters: its first stage, ``…``, the latest ones."""
    text = sep.join(tokens)
    if len(text) <= width or len(tokens) < 3:
        return text[:max(width, 0)]
    tail: list[str] = []
    for tok in reversed(tokens[1:]):
        candidate = sep.join([tokens[0], dots, tok, *tail])
        if len(candidate) > width:
            break
        tail.insert(0, tok)
    return sep.join([tokens[0], dots, *tail]) if tail else text[:max(width, 0)]


class LiveTable:
    """Draws rows to ``out``: in place on a terminal, one line per change elsewhere."""

    def __init__(self, out: TextIO, *, tty: bool | None = None,
                 fancy: bool | None = None) -> None:
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        encoding = (getattr(out, "encoding", None) or "utf-8").lower().replace("-", "")
        self.fancy = encoding == "utf8" if fancy is None else fancy
        self.sep = " \u203a " if self.fancy else " > "
        self.dots = "\u2026" if self.fancy else "..."
        self._drawn = 0
        self._last: dict[str, tuple[str, int]] = {}
        self._started = time.monotonic()

    def _line(self, row: Row, now_ms: int, width: int | None) -> str:
        head = (f"{row.sqid:14} {row.changes:24} {row.elapsed_s(now_ms):6.1f}s  "
                f"{row.status:11} ")
        tokens = trail(row.history, fancy=self.fancy)
        if width is None:
            return head + self.sep.join(tokens)
        return head + _elide(tokens, width - len(head) - 1, self.sep, self.dots)

    def header(self) -> str:
        return f"{'REQUEST':14} {'CHANGES':24} {'ELAPSED':>7}  {'STATUS':11} TRAIL"

    def draw(self, rows: Sequence[Row], title: str = "") -> None:
        now_ms = int(time.time() * 1000)
        if self.tty:
            size = shutil.get_terminal_size((120, 24))
            width = size.columns
            room = max(size.lines - 3, 3)  # rows that fit below the title and the header
            shown = list(rows)
            if len(shown) > room:  # live ones first, then the latest settled ones
                live = [r for r in shown if not r.settled]
                keep = {id(r) for r in (live + [r for r in reversed(shown) if r.settled])
                        [:room - 1]}
                shown = [r for r in shown if id(r) in keep]
            lines = [title] if title else []
            lines.append(self.header())
            lines += [self._line(r, now_ms, width) for r in shown]
            if len(shown) < len(rows):
                lines.append(f"({len(rows) - len(shown)} more settled requests not shown)")
            body = "".join(f"\x1b[2K{line[:width - 1]}\n" for line in lines)
            self.out.write(self._rewind() + body + "\x1b[J")
            self._drawn = len(lines)
        else:
            for r in rows:
                key = (r.status, len(r.history))
                if self._last.get(r.sqid) == key:
                    continue
                self._last[r.sqid] = key
                t = time.monotonic() - self._started
                self.out.write(f"[{t:6.1f}s] {self._line(r, now_ms, PLAIN_WIDTH)}\n")
        self.out.flush()

    def _rewind(self) -> str:
        """ANSI: back to the first line drawn last time (nothing if none was)."""
        return f"\x1b[{self._drawn}F" if self._drawn else ""

    def final(self, rows: Sequence[Row]) -> None:
        """The whole table once more, each trail in full (on a terminal: in place of the
        live table)."""
        if self.tty:
            self.out.write(self._rewind() + "\x1b[J")
            self._drawn = 0
        now_ms = int(time.time() * 1000)
        self.out.write(self.header() + "\n")
        for r in rows:
            self.out.write(self._line(r, now_ms, None) + "\n")
        self.out.flush()


class Watcher:
    """Polls the gateway for its rows until every one has settled."""

    def __init__(self, client: GatewayClient, table: LiveTable, *, poll_s: float = 0.5,
                 title: str = "") -> None:
        self.client = client
        self.table = table
        self.poll_s = poll_s
        self.title = title
        self.rows: dict[str, Row] = {}
        self._polls = 0

    def add(self, row: Row) -> None:
        self.rows[row.sqid] = row

    @property
    def unsettled(self) -> list[Row]:
        return [r for r in self.rows.values() if not r.settled]

    async def _refresh(self, row: Row) -> None:
        summary = await self.client.summary(row.sqid)
        changed = summary.status != row.status
        history = None
        if changed or summary.terminal or self._polls % HISTORY_EVERY == 0:
            history = await self.client.history(row.sqid)
            if not summary.terminal and any(
                    e.type == "status" and e.name in TERMINAL for e in history):
                summary = await self.client.summary(row.sqid)  # it ended in between
        row.update(summary, history)

    async def poll_once(self) -> None:
        self._polls += 1
        rows = list(self.rows.values())  # rows added while this poll runs wait for the next
        await asyncio.gather(*(self._refresh(r) for r in rows if not r.settled))
        done = sum(r.settled for r in rows)
        title = f"{self.title}; {done}/{len(rows)} settled" if self.title else ""
        self.table.draw(rows, title)

    async def run(self, *, deadline: float | None, adding_done: asyncio.Event | None = None
                  ) -> bool:
        """Poll until all rows settled (and ``adding_done`` is set); False at the deadline
        (``time.monotonic()``). A ``ClientError`` with exit code 1 (4xx) ends it at once;
        transient ones are retried ``CONSECUTIVE_FAILURES`` times in a row."""
        failures = 0
        while True:
            try:
                await self.poll_once()
                failures = 0
            except ClientError as exc:
                failures += 1
                if exc.exit_code == 1 or failures >= CONSECUTIVE_FAILURES:
                    raise
            done = adding_done is None or adding_done.is_set()
            if done and not self.unsettled:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self.poll_s)
