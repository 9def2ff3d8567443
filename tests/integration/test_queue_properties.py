"""Stateful property tests of the queue's order and no-loss invariants (Hypothesis).

A ``RuleBasedStateMachine`` drives one broker through random sequences of publish
(with duplicate ids), claim, ack, retry, hold, release, extend, dead-letter,
lease expiry (a fake clock, advanced without sleeping), requeue from the DLQ and
"drain everything". A model predicts the state, and after every step the database
must agree with it:

- no loss: every unique published message is in exactly one place: pending or in
  flight (a delivery), acked (settled), or the DLQ; a drain delivers all of them;
- no duplicates: a message id is stored once per topic, a duplicate publish
  stores nothing, the DLQ holds a message at most once;
- order: a claim takes the oldest claimable deliveries of each partition, so the
  first deliveries of a partition follow publish order;
- serial topics: at most one message of a partition in flight, and only the
  head of a partition is ever claimed;
- a settle with a stale lease (after someone else re-claimed) changes nothing.

Hypothesis state machines are synchronous: each machine drives an asyncio loop
owned by the test with ``run_until_complete``. Every example uses a topic of its
own in the test's database, so examples never see each other's messages.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.queue import (
    Backend,
    Broker,
    ClaimedDelivery,
    NotDeadLettered,
    Outgoing,
    PostgresBackend,
    SqliteBackend,
    StoredMessage,
    TopicSpec,
    Topology,
)
from app.queue.backends import postgres_dsn_from_url, sqlite_path_from_url
from tests.conftest import BACKENDS

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

T = TypeVar("T")
Key = tuple[str, str]  # (partition_key, message_id)

GROUP = "g"
VISIBILITY_MS = 1000
MAX_ATTEMPTS = 2
PARTITIONS = ("p0", "p1", "p2")
MESSAGE_IDS = tuple(f"m{i}" for i in range(6))
START_MS = 1_700_000_000_000

SETTINGS = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    database=None,  # keep the working tree clean; failures print a reproduction blob
    print_blob=True,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)

keys = st.tuples(st.sampled_from(PARTITIONS), st.sampled_from(MESSAGE_IDS))
index = st.integers(min_value=0, max_value=10_000)
delays = st.sampled_from([0, 1, 400, 999, 2500])


class Env:
    """What the examples of one test share: an event loop and one started backend.

    Each example gets a broker of its own (own topology, topic and fake clock) over
    this backend, and deletes its messages when it ends, so examples are independent
    while connections are made once per test.
    """

    def __init__(self, url: str, serial: bool) -> None:
        self.serial = serial
        self.topics = itertools.count()
        self.loop = asyncio.new_event_loop()
        self.backend: Backend = (
            SqliteBackend(sqlite_path_from_url(url)) if url.startswith("sqlite")
            else PostgresBackend(postgres_dsn_from_url(url), min_size=1, max_size=2)
        )
        self.loop.run_until_complete(self.backend.start(lambda topic: None))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.backend.close())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()


@dataclass
class ModelDelivery:
    key: Key
    order: int  # deliveries are numbered in creation order, like their database ids
    available_at: int
    attempts: int = 0
    held: bool = False
    token: str | None = None
    db_id: int | None = None

    def in_flight(self, now: int) -> bool:
        return self.token is not None and self.available_at > now


def by_key(topic: str, rows: list[StoredMessage]) -> dict[Key, StoredMessage]:
    found = Counter((m.partition_key, m.message_id) for m in rows)
    dupes = [k for k, n in found.items() if n > 1]
    assert not dupes, f"stored more than once in {topic}: {dupes}"
    return {(m.partition_key, m.message_id): m for m in rows}


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        self.serial = env.serial
        self.topic = f"t{next(env.topics)}"
        self.dlq_topic = f"{self.topic}_dlq"
        topology = Topology()
        topology.declare(TopicSpec(self.topic, serial=self.serial, max_attempts=MAX_ATTEMPTS,
                                   visibility_timeout_ms=VISIBILITY_MS))
        topology.subscribe(self.topic, GROUP)  # nobody reads the DLQ: dead letters park
        self.now = START_MS
        # Not started: the backend is the test's, already started (start/close would
        # start/close it).
        self.broker = Broker(env.backend, topology, clock=lambda: self.now)
        # The model.
        self.published: dict[str, list[str]] = {pk: [] for pk in PARTITIONS}
        self.payloads: dict[Key, Any] = {}
        self.deliveries: dict[Key, ModelDelivery] = {}
        self.acked: set[Key] = set()
        self.dlq: dict[Key, int] = {}  # -> failure_count
        self.first_delivered: dict[str, list[str]] = {pk: [] for pk in PARTITIONS}
        self.by_db_id: dict[int, ModelDelivery] = {}
        self.orders = itertools.count()
        self.hand: list[ClaimedDelivery] = []  # claimed and not yet settled (maybe stale)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.env.loop.run_until_complete(coro)

    def teardown(self) -> None:
        """Delete this example's messages, so the database stays small."""
        b = self.broker

        async def clean() -> None:
            for topic in (self.topic, self.dlq_topic):
                rows = await b.list_messages(topic, unsettled_only=False, limit=1000)
                await asyncio.gather(*(b.discard(topic, m.seq, reason="example over")
                                       for m in rows))
            await b.close()  # waits for background writes; leaves the backend alone

        self.run(clean())

    # -- helpers -------------------------------------------------------------------
    def all_keys(self) -> set[Key]:
        return set(self.payloads)

    def new_delivery(self, key: Key) -> None:
        self.deliveries[key] = ModelDelivery(key, next(self.orders), available_at=self.now)

    def claimable(self) -> list[ModelDelivery]:
        """What the model says ``claim`` may take, oldest first."""
        ordered = sorted(self.deliveries.values(), key=lambda d: d.order)
        if self.serial:
            heads: dict[str, ModelDelivery] = {}
            for d in ordered:
                heads.setdefault(d.key[0], d)
            return sorted((d for d in heads.values() if d.available_at <= self.now),
                          key=lambda d: d.order)
        return [
            d for d in ordered
            if d.available_at <= self.now
            and not any(h.held and h.key[0] == d.key[0] and h.order < d.order for h in ordered)
        ]

    def owner(self, cd: ClaimedDelivery) -> ModelDelivery | None:
        """The model delivery ``cd`` still owns (same delivery, same lease), if any."""
        md = self.by_db_id.get(cd.delivery_id)
        if md is None or self.deliveries.get(md.key) is not md or md.token != cd.lease_token:
            return None
        return md

    def messages(self, topic: str, *, unsettled_only: bool) -> dict[Key, StoredMessage]:
        return by_key(topic, self.run(self.broker.list_messages(
            topic, unsettled_only=unsettled_only, limit=1000)))

    def take_from_hand(self, i: int) -> ClaimedDelivery:
        return self.hand.pop(i % len(self.hand))

    def do_publish(self, items: list[Key]) -> None:
        batch = [Outgoing(self.topic, {"pk": pk, "mid": mid, "n": len(self.payloads)}, pk, mid)
                 for pk, mid in items]
        results = self.run(self.broker.publish_many(batch))
        assert len(results) == len(batch)
        for out, res in zip(batch, results, strict=True):
            key = (out.partition_key, out.message_id)
            fresh = key not in self.payloads
            assert res.created == fresh, f"publish {key}: created={res.created}, model={fresh}"
            assert (res.seq is not None) == fresh
            if fresh:
                self.payloads[key] = out.payload
                self.published[key[0]].append(key[1])
                self.new_delivery(key)

    def do_claim(self, n: int) -> list[ClaimedDelivery]:
        candidates = self.claimable()
        by_key = {d.key: d for d in candidates}
        dlq_before = set(self.dlq)
        got = self.run(self.broker.claim(GROUP, self.topic, n))
        dlq_now = self.messages(self.dlq_topic, unsettled_only=False)
        crashed = set(dlq_now) - dlq_before  # dead-lettered by claim: too many lost leases
        returned = [(cd.message.partition_key, cd.message.message_id) for cd in got]
        taken = returned + sorted(crashed)

        assert len(set(taken)) == len(taken), f"claimed twice in one claim: {taken}"
        assert set(taken) <= set(by_key), (
            f"claimed {sorted(set(taken) - set(by_key))}, not claimable; "
            f"claimable: {sorted(by_key)}"
        )
        assert len(taken) == min(n, len(candidates)), (
            f"claim({n}) took {len(taken)} of {len(candidates)} claimable"
        )
        for pk in PARTITIONS:  # per partition, the oldest claimable ones are taken
            in_pk = [d.key for d in candidates if d.key[0] == pk]
            took = {k for k in taken if k[0] == pk}
            assert set(in_pk[: len(took)]) == took, f"{pk}: took {took}, oldest are {in_pk}"
        orders = [by_key[k].order for k in returned]
        assert orders == sorted(orders), "a claim returns deliveries oldest first"
        for key in taken:
            doomed = by_key[key].attempts + 1 > MAX_ATTEMPTS
            assert (key in crashed) == doomed, f"{key}: dead-lettered by claim={key in crashed}"

        for cd in got:
            key = (cd.message.partition_key, cd.message.message_id)
            md = by_key[key]
            assert cd.consumer_group == GROUP
            assert cd.attempt == md.attempts + 1
            assert cd.lease_until_ms == self.now + VISIBILITY_MS
            assert cd.message.payload == self.payloads[key]
            assert md.db_id in (None, cd.delivery_id)
            md.db_id = cd.delivery_id
            md.attempts += 1
            md.token = cd.lease_token
            md.available_at = cd.lease_until_ms
            self.by_db_id[cd.delivery_id] = md
            if key[1] not in self.first_delivered[key[0]]:
                assert cd.attempt == 1, f"first delivery of {key} has attempt {cd.attempt}"
                self.first_delivered[key[0]].append(key[1])
        for key in crashed:
            md = self.deliveries.pop(key)
            self.dlq[key] = md.attempts + 1
            assert dlq_now[key].last_error and "lease expired" in dlq_now[key].last_error
        return got

    def do_settle(self, kind: str, cd: ClaimedDelivery, delay: int = 0) -> None:
        md = self.owner(cd)
        b = self.broker
        if kind == "ack":
            ok = self.run(b.ack(cd))
        elif kind == "retry":
            ok = self.run(b.retry(cd, delay_ms=delay, error="try again"))
        elif kind == "hold":
            ok = self.run(b.hold(cd, delay_ms=delay))
        elif kind == "release":
            ok = self.run(b.release(cd))
        elif kind == "extend":
            ok = self.run(b.extend(cd, lease_ms=delay))
        else:
            assert kind == "dead_letter"
            ok = self.run(b.dead_letter(cd, error="broken", detail={"why": "test"}))
        assert ok == (md is not None), (
            f"{kind} of {cd.message.message_id} (attempt {cd.attempt}) returned {ok}; "
            f"the model says the lease is {'held' if md else 'lost'}"
        )
        if md is None:
            return
        if kind == "ack":
            del self.deliveries[md.key]
            self.acked.add(md.key)
        elif kind == "retry":
            md.available_at, md.token, md.held = self.now + delay, None, False
        elif kind == "hold":
            md.available_at, md.token, md.held = self.now + delay, None, True
            md.attempts = max(md.attempts - 1, 0)
        elif kind == "release":
            md.available_at, md.token = self.now, None
            md.attempts = max(md.attempts - 1, 0)
        elif kind == "extend":
            md.available_at = self.now + delay
        else:
            del self.deliveries[md.key]
            self.dlq[md.key] = md.attempts

    def do_requeue(self, key: Key) -> None:
        row = self.messages(self.dlq_topic, unsettled_only=False)[key]
        msg = self.run(self.broker.requeue(self.dlq_topic, row.seq))
        assert (msg.partition_key, msg.message_id, msg.original_topic) == (*key, self.topic)
        left = self.messages(self.dlq_topic, unsettled_only=False)
        assert key not in left, f"requeued {key} is still in the DLQ"
        del self.dlq[key]
        self.new_delivery(key)

    # -- rules ---------------------------------------------------------------------
    @rule(key=keys)
    def publish(self, key: Key) -> None:
        self.do_publish([key])

    @rule(items=st.lists(keys, min_size=1, max_size=4))
    def publish_many(self, items: list[Key]) -> None:
        self.do_publish(items)

    @rule(n=st.integers(min_value=1, max_value=4))
    def claim(self, n: int) -> None:
        self.hand.extend(self.do_claim(n))

    @precondition(lambda self: self.hand)
    @rule(i=index)
    def ack(self, i: int) -> None:
        self.do_settle("ack", self.take_from_hand(i))

    @precondition(lambda self: self.hand)
    @rule(i=index, delay=delays)
    def retry(self, i: int, delay: int) -> None:
        self.do_settle("retry", self.take_from_hand(i), delay)

    @precondition(lambda self: self.hand)
    @rule(i=index, delay=delays)
    def hold(self, i: int, delay: int) -> None:
        self.do_settle("hold", self.take_from_hand(i), delay)

    @precondition(lambda self: self.hand)
    @rule(i=index)
    def release(self, i: int) -> None:
        self.do_settle("release", self.take_from_hand(i))

    @precondition(lambda self: self.hand)
    @rule(i=index)
    def dead_letter(self, i: int) -> None:
        self.do_settle("dead_letter", self.take_from_hand(i))

    @precondition(lambda self: self.hand)
    @rule(i=index, ms=st.sampled_from([0, 500, VISIBILITY_MS, 3 * VISIBILITY_MS]))
    def extend(self, i: int, ms: int) -> None:
        cd = self.hand[i % len(self.hand)]  # the holder keeps working on it
        self.do_settle("extend", cd, ms)

    @rule(n=st.integers(min_value=1, max_value=4))
    def lose_leases_and_claim(self, n: int) -> None:
        """The holders hang or crash: every lease lapses, and someone claims again."""
        self.now += VISIBILITY_MS
        self.hand.extend(self.do_claim(n))

    @precondition(lambda self: any(self.owner(cd) is None for cd in self.hand))
    @rule(i=index, kind=st.sampled_from(["ack", "retry", "hold", "release", "extend",
                                         "dead_letter"]))
    def settle_with_a_lost_lease(self, i: int, kind: str) -> None:
        """A holder whose lease lapsed (and was re-claimed, or whose message moved on)
        cannot settle, delay or extend it any more."""
        lost = [j for j, cd in enumerate(self.hand) if self.owner(cd) is None]
        self.do_settle(kind, self.hand.pop(lost[i % len(lost)]), 400)

    @rule(ms=st.sampled_from([1, 399, 400, 999, 1000, 1001, 2500]))
    def advance_clock(self, ms: int) -> None:
        self.now += ms  # leases, holds and retry delays lapse without sleeping

    @precondition(lambda self: self.dlq)
    @rule(i=index)
    def requeue(self, i: int) -> None:
        dead = sorted(self.dlq)
        self.do_requeue(dead[i % len(dead)])

    @precondition(lambda self: self.acked or self.dlq)
    @rule(i=index)
    def requeue_refuses_a_message_that_is_not_dead(self, i: int) -> None:
        settled = sorted(self.acked | set(self.dlq))
        key = settled[i % len(settled)]
        row = self.messages(self.topic, unsettled_only=False)[key]
        with pytest.raises(NotDeadLettered):
            self.run(self.broker.requeue(self.topic, row.seq))

    @precondition(lambda self: self.deliveries or self.dlq)
    @rule()
    def drain(self) -> None:
        """Let every lease and delay lapse, requeue the DLQ and ack all: nothing is lost."""
        for _ in range(500):
            if not self.deliveries and not self.dlq:
                break
            self.now += 10 * VISIBILITY_MS
            for key in sorted(self.dlq):
                self.do_requeue(key)
            for cd in self.do_claim(10):
                self.do_settle("ack", cd)
        assert not self.deliveries and not self.dlq
        assert self.acked == self.all_keys()
        assert self.first_delivered == self.published

    # -- invariants ----------------------------------------------------------------
    @invariant()
    def database_agrees_with_the_model(self) -> None:
        # The model itself: each unique message in exactly one place.
        places = [set(self.deliveries), self.acked, set(self.dlq)]
        assert sum(len(p) for p in places) == len(self.all_keys())
        assert set().union(*places) == self.all_keys()

        # Read concurrently: the SQLite backend runs these in one transaction.
        b = self.broker

        async def read() -> tuple[Any, ...]:
            return tuple(await asyncio.gather(
                b.list_messages(self.topic, unsettled_only=False, limit=1000),
                b.list_messages(self.topic, unsettled_only=True, limit=1000),
                b.list_messages(self.dlq_topic, unsettled_only=False, limit=1000),
                b.stats(),
                b.next_due(GROUP, self.topic),
            ))

        all_rows, unsettled_rows, dead_rows, all_stats, next_due = self.run(read())
        everything = by_key(self.topic, all_rows)
        unsettled = by_key(self.topic, unsettled_rows)
        dead = by_key(self.dlq_topic, dead_rows)
        assert set(everything) == self.all_keys(), "a published message is missing or extra"
        assert set(unsettled) == set(self.deliveries), "pending/in-flight messages differ"
        assert set(everything) - set(unsettled) == self.acked | set(self.dlq)
        assert set(dead) == set(self.dlq), "dead letters differ"
        for key, m in dead.items():
            assert m.parked and m.settled_at_ms is None, f"dead letter {key} is not parked"
            assert (m.original_topic, m.source_group) == (self.topic, GROUP)
            assert m.failure_count == self.dlq[key], f"{key}: failure_count"
            assert m.payload == self.payloads[key]

        (stats,) = [s for s in all_stats if s.topic == self.topic]
        (gs,) = stats.groups
        ds = list(self.deliveries.values())
        now = self.now
        expected = {
            "depth": len(ds),
            "in_flight": sum(d.in_flight(now) for d in ds),
            "held": sum(d.held and d.token is None for d in ds),
            "retrying": sum(not d.held and d.token is None and d.available_at > now
                            for d in ds),
            "dlq_size": len(self.dlq),
        }
        actual = {"depth": gs.depth, "in_flight": gs.in_flight, "held": gs.held,
                  "retrying": gs.retrying, "dlq_size": stats.dlq_size}
        assert actual == expected, f"stats {actual}, model {expected}"
        due = [d.available_at for d in ds if d.available_at > now]
        assert next_due == (min(due) if due else None)

        for pk in PARTITIONS:
            firsts = self.first_delivered[pk]
            assert firsts == self.published[pk][: len(firsts)], f"{pk}: first deliveries"
            if self.serial:
                flying = [d.key for d in ds if d.key[0] == pk and d.in_flight(now)]
                assert len(flying) <= 1, f"{pk}: {flying} in flight at once"


# Passing takes seconds; the long timeout leaves room for shrinking a failure
# (Hypothesis stops shrinking after 300 s), which the default would interrupt.
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("serial", [True, False], ids=["serial", "parallel"])
def test_queue_state_machine(database_url: str, serial: bool) -> None:
    env = Env(database_url, serial)
    try:
        run_state_machine_as_test(lambda: QueueMachine(env), settings=SETTINGS)
    finally:
        env.close()
