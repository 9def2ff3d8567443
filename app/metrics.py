"""Prometheus metrics: one ``Metrics`` (with its own ``CollectorRegistry``) per app.

Every family is named ``submitqueue_*``. Two kinds of source:

- **Events**, recorded as they happen in this process: queue handler runs (the
  consumer framework's ``on_handled`` hook), speculation runs, merger calls and merge
  outcomes, requests reaching a terminal status (the ``PipelineMetrics`` observer the
  controllers call), and HTTP requests (``app/api/middleware.py``). These are
  per-process: sum them across processes.
- **State**, read from the database: queue depth / in flight / held / retrying /
  oldest age / paused per topic and consumer group, DLQ sizes, requests by status,
  builds in flight. Read when ``/metrics`` is scraped, at most once per
  ``SQ_METRICS_REFRESH_MS`` (so a value is at most that old when scraped; a failed
  or slow read keeps the previous values and counts
  ``submitqueue_metrics_refresh_errors_total``). Every process reports the same
  shared state: aggregate these with ``max``, not ``sum``.

``docs/observability.md`` lists every family with its labels.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.controllers.common import Timed, finished_request
from app.db.engine import Database, DbStats
from app.db.repos import circuits as circuit_repo
from app.db.repos import freezes as freeze_repo
from app.db.repos import gauges
from app.db.repos import request_log as request_log_repo
from app.domain.entities import RequestLog, RequestSummary
from app.domain.freeze import FreezeWindowConfig
from app.domain.freeze import current as current_freeze
from app.domain.outages import Circuit
from app.queue import Broker, TopicStats

log = logging.getLogger("submitqueue.metrics")

# No ``*_created`` series next to every counter and histogram: they double the
# exposition and nothing here reads them (a process-wide prometheus_client setting).
disable_created_metrics()  # type: ignore[no-untyped-call]

NS = "submitqueue"
REFRESH_TIMEOUT_S = 5.0

HANDLER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                   60, 120)
LAND_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200,
                14400, 43200, 86400)
SPECULATION_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1,
                       0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30)
PLANNER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1, 2.5, 5)
MERGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class StateSnapshot:
    """What the database said at ``taken_at`` (monotonic seconds)."""

    topics: list[TopicStats] = field(default_factory=list)
    requests: dict[str, dict[str, int]] = field(default_factory=dict)
    live_builds: dict[str, int] = field(default_factory=dict)
    circuits: list[Circuit] = field(default_factory=list)
    frozen: dict[str, bool] = field(default_factory=dict)  # per configured queue
    taken_at: float | None = None
    taken_at_ms: int = 0


StateSource = Callable[[], Awaitable[StateSnapshot]]
StallSource = Callable[[], list[tuple[str, bool, float]]]


def state_source(db: Database, broker: Broker,
                 windows: Mapping[str, tuple[FreezeWindowConfig, ...]] | None = None
                 ) -> StateSource:
    """Read the shared state from the orchestrator/gateway database and the queue;
    ``windows``: each configured queue's freeze windows (``submitqueue_queue_frozen``)."""

    async def read() -> StateSnapshot:
        topics = await broker.stats()
        now = broker.clock()
        async with db.read() as s:
            requests = await request_log_repo.counts_by_status(s)
            live = await gauges.live_builds(s)
            circuits = list((await circuit_repo.load_all(s)).values())
            manual = await freeze_repo.get_many(s, queues=list(windows or {}))
        frozen = {q: current_freeze(q, manual.get(q), w, now) is not None
                  for q, w in (windows or {}).items()}
        return StateSnapshot(topics=topics, requests=requests, live_builds=live,
                             circuits=circuits, frozen=frozen, taken_at=time.monotonic(),
                             taken_at_ms=now)

    return read


class _StateCollector(Collector):
    """Yields the gauges of the last snapshot (sync, as prometheus collectors are)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        snap = self.metrics.snapshot
        tg = ["topic", "group"]
        depth = GaugeMetricFamily(f"{NS}_queue_depth", "Unsettled deliveries (waiting, in "
                                  "flight, held or retrying)", labels=tg)
        in_flight = GaugeMetricFamily(f"{NS}_queue_in_flight", "Deliveries leased to a handler "
                                      "(any process)", labels=tg)
        held = GaugeMetricFamily(f"{NS}_queue_held", "Deliveries postponed by hold()", labels=tg)
        retrying = GaugeMetricFamily(f"{NS}_queue_retrying", "Deliveries waiting for a retry",
                                     labels=tg)
        oldest = GaugeMetricFamily(f"{NS}_queue_oldest_age_seconds", "Age of the oldest "
                                   "unsettled delivery (0 when none)", labels=tg)
        paused = GaugeMetricFamily(f"{NS}_queue_paused", "1 when the consumer group is paused "
                                   "on the whole topic", labels=tg)
        dlq = GaugeMetricFamily(f"{NS}_queue_dlq_size", "Unsettled messages in the topic's "
                                "dead-letter queue", labels=["topic"])
        dlq_parked = GaugeMetricFamily(f"{NS}_queue_dlq_parked", "Dead letters parked for an "
                                       "operator", labels=["topic"])
        for t in snap.topics:
            for g in t.groups:
                labels = [g.topic, g.consumer_group]
                depth.add_metric(labels, g.depth)
                in_flight.add_metric(labels, g.in_flight)
                held.add_metric(labels, g.held)
                retrying.add_metric(labels, g.retrying)
                oldest.add_metric(labels, (g.oldest_age_ms or 0) / 1000)
                paused.add_metric(labels, 1 if g.paused else 0)
            if t.dlq_topic is not None:
                dlq.add_metric([t.topic], t.dlq_size)
                dlq_parked.add_metric([t.topic], t.dlq_parked)
        requests = GaugeMetricFamily(f"{NS}_requests", "Land requests by current status",
                                     labels=["queue", "status"])
        for queue, counts in sorted(snap.requests.items()):
            for status, n in sorted(counts.items()):
                requests.add_metric([queue, status], n)
        builds = GaugeMetricFamily(f"{NS}_builds_in_flight", "Builds not yet terminal",
                                   labels=["queue"])
        budget = GaugeMetricFamily(f"{NS}_build_budget", "Configured build budget (live "
                                   "speculation paths allowed)", labels=["queue"])
        for queue, n in sorted(self.metrics.budgets.items()):
            builds.add_metric([queue], snap.live_builds.get(queue, 0))
            budget.add_metric([queue], n)
        circuit_open = GaugeMetricFamily(f"{NS}_circuit_open", "1 while the dependency's "
                                         "circuit is open (unreachable)", labels=["dependency"])
        open_for = GaugeMetricFamily(f"{NS}_circuit_open_seconds", "How long the circuit has "
                                     "been open (0 when closed)", labels=["dependency"])
        for c in sorted(snap.circuits, key=lambda c: c.dependency):
            circuit_open.add_metric([c.dependency], 1 if c.is_open else 0)
            open_for.add_metric([c.dependency], c.open_for_ms(snap.taken_at_ms) / 1000)
        stalled = GaugeMetricFamily(f"{NS}_queue_stalled", "1 while the queue's oldest "
                                    "in-flight request has not moved for longer than "
                                    "SQ_STALL_THRESHOLD_MS (the stall detector's last check)",
                                    labels=["queue"])
        unmoved = GaugeMetricFamily(f"{NS}_queue_unmoved_seconds", "How long the queue's "
                                    "oldest in-flight request has not moved (0 when nothing "
                                    "is in flight)", labels=["queue"])
        for queue, is_stalled, seconds in self.metrics.stalls():
            stalled.add_metric([queue], 1 if is_stalled else 0)
            unmoved.add_metric([queue], seconds)
        frozen = GaugeMetricFamily(f"{NS}_queue_frozen", "1 while the queue is frozen (a "
                                   "manual freeze or a freeze window: it lands nothing)",
                                   labels=["queue"])
        for queue, is_frozen in sorted(snap.frozen.items()):
            frozen.add_metric([queue], 1 if is_frozen else 0)
        age = GaugeMetricFamily(f"{NS}_metrics_state_age_seconds", "Age of the database "
                                "state behind the gauges above (-1 before the first read)")
        age.add_metric([], -1 if snap.taken_at is None else time.monotonic() - snap.taken_at)
        yield from (depth, in_flight, held, retrying, oldest, paused, dlq, dlq_parked,
                    requests, builds, budget, circuit_open, open_for, stalled, unmoved, frozen,
                    age)


def _counts(name: str, doc: str, label: str, counts: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=[label])
    for value, n in sorted(counts.items()):
        family.add_metric([value], n)
    return family


class _WorkCollector(Collector):
    """What this process asked of its databases, since it started (counters read from
    ``Database.stats`` and the broker): the cost of the pipeline's work, per landed
    request when divided by ``submitqueue_merges_total``."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        work = self.metrics.work
        if work is None:
            return
        stats, broker = work
        statements = _counts(f"{NS}_db_statements", "SQL statements sent through SQLAlchemy, "
                             "by kind (their first word)", "kind", stats.statements)
        transactions = _counts(f"{NS}_db_transactions", "SQLAlchemy transactions ended, by "
                               "outcome (commit, rollback)", "outcome", stats.transactions)
        connections = CounterMetricFamily(f"{NS}_db_connections_opened", "Database "
                                          "connections SQLAlchemy's pool opened")
        connections.add_metric([], stats.connections)
        published = _counts(f"{NS}_queue_published", "New messages stored by this process, "
                            "per topic (duplicates not counted)", "topic", broker.published)
        operations = CounterMetricFamily(f"{NS}_queue_operations", "Operations (each one "
                                         "transaction) run by the queue's own backend")
        operations.add_metric([], broker.backend.ops_run)
        yield from (statements, transactions, connections, published, operations)


class Metrics:
    """The registry and every family; also the observer the consumers and controllers call."""

    def __init__(self, *, version: str = "", role: str = "all",
                 refresh_interval_ms: int = 5000, process_metrics: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.refresh_interval_s = refresh_interval_ms / 1000
        self.budgets: dict[str, int] = {}
        self.snapshot = StateSnapshot()
        self._source: StateSource | None = None
        self.work: tuple[DbStats, Broker] | None = None
        self.stalls: StallSource = lambda: []
        self._lock = asyncio.Lock()

        Gauge(f"{NS}_info", "Build and role of this process", ["version", "role"],
              registry=r).labels(version, role).set(1)
        if process_metrics:
            ProcessCollector(namespace=NS, registry=r)
        self.handled = Counter(f"{NS}_queue_handled", "Handler runs by outcome (acked, held, "
                               "retried, dead_lettered, released, lease_lost, error)",
                               ["topic", "group", "outcome"], registry=r)
        self.handler_seconds = Histogram(f"{NS}_queue_handler_duration_seconds",
                                         "Handler run time", ["topic", "group"],
                                         buckets=HANDLER_BUCKETS, registry=r)
        self.land_seconds = Histogram(f"{NS}_land_duration_seconds", "Receipt of a land "
                                      "request to its terminal status", ["queue", "status"],
                                      buckets=LAND_BUCKETS, registry=r)
        self.speculation_seconds = Histogram(f"{NS}_speculation_run_duration_seconds",
                                             "One speculation run over a queue",
                                             ["queue", "outcome"],
                                             buckets=SPECULATION_BUCKETS, registry=r)
        self.planner_seconds = Histogram(f"{NS}_planner_duration_seconds", "The pure "
                                         "planner's part of one speculation run",
                                         ["queue", "outcome"], buckets=PLANNER_BUCKETS,
                                         registry=r)
        self.merge_seconds = Histogram(f"{NS}_merge_duration_seconds", "One merger call "
                                       "(apply and push a batch)", ["queue", "outcome"],
                                       buckets=MERGE_BUCKETS, registry=r)
        self.merges = Counter(f"{NS}_merges", "Merge outcomes written to batches",
                              ["queue", "outcome"], registry=r)
        self.target_moves = Counter(f"{NS}_target_moves", "Moves of a target branch outside "
                                    "the queue found by the merger (each a new trunk epoch)",
                                    ["queue"], registry=r)
        self.moved_rebuilds = Counter(f"{NS}_target_move_rebuilds", "Speculation paths "
                                      "refuted and rebuilt because the target moved outside "
                                      "the queue", ["queue"], registry=r)
        self.untested_trees = Counter(f"{NS}_untested_tree_refusals", "Merges refused "
                                      "because the new tip's tree was not a passed build's",
                                      ["queue"], registry=r)
        self.http_requests = Counter(f"{NS}_http_requests", "HTTP requests answered",
                                     ["method", "route", "status"], registry=r)
        self.http_seconds = Histogram(f"{NS}_http_request_duration_seconds",
                                      "HTTP request time", ["method", "route"],
                                      buckets=HTTP_BUCKETS, registry=r)
        self.auth_refusals = Counter(f"{NS}_auth_refusals", "Calls refused for want of a "
                                     "valid token (unauthorized) or a scope (missing_scope, "
                                     "forbidden, admin_disabled)", ["scope", "code"],
                                     registry=r)
        self.quota_refusals = Counter(f"{NS}_quota_refusals", "Land requests refused by a "
                                      "quota (in_flight, per_hour); nothing was stored",
                                      ["queue", "limit"], registry=r)
        self.land_requests = Counter(f"{NS}_land_requests", "Land requests accepted (a "
                                     "new sqid; replays of an Idempotency-Key not counted), "
                                     "by priority (normal, high, hotfix)",
                                     ["queue", "priority"], registry=r)
        self.refresh_errors = Counter(f"{NS}_metrics_refresh_errors", "Failed or timed-out "
                                      "reads of the database state", registry=r)
        self.job_runs = Counter(f"{NS}_scheduler_job_runs", "Runs of the scheduler's periodic "
                                "jobs by outcome (ok, error)", ["job", "outcome"], registry=r)
        self.job_seconds = Histogram(f"{NS}_scheduler_job_duration_seconds",
                                     "One run of a periodic job", ["job"],
                                     buckets=HANDLER_BUCKETS, registry=r)
        self.job_last_ok = Gauge(f"{NS}_scheduler_job_last_success_timestamp_seconds",
                                 "When each periodic job last ran without error (unix s)",
                                 ["job"], registry=r)
        r.register(_StateCollector(self))
        r.register(_WorkCollector(self))

    # -- wiring -------------------------------------------------------------------
    def attach(self, source: StateSource, budgets: Mapping[str, int]) -> None:
        self._source = source
        self.budgets = dict(budgets)

    def attach_stalls(self, source: StallSource) -> None:
        """The stall detector's verdicts: ``(queue, stalled, seconds unmoved)`` each."""
        self.stalls = source

    def attach_work(self, stats: DbStats, broker: Broker) -> None:
        """Report what this process asks of its databases (``_WorkCollector``)."""
        self.work = (stats, broker)

    # -- consumer framework hook --------------------------------------------------
    def on_handled(self, topic: str, group: str, outcome: str, seconds: float) -> None:
        self.handled.labels(topic, group, outcome).inc()
        self.handler_seconds.labels(topic, group).observe(seconds)

    # -- PipelineMetrics (controllers) -------------------------------------------
    def timed(self, what: Timed, queue: str, seconds: float, ok: bool) -> None:
        outcome = "ok" if ok else "error"
        hist = {"speculation": self.speculation_seconds, "planner": self.planner_seconds,
                "merge": self.merge_seconds}[what]
        hist.labels(queue, outcome).observe(seconds)

    def merge_finished(self, queue: str, outcome: str) -> None:
        self.merges.labels(queue, outcome).inc()

    def untested_tree(self, queue: str, *, moved: bool) -> None:
        self.untested_trees.labels(queue).inc()
        if moved:
            self.target_moves.labels(queue).inc()

    def rebuilt_after_move(self, queue: str, count: int) -> None:
        if count:
            self.moved_rebuilds.labels(queue).inc(count)

    def log_folded(self, entry: RequestLog, before: RequestSummary | None) -> None:
        finished = finished_request(entry, before)
        if finished is not None:
            status, seconds = finished
            self.land_seconds.labels(entry.queue, status).observe(seconds)

    # -- scheduler hook -----------------------------------------------------------
    def job_finished(self, job: str, ok: bool, seconds: float) -> None:
        self.job_runs.labels(job, "ok" if ok else "error").inc()
        self.job_seconds.labels(job).observe(seconds)
        if ok:
            self.job_last_ok.labels(job).set(time.time())

    # -- HTTP ---------------------------------------------------------------------
    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_seconds.labels(method, route).observe(seconds)

    # -- access ---------------------------------------------------------------------
    def auth_refused(self, scope: str, code: str) -> None:
        self.auth_refusals.labels(scope, code).inc()

    def quota_refused(self, queue: str, limit: str) -> None:
        self.quota_refusals.labels(queue, limit).inc()

    def land_accepted(self, queue: str, priority: str) -> None:
        self.land_requests.labels(queue, priority).inc()

    # -- scrape -------------------------------------------------------------------
    async def refresh(self, *, force: bool = False) -> None:
        """Re-read the database state unless the last read is recent enough."""
        if self._source is None:
            return
        async with self._lock:
            taken = self.snapshot.taken_at
            if not force and taken is not None and \
                    time.monotonic() - taken < self.refresh_interval_s:
                return
            try:
                self.snapshot = await asyncio.wait_for(self._source(), REFRESH_TIMEOUT_S)
            except Exception as exc:
                self.refresh_errors.inc()
                log.warning("metrics state read failed; serving the previous values",
                            extra={"error": type(exc).__name__})

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition (Prometheus text, or OpenMetrics if ``accept`` asks for it)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
