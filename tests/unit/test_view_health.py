"""The pages' health (pure): which request a failing message concerns, which trouble
wins, and how the forecast is bent by it."""

from __future__ import annotations

from typing import Any

from app.domain.entities import Batch
from app.domain.states import BatchState
from app.queue import Trouble
from app.views.forecast import Forecast
from app.views.health import OK, HealthIndex, honest, stalled

NOW = 1_800_000_000_000


def batch(n: int, *members: int, state: BatchState = BatchState.SPECULATING) -> Batch:
    return Batch(queue="q", id=f"q/batch/{n}", contains=tuple(f"q/{m}" for m in members),
                 dependencies=(), state=state, version=1)


def trouble(topic: str, payload: Any, *, state: str = "retrying", attempts: int = 2,
            **kw: Any) -> Trouble:
    return Trouble(seq=kw.pop("seq", 1), topic=topic, partition_key="q", payload=payload,
                   state=state, attempts=attempts, max_attempts=10,
                   last_error=kw.pop("error", "Boom: down"), **kw)


BATCHES = {b.id: b for b in (batch(1, 1, 2), batch(2, 3),
                             batch(3, 4, state=BatchState.FAILED))}


def index(*troubles: Trouble) -> HealthIndex:
    return HealthIndex("q", troubles, batches=BATCHES, build_batches={"b-7": "q/batch/2"})


def test_each_message_concerns_what_it_names() -> None:
    idx = index(
        trouble("build", {"id": "q/batch/1", "queue": "q"}, seq=1),
        trouble("buildsignal", {"id": "b-7", "queue": "q"}, seq=2),
        trouble("log", {"request_id": "q/9", "queue": "q"}, seq=3),
        trouble("validate", {"id": "q/5", "queue": "q"}, seq=4),
        trouble("validate", {"id": "q/6", "queue": "other"}, seq=5),
        trouble("start", "not a dict", seq=6),
    )
    assert idx.of_request("q/1", "q/batch/1", terminal=False).topic == "build"
    assert idx.of_request("q/2", "q/batch/1", terminal=False).subject == "q/batch/1"
    assert idx.of_request("q/3", "q/batch/2", terminal=False).topic == "buildsignal"
    assert idx.of_request("q/9", None, terminal=False).topic == "log"
    assert idx.of_request("q/5", None, terminal=False).topic == "validate"
    assert idx.of_request("q/6", None, terminal=False) == OK  # another queue's
    assert idx.of_request("q/1", "q/batch/1", terminal=True) == OK  # over: see its removal


def test_speculate_concerns_every_live_batch_and_the_worst_trouble_wins() -> None:
    idx = index(
        trouble("speculate", {"id": "q/batch/1", "queue": "q"}, seq=1, attempts=1),
        trouble("build", {"id": "q/batch/2", "queue": "q"}, seq=2, attempts=3),
        trouble("merge", {"id": "q/batch/2", "queue": "q"}, seq=3, state="dead_lettered",
                attempts=10, reconciler_paused=True, dlq_topic="merge_dlq"),
    )
    assert idx.queue_wide is not None and idx.queue_wide.topic == "speculate"
    assert idx.of_request("q/1", "q/batch/1", terminal=False).topic == "speculate"
    assert idx.of_request("q/4", "q/batch/3", terminal=False) == OK  # its batch failed
    worst = idx.of_request("q/3", "q/batch/2", terminal=False)
    assert (worst.state, worst.topic, worst.needs_operator) == ("dead_lettered", "merge", True)
    assert worst.admin_url == "/admin"
    assert worst.text.startswith("dead-lettered at merge after 10 attempts — needs an "
                                 "operator (its reconciler is paused): see /admin")
    assert idx.of_batch("q/batch/2") == worst


def test_attempts_count_failures_and_texts_say_what_happens_next() -> None:
    waiting = index(trouble("build", {"id": "q/batch/1", "queue": "q"}, attempts=3,
                            next_attempt_ms=NOW + 4000)).of_batch("q/batch/1")
    assert (waiting.attempts, waiting.next_attempt_ms, waiting.admin_url) == (3, NOW + 4000,
                                                                              None)
    assert waiting.text == ("retrying at build (3 of 10 attempts failed; waiting for the next "
                            "attempt): last error: Boom: down")
    running = index(trouble("build", {"id": "q/batch/1", "queue": "q"}, attempts=4,
                            running=True)).of_batch("q/batch/1")
    assert running.attempts == 3 and "the next attempt is under way" in running.text
    plain = index(trouble("build", {"id": "q/batch/1", "queue": "q"}, state="dead_lettered",
                          attempts=10)).of_batch("q/batch/1")
    assert not plain.needs_operator and "its reconciler will end it as error" in plain.text


def test_a_stall_shows_only_when_nothing_worse_does() -> None:
    st = stalled(NOW - 40 * 60_000, NOW, 30 * 60_000)
    assert st.state == "stalled" and "40 min" in st.text and "30 min" in st.text
    assert index().of_request("q/1", "q/batch/1", terminal=False, stall=st) == st
    busy = index(trouble("build", {"id": "q/batch/1", "queue": "q"}))
    assert busy.of_request("q/1", "q/batch/1", terminal=False, stall=st).state == "retrying"


def test_the_forecast_is_bent_by_the_health() -> None:
    f = Forecast(1.0, 1.0, NOW + 60_000, "merging: a passed build's assumptions came true")
    dead = index(trouble("merge", {"id": "q/batch/1", "queue": "q"}, state="dead_lettered",
                         attempts=10, reconciler_paused=True)).of_batch("q/batch/1")
    out = honest(f, dead, batch=BATCHES["q/batch/1"], now_ms=NOW)
    assert out is not None
    assert (out.p_land, out.p_speculation_holds, out.eta_at_ms) == (0.0, 0.0, None)
    assert out.basis == ("0 %: dead-lettered at merge after 10 attempts, so it ends as error "
                         "unless an operator requeues it from /admin; no ETA (the planner "
                         "alone said 100 %)")
    landed = honest(f, dead, batch=batch(1, 1, state=BatchState.SUCCEEDED), now_ms=NOW)
    assert landed is not None and landed.p_land == 1.0  # the reconciler finishes a landing

    retry = index(trouble("merge", {"id": "q/batch/1", "queue": "q"},
                          next_attempt_ms=NOW + 8000)).of_batch("q/batch/1")
    out = honest(f, retry, batch=BATCHES["q/batch/1"], now_ms=NOW)
    assert out is not None and out.p_land == 1.0 and out.eta_at_ms == NOW + 68_000
    assert "merge is retrying (2 attempts failed)" in out.basis

    out = honest(f, stalled(NOW - 3_600_000, NOW, 1_800_000), batch=None, now_ms=NOW)
    assert out is not None and out.eta_at_ms is None and "ETA unknown: stalled" in out.basis
    assert honest(f, OK, batch=None, now_ms=NOW) is f
    assert honest(None, dead, batch=None, now_ms=NOW) is None
