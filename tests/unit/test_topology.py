"""Topology declarations and the SQL placeholder rewriting shared by both backends."""

from __future__ import annotations

import pytest

from app.queue import Backoff, TopicSpec, Topology, UnknownTopic
from app.queue.dialect import to_positional


def test_declaring_a_topic_declares_its_dead_letter_companion() -> None:
    topo = Topology()
    topo.declare(TopicSpec("build", serial=True, max_attempts=3))
    dlq = topo.spec("build_dlq")
    assert dlq.max_attempts == 1000 and dlq.always_retry and not dlq.dlq
    assert topo.groups("build") == [] and topo.groups("build_dlq") == []


def test_topic_without_dlq_has_no_companion() -> None:
    topo = Topology()
    topo.declare(TopicSpec("log_dlq_less", dlq=False))
    with pytest.raises(UnknownTopic):
        topo.spec("log_dlq_less_dlq")


def test_conflicting_redeclaration_is_refused() -> None:
    topo = Topology()
    topo.declare(TopicSpec("a", serial=True))
    topo.declare(TopicSpec("a", serial=True))
    with pytest.raises(ValueError, match="declared twice"):
        topo.declare(TopicSpec("a", serial=False))


def test_subscribing_to_an_unknown_topic_fails_clearly() -> None:
    with pytest.raises(UnknownTopic, match="'nope' is not declared"):
        Topology().subscribe("nope", "g")


def test_backoff_grows_and_is_capped() -> None:
    b = Backoff(initial_ms=100, max_ms=1000)
    assert [b.delay_ms(n) for n in (1, 2, 3, 4, 5, 50)] == [100, 200, 400, 800, 1000, 1000]


def test_named_parameters_become_positional_once_each() -> None:
    sql, order = to_positional("SELECT :a, :b::text, :a, x::int FROM t WHERE y = :c")
    assert sql == "SELECT $1, $2::text, $1, x::int FROM t WHERE y = $3"
    assert order == ["a", "b", "c"]


def test_a_group_filter_decides_who_gets_a_message_and_a_failing_one_delivers() -> None:
    topo = Topology()
    topo.declare(TopicSpec("log"))
    for g in ("gateway", "relay", "fragile"):
        topo.subscribe("log", g)
    topo.filter("log", "relay", lambda payload: payload.get("queue") == "loud")

    def broken(payload: object) -> bool:
        raise KeyError("a filter's bug")

    topo.filter("log", "fragile", broken)
    assert topo.groups_for("log", {"queue": "loud"}) == ["fragile", "gateway", "relay"]
    assert topo.groups_for("log", {"queue": "quiet"}) == ["fragile", "gateway"]
    assert topo.groups("log") == ["fragile", "gateway", "relay"]  # subscriptions unchanged
    with pytest.raises(ValueError, match="not subscribed"):
        topo.filter("log", "nobody", lambda _p: True)
