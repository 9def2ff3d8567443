"""Status precedence of the request log (``app/domain/materializer.py``): each rule
of ``log_wins``, and order independence of the fold under redelivery and reordering."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.materializer import StatusPoint, log_wins
from app.domain.states import LogType, PublicStatus

S = LogType.STATUS
E = LogType.EVENT


def p(status: str, ts: int, version: int = 0) -> StatusPoint:
    return StatusPoint(status=status, request_version=version, timestamp_ms=ts)


ACCEPTING = p("accepting", 100)


# --- rule 1: events never change the status ---------------------------------------


@pytest.mark.parametrize("current", [ACCEPTING, p("accepted", 1), p("batched", 5)])
def test_an_event_never_wins(current: StatusPoint) -> None:
    assert not log_wins(E, p("building", 10_000, 9), current)


# --- rule 2: an accepting summary takes any other status ------------------------


@pytest.mark.parametrize("status", ["accepted", "started", "cancelling", "error"])
def test_accepting_takes_any_other_status_even_an_older_one(status: str) -> None:
    assert log_wins(S, p(status, 1), ACCEPTING)


def test_accepting_does_not_take_accepting() -> None:
    assert not log_wins(S, p("accepting", 1_000), ACCEPTING)


# --- rule 3: accepting never wins; accepted never replaces another status -------


@pytest.mark.parametrize("current", [p("accepted", 1), p("started", 1), p("landed", 1, 3)])
def test_incoming_accepting_never_wins(current: StatusPoint) -> None:
    assert not log_wins(S, p("accepting", 1_000), current)


@pytest.mark.parametrize("current", [p("started", 1), p("cancelling", 1), p("error", 1)])
def test_accepted_never_replaces_another_status(current: StatusPoint) -> None:
    assert not log_wins(S, p("accepted", 1_000), current)


def test_accepted_replaces_accepted_only_when_strictly_later() -> None:
    assert log_wins(S, p("accepted", 2), p("accepted", 1))
    assert not log_wins(S, p("accepted", 1), p("accepted", 1))


# --- rule 4: versioned terminal statuses ------------------------------------------


@pytest.mark.parametrize("terminal", ["landed", "error", "cancelled"])
def test_versioned_terminal_beats_a_later_non_terminal(terminal: str) -> None:
    assert log_wins(S, p(terminal, 1, 1), p("speculating", 1_000))
    assert not log_wins(S, p("speculating", 1_000), p(terminal, 1, 1))


def test_unversioned_terminal_is_an_ordinary_status() -> None:
    assert not p("landed", 1, 0).versioned_terminal
    assert not log_wins(S, p("landed", 1, 0), p("batched", 2))
    assert log_wins(S, p("landed", 3, 0), p("batched", 2))
    assert log_wins(S, p("landed", 1, 1), p("landed", 5, 0))


def test_between_versioned_terminals_the_higher_version_wins() -> None:
    assert log_wins(S, p("landed", 1, 3), p("error", 1_000, 2))
    assert not log_wins(S, p("error", 1_000, 2), p("landed", 1, 3))


def test_between_versioned_terminals_of_one_version_the_later_wins() -> None:
    assert log_wins(S, p("cancelled", 6, 2), p("error", 5, 2))
    assert not log_wins(S, p("cancelled", 5, 2), p("error", 5, 2))  # exact tie keeps


# --- rule 5: otherwise the strictly later timestamp wins --------------------------


def test_a_later_status_wins_and_an_older_one_does_not() -> None:
    assert log_wins(S, p("validated", 6, 2), p("started", 5, 1))
    assert not log_wins(S, p("started", 5, 1), p("validated", 6, 2))


def test_an_exact_tie_keeps_the_current_status() -> None:
    assert not log_wins(S, p("validating", 5), p("started", 5))
    assert not log_wins(S, p("started", 5), p("validating", 5))


# --- the fold is order independent -------------------------------------------------


@dataclass(frozen=True)
class Entry:
    type: LogType
    point: StatusPoint


def fold(entries: list[Entry]) -> StatusPoint:
    current = ACCEPTING
    for e in entries:
        if log_wins(e.type, e.point, current):
            current = e.point
    return current


def rank(point: StatusPoint) -> tuple[bool, int, int]:
    """The total order the rules define (given distinct timestamps and ``accepted``
    first): versioned terminals above everything, by version, then by time."""
    vt = point.versioned_terminal
    return vt, point.request_version if vt else 0, point.timestamp_ms


NON_ACCEPT = [s.value for s in PublicStatus if s not in (PublicStatus.ACCEPTING,
                                                         PublicStatus.ACCEPTED)]


@st.composite
def histories(draw: st.DrawFn) -> list[Entry]:
    # Distinct timestamps: an exact tie between two different statuses keeps
    # whichever came first, by design (tested above), so it is excluded here.
    n = draw(st.integers(min_value=1, max_value=8))
    stamps = draw(st.lists(st.integers(1, 10_000), min_size=n, max_size=n, unique=True))
    entries = [
        Entry(S, p(draw(st.sampled_from(NON_ACCEPT)), ts, draw(st.integers(0, 3))))
        for ts in stamps
    ]
    if draw(st.booleans()):  # the gateway's own `accepted`, at receipt time (first)
        entries.append(Entry(S, p("accepted", 0)))
    events = draw(st.lists(st.integers(0, 10_000), max_size=3))
    entries += [Entry(E, p("", ts)) for ts in events]
    duplicates = draw(st.lists(st.sampled_from(entries), max_size=4))
    return entries + duplicates


@settings(max_examples=300, deadline=None)
@given(data=st.data(), entries=histories())
def test_any_permutation_with_duplicates_folds_to_the_same_status(
    data: st.DataObject, entries: list[Entry]
) -> None:
    shuffled = data.draw(st.permutations(entries))
    in_time_order = sorted(entries, key=lambda e: e.point.timestamp_ms)
    expected = fold(in_time_order)
    assert fold(list(shuffled)) == expected
    statuses = [e.point for e in entries if e.type is S]
    assert expected == max(statuses, key=rank)
