"""The lines of a failed build's log a person reads first (pure): the tail around the
first failure.

The *first failure* is the first line that reads like one — ``FAIL``/``FAILED``/
``FAILURE``, ``ERROR``/``error:``, ``Traceback``, ``AssertionError``, ``panic:``, a
pytest ``E   `` line — skipping the runner's own ``[sq] ...`` lines; when only those
say so (e.g. ``[sq] exit code 1``), the first of them. The excerpt is
:data:`BEFORE` lines before it up to :data:`AFTER` lines after it, at most
:data:`MAX_LINES` in all; with no such line, the last :data:`TAIL` lines. Each line is
cut at :data:`MAX_LINE_CHARS` characters. Lines are numbered from 1 as in the whole log
(of what the runner kept: its last MiB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BEFORE = 5
AFTER = 12
TAIL = 20
MAX_LINES = 40
MAX_LINE_CHARS = 400

_FAILURE = re.compile(
    r"\bFAIL(?:ED|URE|URES)?\b|\bERROR\b|\b[Ee]rror:|\bTraceback\b|\bAssertionError\b|"
    r"\bpanic:|^E {3}|\bexit (?:code|status) [1-9]")
_RUNNER = "[sq] "


@dataclass(frozen=True, slots=True)
class Line:
    n: int
    text: str
    failing: bool


@dataclass(frozen=True, slots=True)
class Excerpt:
    lines: tuple[Line, ...]
    first_failure: int | None  # its line number, None when no line reads like a failure
    total_lines: int


def first_failure(lines: list[str]) -> int | None:
    """0-based index of the first failing line (module docstring), else None."""
    runner: int | None = None
    for i, line in enumerate(lines):
        if _FAILURE.search(line):
            if not line.startswith(_RUNNER):
                return i
            if runner is None:
                runner = i
    return runner


def excerpt(log: str) -> Excerpt | None:
    """The excerpt of ``log`` (None for an empty log)."""
    lines = log.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return None
    at = first_failure(lines)
    if at is None:
        start, end = max(0, len(lines) - TAIL), len(lines)
    else:
        start = max(0, at - BEFORE)
        end = min(len(lines), at + AFTER + 1, start + MAX_LINES)
    return Excerpt(
        lines=tuple(Line(n=i + 1, text=_cut(lines[i]),
                         failing=bool(_FAILURE.search(lines[i])) and at is not None and i >= at)
                    for i in range(start, end)),
        first_failure=None if at is None else at + 1, total_lines=len(lines))


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS - 1] + "\u2026"
