"""Conflict analyzers: pure functions of the batches' file lists, no I/O.

| Analyzer | A candidate conflicts with an in-flight batch when |
|---|---|
| ``AllAnalyzer`` | always (the queue is fully serial) |
| ``NoneAnalyzer`` | never (every batch is independent) |
| ``PathOverlapAnalyzer(by="file")`` | both touch the same file |
| ``PathOverlapAnalyzer(by="directory")`` | both touch a file in the same directory |

Paths are compared after cleaning (``posixpath.normpath``, leading ``./`` and ``/``
stripped), so ``./src/a.py``, ``/src/a.py`` and ``src//x/../a.py`` are one file. By
directory, the key is the file's parent directory (not its ancestors: ``a/x`` and
``a/b/y`` do not conflict); files at the root share the key ``"."``.

A batch never conflicts with itself: an in-flight entry with the candidate's id is skipped.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Iterable, Sequence
from typing import Literal

from app.extensions.base import BatchChanges

OverlapBy = Literal["file", "directory"]


def clean_path(path: str) -> str:
    """``path`` normalised and relative to the repository root (``"."`` for the root)."""
    cleaned = posixpath.normpath(path)
    while cleaned.startswith("./"):
        cleaned = cleaned[2:]
    cleaned = cleaned.lstrip("/")
    return cleaned or "."


def path_key(path: str, by: OverlapBy) -> str:
    """The key two paths must share to conflict: the cleaned file, or its parent directory."""
    cleaned = clean_path(path)
    if by == "file":
        return cleaned
    return posixpath.dirname(cleaned) or "."


def path_keys(paths: Iterable[str], by: OverlapBy) -> frozenset[str]:
    return frozenset(path_key(p, by) for p in paths)


@functools.lru_cache(maxsize=8192)
def _keys_of(files: tuple[str, ...], by: OverlapBy) -> frozenset[str]:
    """``path_keys`` of a batch's files, kept: each analysis compares the new batch with
    every batch in flight, whose files do not change."""
    return path_keys(files, by)


def _others(candidate: BatchChanges, in_flight: Sequence[BatchChanges]) -> list[BatchChanges]:
    return [b for b in in_flight if b.batch_id != candidate.batch_id]


class AllAnalyzer:
    """Every in-flight batch is a conflict: batches land strictly one after another."""

    def analyze(self, candidate: BatchChanges, in_flight: Sequence[BatchChanges]) -> list[str]:
        return [b.batch_id for b in _others(candidate, in_flight)]


class NoneAnalyzer:
    """No batch conflicts with another."""

    def analyze(self, candidate: BatchChanges, in_flight: Sequence[BatchChanges]) -> list[str]:
        return []


class PathOverlapAnalyzer:
    """Conflict iff the batches' path keys (file or parent directory) intersect."""

    def __init__(self, by: OverlapBy = "directory") -> None:
        if by not in ("file", "directory"):
            raise ValueError(f"PathOverlapAnalyzer: by must be 'file' or 'directory', not {by!r}")
        self.by: OverlapBy = by

    def analyze(self, candidate: BatchChanges, in_flight: Sequence[BatchChanges]) -> list[str]:
        mine = _keys_of(tuple(candidate.files), self.by)
        if not mine:
            return []
        return [
            b.batch_id
            for b in _others(candidate, in_flight)
            if not mine.isdisjoint(_keys_of(tuple(b.files), self.by))
        ]
