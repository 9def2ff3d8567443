"""Whether a request's pipeline work is healthy, from the queue's failing messages (pure).

``Broker.troubles()`` lists, in one statement, every unsettled message that failed at
least once: deliveries retrying and dead letters (parked, or waiting for a reconciler
that may be paused). :class:`HealthIndex` maps them to what they concern and answers
per request:

| Message (``payload``) | Concerns |
|---|---|
| ``log`` (``request_id``) | that request |
| ``speculate`` (``id`` = a batch the wake-up named) | the whole queue: every request in a live batch (a run plans them all) |
| ``buildsignal`` (``id`` = a build id) | the build's batch, hence its members |
| ``id`` = a batch id | the batch's member requests |
| any other ``id`` | that request (sqid) |

A request's health is the worst that concerns it: a dead letter that needs an operator
(parked, or its reconciler paused), then any dead letter, then a retry (most attempts
first), then ``stalled`` (the stall detector flagged it, ``app/views/stalls.py``), else
``ok``. Terminal requests are ``ok``: what happened is in their removal reason.

How it bends the forecast (:func:`honest`): a dead letter's reconciler ends the work in
``error`` unless an operator requeues it, so P(land) is 0, so is the chance that the
builds under way count, and there is no ETA (all kept when
its batch already landed: the reconciler finishes that conclusion); a retry pushes the
ETA back to its next attempt, which the ETA then assumes succeeds; a stalled request has
no ETA.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.domain.entities import Batch
from app.domain.states import BatchState
from app.queue import Trouble
from app.views.forecast import Forecast

ADMIN_URL = "/admin"
QUEUE_WIDE = frozenset({"speculate"})
_BUILD_TOPIC = "buildsignal"


@dataclass(frozen=True, slots=True)
class Health:
    state: str  # ok | retrying | dead_lettered | stalled
    topic: str = ""
    subject: str = ""
    attempts: int = 0
    max_attempts: int | None = None
    last_error: str = ""
    next_attempt_ms: int | None = None
    running: bool = False
    needs_operator: bool = False
    operator_reason: str = ""
    since_ms: int | None = None
    text: str = ""

    @property
    def admin_url(self) -> str | None:
        return ADMIN_URL if self.state == "dead_lettered" else None


OK = Health("ok")


def _rank(h: Health) -> tuple[int, int]:
    order = {"dead_lettered": 3 if h.needs_operator else 2, "retrying": 1}
    return order.get(h.state, 0), h.attempts


def _failed(t: Trouble) -> int:
    """Attempts that failed so far (a running attempt is not one of them yet)."""
    return max(0, t.attempts - 1) if t.running else t.attempts


def from_trouble(t: Trouble, subject: str) -> Health:
    failed = _failed(t)
    budget = f" of {t.max_attempts}" if t.max_attempts else ""
    if t.state == "retrying":
        nxt = "the next attempt is under way" if t.running else "waiting for the next attempt"
        text = (f"retrying at {t.topic} ({failed}{budget} attempts failed; {nxt}): "
                f"last error: {t.last_error}")
        return Health("retrying", t.topic, subject, failed, t.max_attempts, t.last_error,
                      t.next_attempt_ms, t.running, text=text)
    reason = ("parked: no reconciler will take it" if t.parked
              else "its reconciler is paused" if t.reconciler_paused else "")
    tail = (f" — needs an operator ({reason}): see {ADMIN_URL}" if reason
            else " — its reconciler will end it as error")
    text = (f"dead-lettered at {t.topic} after {failed} attempts{tail}; "
            f"last error: {t.last_error}")
    return Health("dead_lettered", t.topic, subject, failed, t.max_attempts, t.last_error,
                  None, False, needs_operator=t.needs_operator, operator_reason=reason,
                  since_ms=t.failed_at_ms, text=text)


def stalled(since_ms: int, now_ms: int, threshold_ms: int) -> Health:
    minutes = max(0, now_ms - since_ms) // 60_000
    return Health("stalled", since_ms=since_ms, text=(
        f"stalled: nothing about it has changed for {minutes} min (more than "
        f"{threshold_ms // 60_000} min), and it is the oldest request in flight"))


class HealthIndex:
    """The troubles of one queue, by what they concern."""

    def __init__(self, queue: str, troubles: Iterable[Trouble], *,
                 batches: Mapping[str, Batch], build_batches: Mapping[str, str]) -> None:
        self.queue = queue
        self.batches = batches
        self.by_subject: dict[str, Health] = {}
        self.queue_wide: Health | None = None
        for t in troubles:
            p: Any = t.payload
            if not isinstance(p, dict) or p.get("queue") != queue:
                continue
            subject = str(p.get("request_id") or p.get("id") or "")
            if t.topic in QUEUE_WIDE:
                h = from_trouble(t, queue)
                if self.queue_wide is None or _rank(h) > _rank(self.queue_wide):
                    self.queue_wide = h
                continue
            if t.topic == _BUILD_TOPIC:
                subject = build_batches.get(subject, subject)
            if not subject:
                continue
            self._put(subject, from_trouble(t, subject))

    def _put(self, subject: str, h: Health) -> None:
        old = self.by_subject.get(subject)
        if old is None or _rank(h) > _rank(old):
            self.by_subject[subject] = h

    def of_batch(self, batch_id: str | None) -> Health:
        best = OK
        if batch_id:
            own = self.by_subject.get(batch_id)
            if own is not None:
                best = own
            b = self.batches.get(batch_id)
            if self.queue_wide is not None and b is not None and not b.state.terminal \
                    and _rank(self.queue_wide) > _rank(best):
                best = self.queue_wide
        return best

    def of_request(self, sqid: str, batch_id: str | None, *, terminal: bool,
                   stall: Health | None = None) -> Health:
        if terminal:
            return OK
        best = self.of_batch(batch_id)
        own = self.by_subject.get(sqid)
        if own is not None and _rank(own) > _rank(best):
            best = own
        if best.state == "ok" and stall is not None:
            return stall
        return best


def honest(f: Forecast | None, h: Health, *, batch: Batch | None, now_ms: int
           ) -> Forecast | None:
    """The forecast bent by what the health says (module docstring)."""
    if f is None or h.state == "ok":
        return f
    if h.state == "dead_lettered":
        if batch is not None and batch.state is BatchState.SUCCEEDED:
            return replace(f, basis=f"{f.basis}; {h.text}")
        who = ("unless an operator requeues it from /admin" if h.needs_operator
               else "unless an operator requeues it before its reconciler runs")
        return Forecast(0.0, 0.0, None,
                        f"0 %: dead-lettered at {h.topic} after {h.attempts} attempts, so it "
                        f"ends as error {who}; no ETA (the planner alone said "
                        f"{_pct(f.p_land)})", "health")
    if h.state == "retrying":
        eta = f.eta_at_ms
        if eta is not None and h.next_attempt_ms is not None:
            eta += max(0, h.next_attempt_ms - now_ms)
        return replace(f, eta_at_ms=eta,
                       basis=f"{f.basis}; {h.topic} is retrying ({h.attempts} attempts "
                       "failed): the chance and the ETA assume its next attempt succeeds")
    return replace(f, eta_at_ms=None, basis=f"{f.basis}; ETA unknown: {h.text}")


def _pct(p: float | None) -> str:
    return "unknown" if p is None else f"{round(p * 100)} %"
