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


class Kept(Generic[T]):
    """Entities kept between reads by key, with the stamp (version, and whatever else
    every write changes) of the row they were read from. A reader first reads the keys
    and stamps of the rows it wants - a few narrow columns - and fetches whole rows only
    for the keys whose stamp differs from the kept one (:meth:`stale`); a deep queue's
    snapshot then costs what changed since the previous one, not its depth. Sound only
    for tables whose every write changes the stamp: ``conditional_update`` raises the
    version on every write, and no other statement writes these rows. The kept set is
    what the latest read returned (:meth:`keep`), so it holds one reader's rows."""

    def __init__(self) -> None:
        self._held: dict[Any, tuple[Any, T]] = {}
        self.fetched = 0  # whole rows read (the others came from what was kept)

    def stale(self, stamps: dict[Any, Any]) -> list[Any]:
        """The keys of ``stamps`` whose rows must be fetched whole."""
        held = self._held
        return [k for k, s in stamps.items() if (h := held.get(k)) is None or h[0] != s]

    def keep(self, stamps: dict[Any, Any], fetched: dict[Any, tuple[Any, T]]) -> dict[Any, T]:
        """The entities of ``stamps``' keys: the ``fetched`` ones (key -> its row's own
        stamp and entity; a row that changed between the two reads comes with its newer
        stamp) and the kept ones. A key neither fetched nor kept (its row went away in
        between) is left out. Keys not in ``stamps`` are forgotten."""
        self.fetched += len(fetched)
        held = self._held
        out: dict[Any, tuple[Any, T]] = {}
        for k, stamp in stamps.items():
            h = fetched.get(k)
            if h is None and (h := held.get(k)) is not None and h[0] != stamp:
                h = None  # stale and not fetched: it left the rows asked for
            if h is not None:
                out[k] = h
        self._held = out
        return {k: h[1] for k, h in out.items()}
