"""Controllers below the whole app (the world: ``tests.support.rig``), and their
docstring state tables made executable.

``StateTable`` makes a controller module's docstring state table executable: every row
of every table whose header starts with ``Loaded state`` or ``Dead letter`` (or another
header named) must be covered by a ``Case`` (``StateTable.missing()`` lists the rows
that are not), and each case seeds one durable state, runs the controller once and
checks its outcome, its writes and the messages it published (topic, partition key and
message id; ``unique(base)`` stands for a ``unique_id(base)``, ``<base>@<16 hex>``). A
case that raises also asserts that nothing was written (every table compared before and
after).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support.doubles import (
    NOW_MS,
    QUEUE,
    SEAMS,
    FakeDelivery,
    Published,
    RecordingBroker,
    RecordingMetrics,
    Scripted,
    SimulatedCrash,
)
from tests.support.rig import Rig, demo_extensions, make_rig
from tests.support.seeds import (
    batch_id,
    change_uri,
    entry,
    event_entry,
    path,
    status_entry,
)

__all__ = [  # defined here, and re-exported from doubles, rig and seeds
    "CONTROLLER_ONLY", "NOW_MS", "QUEUE", "STATE_HEADERS", "UNCHECKED", "Case", "Check",
    "FakeDelivery", "Published", "RecordingBroker", "RecordingMetrics", "Rig", "Scripted",
    "Seed", "SimulatedCrash", "StateTable", "batch_id", "change_uri", "crash_points",
    "demo_extensions", "documented_rows", "entry", "event_entry", "make_rig", "path",
    "run_case", "run_crash_repair", "run_redelivery", "status_entry", "unique",
]


# --- executable state tables ---------------------------------------------------------


_ROW = re.compile(r"^\|(.+)\|\s*$")
STATE_HEADERS = ("Loaded state", "Dead letter")
UNIQUE = "@<unique>"
_UNIQUE_ID = re.compile(r"@[0-9a-f]{16}$")


def unique(base: str) -> str:
    """An expected message id made by ``unique_id(base)`` (a hand-off that must not be
    deduplicated): any ``<base>@<16 hex>`` matches it."""
    return base + UNIQUE


def _expected(keys: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Published keys as a case names them: each unique id as ``unique(base)``."""
    return [(t, k, _UNIQUE_ID.sub(UNIQUE, i)) for t, k, i in keys]


def documented_rows(documented: Any, headers: Sequence[str] = STATE_HEADERS) -> list[str]:
    """First-column cells of every table in ``documented``'s docstring (a module, class
    or function) whose header's first cell is one of ``headers`` (the state tables)."""
    rows: list[str] = []
    in_table = False
    for line in (inspect.getdoc(documented) or "").splitlines():
        m = _ROW.match(line.strip())
        if not m:
            in_table = False
            continue
        cells = [c.strip() for c in m.group(1).split("|")]
        if cells[0] in headers:
            in_table = True
            continue
        if in_table and not set(cells[0]) <= set("-: "):
            rows.append(cells[0])
    return rows


Check = Callable[[Rig], Awaitable[None]]
Seed = Callable[[Rig], Awaitable[Any]]
UNCHECKED: Any = object()


@dataclass(frozen=True)
class Case:
    """One documented row, made executable.

    ``seed`` creates the durable state (and may script the rig's extensions);
    ``payload`` is the message (a callable gets what ``seed`` returned); ``raises`` the
    error type the row documents (None: the message is handled); ``published`` exactly
    the (topic, partition key, message id) triples the controller publishes, in order
    (None: not checked); ``held`` the hold in ms the delivery asked for (None: no hold);
    ``returns`` what ``process`` returns (unchecked by default); ``writes_nothing``
    asserts that no table changed (default: when the row raises); ``check`` asserts the
    writes; ``delivery`` are extra ``FakeDelivery`` arguments; ``repaired_as``, per crash
    topic, the keys the crashed run and its redelivery publish between them when the
    redelivery repairs the fan-out under other ids (default: ``published``);
    ``replays_differ``, message ids the row documents a replay of as carrying another
    payload (the queue keeps the first one published).
    """

    row: str
    seed: Seed
    payload: Any
    name: str = ""
    raises: type[BaseException] | None = None
    published: Sequence[tuple[str, str, str]] | None = None
    held: int | None = None
    returns: Any = UNCHECKED
    writes_nothing: bool | None = None
    check: Check | None = None
    delivery: dict[str, Any] = field(default_factory=dict)
    repaired_as: dict[str, Sequence[tuple[str, str, str]]] = field(default_factory=dict)
    replays_differ: Sequence[str] = ()

    @property
    def id(self) -> str:
        return self.name or re.sub(r"[^a-z0-9]+", "-", self.row.lower()).strip("-")

    @property
    def unchanged(self) -> bool:
        return self.raises is not None if self.writes_nothing is None else self.writes_nothing


class StateTable:
    def __init__(self, documented: Any, cases: Sequence[Case],
                 headers: Sequence[str] = STATE_HEADERS) -> None:
        self.documented = documented
        self.headers = tuple(headers)
        self.cases = list(cases)
        ids = [c.id for c in self.cases]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        assert not duplicates, f"case names must be unique: {duplicates}"

    def rows(self) -> list[str]:
        return documented_rows(self.documented, self.headers)

    def missing(self) -> list[str]:
        covered = {c.row for c in self.cases}
        return [r for r in self.rows() if r not in covered]

    def unknown(self) -> list[str]:
        """Cases naming a row the docstring does not have (a stale test)."""
        rows = set(self.rows())
        return [c.row for c in self.cases if c.row not in rows]


async def run_case(rig: Rig, controller: Any, topic: str, case: Case) -> FakeDelivery:
    """Seed, deliver once, and check everything the case documents."""
    import pytest

    seeded = await case.seed(rig)
    payload = case.payload(seeded) if callable(case.payload) else case.payload
    delivery = FakeDelivery(topic, payload, **case.delivery)
    before = await rig.snapshot() if case.unchanged else None
    result: Any = None
    if case.raises is not None:
        with pytest.raises(case.raises):
            await controller.process(delivery)
    else:
        result = await controller.process(delivery)
    if case.published is not None:
        assert _expected(rig.broker.keys()) == list(case.published), rig.broker.keys()
    assert delivery.held_ms == case.held, delivery.held_ms
    if case.returns is not UNCHECKED:
        assert result == case.returns, result
    if before is not None:
        assert await rig.snapshot() == before, "the row must write nothing"
    if case.check is not None:
        await case.check(rig)
    return delivery


# The crash and duplicate-delivery properties exercise a controller's classification,
# not the dialect (the crash falls between committed transactions): they run on SQLite
# only, while every row itself runs on both backends. It keeps the directory fast.
CONTROLLER_ONLY = ["sqlite"]


def crash_points(cases: Sequence[Case]) -> list[tuple[Case, str]]:
    """``(case, topic)`` for each topic a handled case publishes to: where a process
    can die between the case's writes and its fan-out."""
    return [(c, t) for c in cases if c.raises is None and c.published
            for t in dict.fromkeys(k[0] for k in c.published)]


async def run_crash_repair(rig: Rig, controller: Any, topic: str, case: Case,
                           crash_topic: str) -> None:
    """Seed; deliver, dying before the first publish to ``crash_topic``; deliver again
    (attempt 2). Between them the two runs must publish exactly the case's keys (a key
    twice only with the same payload: the queue keeps the first; a unique id may be
    minted by each run) and leave the case's writes. The case's check sees, per seam,
    the calls of the first run, or the redelivery's when the first died before calling
    that seam (the calls a clean run makes: a controller calls an extension before it
    publishes, or, when it announces first, as ``merge`` does, the redelivery makes the
    call the first never reached)."""
    import pytest

    seeded = await case.seed(rig)
    payload = case.payload(seeded) if callable(case.payload) else case.payload
    rig.broker.crash_before(crash_topic)
    with pytest.raises(SimulatedCrash):
        await controller.process(FakeDelivery(topic, payload, **case.delivery))
    calls = {n: list(rig.seam(n).calls) for n in SEAMS}
    await controller.process(FakeDelivery(topic, payload, **{**case.delivery, "attempt": 2}))
    for n, seen in calls.items():
        if seen:  # else the redelivery's calls stay
            rig.seam(n).calls = seen
    assert case.published is not None
    expected = case.repaired_as.get(crash_topic, case.published)
    assert set(_expected(rig.broker.keys())) == set(expected), rig.broker.keys()
    first: dict[tuple[str, str, str], Published] = {}
    for p in rig.broker.published:
        assert first.setdefault(p.key, p).payload == p.payload or \
            p.message_id in case.replays_differ, f"{p.key} replayed changed"
    rig.broker.published = list(first.values())
    if case.check is not None:
        await case.check(rig)


async def run_redelivery(rig: Rig, controller: Any, topic: str, case: Case) -> None:
    """Run a handled case, then deliver the same message again (attempt 2): the
    duplicate must write nothing, and a key it publishes again carries the same payload."""
    delivery = await run_case(rig, controller, topic, case)
    first = {p.key: p.payload for p in rig.broker.published}
    after = await rig.snapshot()
    await controller.process(FakeDelivery(topic, delivery.payload,
                                          **{**case.delivery, "attempt": 2}))
    assert await rig.snapshot() == after, "a duplicate delivery must write nothing"
    for p in rig.broker.published:
        assert first.setdefault(p.key, p.payload) == p.payload or \
            p.message_id in case.replays_differ, f"{p.key} replayed changed"
