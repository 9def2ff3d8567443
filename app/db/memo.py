"""Decoded rows kept between reads of the same rows (see ``Memo``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Memo(Generic[T]):
    """Decoded rows kept between reads of the same rows: a row whose every column is
    what it was when it was decoded gives back the entity decoded then (comparing a
    row's values costs far less than parsing its JSON again). Keyed by the row's
    identity; the memo keeps only the rows of the latest ``fresh()`` round and the
    ones read since, so it holds about what one reader reads."""

    def __init__(self) -> None:
        self._rows: dict[Any, tuple[tuple[Any, ...], T]] = {}
        self._seen: dict[Any, tuple[tuple[Any, ...], T]] = {}
        self.decoded = 0  # rows parsed (the others came from the memo)

    def fresh(self) -> None:
        """Start a new round: rows not read since the previous round are forgotten."""
        self._rows, self._seen = self._seen or self._rows, {}

    def get(self, key: Any, row: Any, decode: Callable[[Any], T]) -> T:
        values = tuple(row)
        held = self._seen.get(key) or self._rows.get(key)
        if held is None or held[0] != values:
            held = (values, decode(row))
            self.decoded += 1
        self._seen[key] = held
        return held[1]
