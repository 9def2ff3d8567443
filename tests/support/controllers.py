"""Controllers below the whole app: a real migrated database, a broker that records what
is published, a delivery that records holds, and the queue's fakes as extensions.

``StateTable`` makes a controller module's docstring state table executable: every row
of every table whose header starts with ``Loaded state`` must be covered by a ``Case``
(``StateTable.missing()`` lists the rows that are not), and each case seeds one durable
state, runs the controller once and checks its outcome, its writes and the messages it
published (topic, partition key and message id).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from app.controllers.common import Deps
from app.db.engine import Database
from app.db.repos import batches as batch_repo
from app.db.repos import requests as request_repo
from app.domain.entities import Batch, LandRequest
from app.domain.queue_config import parse_queues
from app.domain.states import BatchState, LandStrategy, RequestState
from app.extensions.base import QueueExtensions
from app.extensions.factory import build_extensions
from app.queue import Outgoing, StoredMessage

NOW_MS = 1_700_000_000_000
QUEUE = "demo"
QUEUES_YAML = Path(__file__).resolve().parents[2] / "queues.yaml"


@dataclass(frozen=True)
class Published:
    topic: str
    partition_key: str
    message_id: str
    payload: Any

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.topic, self.partition_key, self.message_id)


class RecordingBroker:
    """The two publishing calls controllers make, recorded in order; a fixed clock."""

    def __init__(self, now_ms: int = NOW_MS) -> None:
        self.now_ms = now_ms
        self.published: list[Published] = []

    def clock(self) -> int:
        return self.now_ms

    async def publish(self, topic: str, payload: Any, *, partition_key: str,
                      message_id: str, **_: Any) -> None:
        self.published.append(Published(topic, partition_key, message_id, payload))

    async def publish_many(self, batch: Sequence[Outgoing]) -> None:
        for o in batch:
            self.published.append(Published(o.topic, o.partition_key, o.message_id, o.payload))

    def keys(self, topic: str | None = None) -> list[tuple[str, str, str]]:
        return [p.key for p in self.published if topic is None or p.topic == topic]

    def logs(self) -> list[str]:
        """The log ids published (``<sqid>/<status or event>[/...]``), in order."""
        return [p.message_id for p in self.published if p.topic == "log"]


class FakeDelivery:
    """What a controller sees of one delivery; ``hold`` is recorded, not performed."""

    def __init__(self, topic: str, payload: Any, *, message_id: str = "m-1",
                 partition_key: str = QUEUE, attempt: int = 1, seq: int = 1,
                 published_at_ms: int = NOW_MS, failure: dict[str, Any] | None = None) -> None:
        failure = failure or {}
        self.message = StoredMessage(
            seq=seq, topic=topic, partition_key=partition_key, message_id=message_id,
            payload_json=json.dumps(payload), metadata={}, published_at_ms=published_at_ms,
            original_topic=failure.get("original_topic"),
            failure_count=failure.get("failure_count"), last_error=failure.get("last_error"),
            failure_detail=failure.get("failure_detail"), failed_at_ms=failure.get("failed_at_ms"))
        self.attempt = attempt
        self.held_ms: int | None = None

    @property
    def payload(self) -> Any:
        return self.message.payload

    @property
    def message_id(self) -> str:
        return self.message.message_id

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def partition_key(self) -> str:
        return self.message.partition_key

    @property
    def metadata(self) -> dict[str, Any]:
        return self.message.metadata

    def hold(self, ms: int) -> None:
        self.held_ms = ms


def demo_extensions() -> QueueExtensions:
    """The ``demo`` queue of the example queues file: fakes only."""
    configs = parse_queues(QUEUES_YAML.read_text(encoding="utf-8"), source=str(QUEUES_YAML),
                           base_dir=QUEUES_YAML.parent)
    return build_extensions(configs[QUEUE])


@dataclass
class Rig:
    """A controller's world: database, recording broker and the deps that join them."""

    db: Database
    broker: RecordingBroker
    deps: Deps

    async def request(self, n: int, state: RequestState, *, version: int = 1,
                      uris: tuple[str, ...] | None = None, last_error: str = "") -> LandRequest:
        req = LandRequest(queue=QUEUE, id=f"{QUEUE}/{n}",
                          change_uris=uris or (f"git://demo.example.com/demo/r{n}/{n:040x}",),
                          strategy=LandStrategy.REBASE, state=state, version=version,
                          last_error=last_error)
        async with self.db.write() as s:
            await request_repo.create(s, request=req, now_ms=self.broker.now_ms)
        return req

    async def batch(self, n: int, state: BatchState, contains: Sequence[LandRequest], *,
                    version: int = 1, dependencies: tuple[str, ...] = (),
                    failure_reason: str = "") -> Batch:
        batch = Batch(queue=QUEUE, id=f"{QUEUE}/batch/{n}",
                      contains=tuple(r.id for r in contains), dependencies=dependencies,
                      state=state, version=version, failure_reason=failure_reason)
        async with self.db.write() as s:
            await batch_repo.create(s, batch=batch, now_ms=self.broker.now_ms)
        return batch

    async def get_request(self, n: int) -> LandRequest:
        async with self.db.read() as s:
            return await request_repo.get(s, queue=QUEUE, id=f"{QUEUE}/{n}")

    async def get_batch(self, n: int) -> Batch:
        async with self.db.read() as s:
            return await batch_repo.get(s, queue=QUEUE, id=f"{QUEUE}/batch/{n}")


def make_rig(database_url: str, extensions: QueueExtensions | None = None) -> Rig:
    db = Database(database_url)
    broker = RecordingBroker()
    ext = extensions or demo_extensions()
    deps = Deps(db=db, broker=broker, extensions=lambda _q: ext)  # type: ignore[arg-type]
    return Rig(db=db, broker=broker, deps=deps)


# --- executable state tables ---------------------------------------------------------


_ROW = re.compile(r"^\|(.+)\|\s*$")


def documented_rows(module: ModuleType) -> list[str]:
    """First-column cells of every table in ``module``'s docstring whose header's first
    cell is ``Loaded state`` (the controller's state-classification tables)."""
    rows: list[str] = []
    in_table = False
    for line in (inspect.getdoc(module) or "").splitlines():
        m = _ROW.match(line.strip())
        if not m:
            in_table = False
            continue
        cells = [c.strip() for c in m.group(1).split("|")]
        if cells[0] == "Loaded state":
            in_table = True
            continue
        if in_table and not set(cells[0]) <= set("-: "):
            rows.append(cells[0])
    return rows


Check = Callable[[Rig], Awaitable[None]]
Seed = Callable[[Rig], Awaitable[Any]]


@dataclass(frozen=True)
class Case:
    """One documented row, made executable.

    ``seed`` creates the durable state; ``payload`` is the message (a callable gets
    what ``seed`` returned); ``raises`` the error type the row documents (None: the
    message is handled); ``published`` exactly the (topic, partition key, message id)
    triples the controller publishes, in order (None: not checked); ``check`` asserts
    the writes.
    """

    row: str
    seed: Seed
    payload: Any
    name: str = ""
    raises: type[BaseException] | None = None
    published: Sequence[tuple[str, str, str]] | None = None
    held: bool = False
    check: Check | None = None
    delivery: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.name or re.sub(r"[^a-z0-9]+", "-", self.row.lower()).strip("-")


class StateTable:
    def __init__(self, module: ModuleType, cases: Sequence[Case]) -> None:
        self.module = module
        self.cases = list(cases)

    def missing(self) -> list[str]:
        covered = {c.row for c in self.cases}
        return [r for r in documented_rows(self.module) if r not in covered]

    def unknown(self) -> list[str]:
        """Cases naming a row the docstring does not have (a stale test)."""
        rows = set(documented_rows(self.module))
        return [c.row for c in self.cases if c.row not in rows]


async def run_case(rig: Rig, controller: Any, topic: str, case: Case) -> FakeDelivery:
    """Seed, deliver once, and check everything the case documents."""
    import pytest

    seeded = await case.seed(rig)
    payload = case.payload(seeded) if callable(case.payload) else case.payload
    delivery = FakeDelivery(topic, payload, **case.delivery)
    if case.raises is not None:
        with pytest.raises(case.raises):
            await controller.process(delivery)
    else:
        await controller.process(delivery)
    if case.published is not None:
        assert rig.broker.keys() == list(case.published), rig.broker.keys()
    assert (delivery.held_ms is not None) == case.held, delivery.held_ms
    if case.check is not None:
        await case.check(rig)
    return delivery
