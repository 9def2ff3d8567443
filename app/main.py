"""Composition root: ``create_app(settings)`` builds the FastAPI app; its lifespan
migrates the database and starts the background services (queue broker, command
runners, consumers, then the scheduler of periodic jobs) on an ``AsyncExitStack``: they
stop in the reverse order, also when a later one fails to start."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from alembic.script import ScriptDirectory
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from app import __version__
from app.api import health
from app.api.access_log import AccessLog
from app.api.app_routes import install
from app.api.docs import install_docs
from app.api.middleware import HttpMetrics, SecurityHeaders
from app.controllers.common import Deps, log_ids
from app.controllers.freeze import FreezeThaw
from app.controllers.outages import OutageGuard, webhook_notifier
from app.controllers.pipeline import (
    TopicSettings,
    build_consumers,
    build_topology,
    install_filters,
)
from app.controllers.resync import SpeculateResync
from app.db import migrate
from app.db.engine import Database
from app.db.repos.build_runs import SqlBuildStore
from app.domain.outages import OutagePolicy
from app.domain.queue_config import QueueConfig
from app.domain.redaction import SecretMask
from app.extensions.base import QueueExtensions
from app.extensions.factory import ExtensionRegistry, load_queues_file, webhook_secrets
from app.gateway.access import Access, AccessPolicy
from app.gateway.github_resync import GitHubResync
from app.logs import configure_logging
from app.metrics import Metrics, state_source
from app.queue import Backoff, Broker, Chaos, ConsumerService, backend_for_url
from app.scheduler import Scheduler
from app.settings import Settings, get_settings
from app.speculation.scoring import build_scorer
from app.views.checkfacts import facts_source
from app.views.data import TimingCache
from app.views.events import EventHub
from app.views.stalls import StallDetector

log = logging.getLogger("submitqueue")
OPEN_WARNING = ("SQ_AUTH=open on an address other machines can reach: anyone who reaches "
                "this server may land and cancel; set SQ_AUTH=required and create tokens "
                "(docs/access.md)")


class Runtime:
    """Everything the lifespan starts, reachable from request handlers via app.state."""

    def __init__(
        self,
        settings: Settings,
        *,
        extension_overrides: dict[str, QueueExtensions] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics(version=__version__, role=settings.role,
                                          refresh_interval_ms=settings.metrics_refresh_ms)
        self.queues: dict[str, QueueConfig] = load_queues_file(settings.queues_file)
        self.db = Database(settings.database_url)
        # known secrets never reach a stored build log (served to anyone)
        mask = SecretMask.of([*settings.secret_values(), *webhook_secrets(self.queues)])
        self.extensions = ExtensionRegistry(self.queues, overrides=extension_overrides,
                                            scorer_factory=build_scorer,
                                            build_store=SqlBuildStore(self.db, mask=mask),
                                            public_url=settings.public_url)
        topology = build_topology(TopicSettings(
            max_attempts=settings.queue_max_attempts,
            visibility_timeout_ms=settings.queue_visibility_timeout_ms,
            backoff=Backoff(initial_ms=100, max_ms=10_000),
        ))
        queue_url = settings.effective_queue_database_url
        shared_file = queue_url == settings.database_url
        self.broker = Broker(
            backend_for_url(queue_url,
                            sqlite_write_lock=self.db.write_lock if shared_file else None),
            topology,
            max_payload_bytes=settings.queue_max_payload_bytes,
            member_id=settings.effective_member_id,
        )
        self.view_timing = TimingCache()  # the pages' recent build and merge times
        windows = {n: q.freeze_windows for n, q in self.queues.items()}
        self.deps = Deps(db=self.db, broker=self.broker, extensions=self.extensions.for_queue,
                         metrics=self.metrics, freeze_windows=windows,
                         freeze_recheck_ms=settings.freeze_recheck_ms,
                         check_facts=facts_source(self, public_url=settings.public_url,
                                                  timings=self.view_timing,
                                                  stalls=lambda: self.stalls,
                                                  windows=windows))
        install_filters(topology, self.deps)
        self.metrics.attach(state_source(self.db, self.broker, self.deps.freeze_windows),
                            {name: q.build_budget for name, q in self.queues.items()})
        self.metrics.attach_work(self.db.stats, self.broker)
        orchestrator = settings.role in ("all", "worker")
        gateway = settings.role in ("all", "gateway")
        self.outages = OutageGuard(
            self.deps, base=outage_policy(settings), queues=self.queues,
            recheck_ms=settings.outage_recheck_ms,
            refresh_ms=min(1000, settings.outage_recheck_ms),
            notify=webhook_notifier(settings.outage_notify_url)
            if settings.outage_notify_url else None)
        self.consumers = ConsumerService(
            self.broker,
            build_consumers(self.deps, orchestrator=orchestrator, gateway=gateway,
                            concurrency=settings.queue_concurrency),
            poll_interval_ms=settings.queue_poll_interval_ms,
            shutdown_grace_ms=settings.queue_shutdown_grace_ms,
            chaos=Chaos(duplicate=settings.queue_chaos_duplicate,
                        fail_rate=settings.queue_chaos_fail_rate),
            on_handled=self.metrics.on_handled,
            log_context=log_ids,
            guard=self.outages if orchestrator else None,
        )
        self.access = Access(self.db, AccessPolicy(
            mode=settings.effective_auth, reads_required=settings.auth_reads == "required",
            admin_token=settings.admin_token or None), self.broker.clock)
        self.event_hub = EventHub(self.db)  # live streams of the pages (gateway roles)
        self.stalls = StallDetector(self.db, list(self.queues),
                                    threshold_ms=settings.stall_threshold_ms,
                                    clock=self.broker.clock) \
            if settings.stall_threshold_ms else None
        self.metrics.attach_stalls(self._stall_gauges)
        self.scheduler = Scheduler(on_run=self.metrics.job_finished)
        self.resync: SpeculateResync | None = None
        self.thaw: FreezeThaw | None = None  # worker roles (app/controllers/freeze.py)
        self._schedule_jobs(orchestrator)
        self.started = False
        # stops, newest first: each service's is pushed just before it starts
        self._stack = AsyncExitStack()
        self._stack.push_async_callback(self.db.dispose)
        self._stack.push_async_callback(lambda: self.event_hub.aclose())  # read ends first

    def _stall_gauges(self) -> list[tuple[str, bool, float]]:
        """(queue, stalled, seconds unmoved) per queue the stall detector checked."""
        return [] if self.stalls is None else self.stalls.gauges()

    def _schedule_jobs(self, orchestrator: bool) -> None:
        """Every periodic job of this process, on its one scheduler (``app/scheduler.py``
        has the table)."""
        settings, every = self.settings, self.scheduler.every
        if settings.metrics_refresh_ms:  # 0: every scrape reads the state itself
            every("metrics-refresh", settings.metrics_refresh_ms,
                  lambda: self.metrics.refresh(force=True))
        if self.stalls is not None:  # every role: the pages and /metrics of each show it
            every("stall-check", settings.stall_check_ms, self.stalls.run)
        github = GitHubResync(self)
        if settings.github_resync_ms and github.queues():  # every role: claims dedupe
            every("github-resync", settings.github_resync_ms, github.run)
        if not orchestrator:
            return
        if settings.speculate_resync_ms:
            self.resync = SpeculateResync(self.deps, list(self.queues),
                                          interval_ms=settings.speculate_resync_ms)
            every("speculate-resync", settings.speculate_resync_ms, self.resync.run)
        every("outage-notify", max(1000, settings.outage_recheck_ms), self.outages.sweep)
        every("queue-gc", settings.queue_gc_interval_ms,
              lambda: self.broker.collect_garbage(settings.queue_retention_ms))
        for job in self.extensions.periodic_jobs():
            every(job.name, job.interval_ms, job.run)
        self.thaw = FreezeThaw(self.deps, list(self.queues))
        every("freeze-thaw", settings.freeze_recheck_ms, self.thaw.run)

    async def start(self) -> None:
        """Migrate (or check the migrations), then start the services in order: queue
        broker, command runners (worker roles), consumers, scheduler.

        Each service's stop is registered on an ``AsyncExitStack`` before it starts, so
        a start-up that fails part-way stops every service it had started (and the one
        that failed, whose stop must cope with a partial start), newest first, and
        re-raises; ``stop()`` unwinds the same stack."""
        try:
            await self._check_migrations()
            services: list[tuple[str, Callable[[], Awaitable[Any]],
                                 Callable[[], Awaitable[Any]]]] = [
                ("queue broker", self.broker.start, self.broker.close)]
            if self.settings.role in ("all", "worker"):
                # command runners: mark builds a previous run of this server lost, heartbeat
                services.append(("command runners", self.extensions.start,
                                 self.extensions.stop))  # running builds end `errored`
            services += [("consumers", self.consumers.start, self.consumers.stop),
                         ("scheduler", self.scheduler.start, self.scheduler.stop)]
            for name, start, stop in services:
                self._stack.push_async_callback(_logged_stop, name, stop)
                await start()
        except BaseException:
            await self.stop()
            raise
        self.started = True
        log.info("submitqueue started", extra={"role": self.settings.role,
                                               "auth": self.settings.effective_auth})
        if self.settings.open_exposed:
            log.warning(OPEN_WARNING, extra={"host": self.settings.host})

    async def _check_migrations(self) -> None:
        if self.settings.auto_migrate:
            await migrate.upgrade(self.settings.database_url)
            if self.settings.queue_database_url:
                await migrate.upgrade(self.settings.queue_database_url)
            return
        state = migration_state(await migrate.current_revision(self.db.engine),
                                self.settings.database_url)
        if not state["ok"]:
            raise RuntimeError(
                f"the database is at migration {state['current']}; this version needs "
                f"{state['head']}: run `submitqueue db upgrade` (SQ_AUTO_MIGRATE is off)")

    async def stop(self) -> None:
        """Stop what ``start()`` started, newest first, then dispose of the database
        engine; safe to call twice and after a failed or missing start."""
        self.started = False
        stack, self._stack = self._stack, AsyncExitStack()
        self._stack.push_async_callback(self.db.dispose)
        await stack.aclose()

    async def _dependencies(self) -> dict[str, Any]:
        return await _circuit_details(self)

    async def readiness(self) -> dict[str, dict[str, Any]]:
        checks: dict[str, dict[str, Any]] = {}
        try:
            await self.db.ping()
            current = await migrate.current_revision(self.db.read_engine)
            checks["database"] = {"ok": True}
            checks["migrations"] = migration_state(current, self.settings.database_url)
        except Exception as exc:
            checks["database"] = {"ok": False, "error": type(exc).__name__}
        try:  # reachable is not enough: a read-only or locked database takes no writes
            await self.db.probe_write()
            checks["database_writes"] = {"ok": True}
        except Exception as exc:
            checks["database_writes"] = {"ok": False, "error": type(exc).__name__}
        # command builds: each queue's sandbox (not ok while builds cannot be sandboxed;
        # a warning for queues that run them unsandboxed)
        checks["builds"] = self.extensions.build_readiness()
        checks["dependencies"] = await self._dependencies()
        checks["auth"] = self.auth_readiness()
        running = self.consumers.running
        checks["consumers"] = {
            "ok": self.started and running == len(self.consumers.consumers),
            "running": running,
        }
        return checks


    def auth_readiness(self) -> dict[str, Any]:
        """How calls are authorized; a warning (never unready) for ``open`` on an address
        others can reach."""
        out: dict[str, Any] = {"ok": True, "mode": self.settings.effective_auth,
                               "reads": self.settings.auth_reads,
                               "admin_token": bool(self.settings.admin_token)}
        if self.settings.open_exposed:
            out["warning"] = OPEN_WARNING
        return out


async def _logged_stop(name: str, stop: Callable[[], Awaitable[Any]]) -> None:
    """One service's stop; its failure is logged and does not keep the others running."""
    try:
        await stop()
    except Exception:
        log.exception("stopping a service failed; stopping the rest", extra={"service": name})


async def _circuit_details(runtime: Runtime) -> dict[str, Any]:
    """Each circuit's state and how long it has been open (open circuits do not make the
    process unready: it keeps serving and holds the work that needs them)."""
    try:
        circuits = await runtime.outages.circuits(fresh=True)
    except Exception as exc:
        return {"ok": False, "error": type(exc).__name__}
    now = runtime.broker.clock()
    return {"ok": True, "open": sum(1 for c in circuits.values() if c.is_open), "circuits": {
        dep: {"state": c.status.value, "open_for_s": round(c.open_for_ms(now) / 1000, 1),
              "failures": c.failures, "since_ms": c.opened_at_ms or None}
        for dep, c in sorted(circuits.items())}}


def outage_policy(settings: Settings) -> OutagePolicy:
    return OutagePolicy(
        window_ms=int(settings.outage_window_s * 1000), threshold=settings.outage_threshold,
        initial_ms=settings.outage_probe_initial_ms, max_ms=settings.outage_probe_max_ms,
        notify_after_ms=int(settings.outage_notify_after_s * 1000))


def migration_state(current: str | None, url: str) -> dict[str, Any]:
    """Ready at head, and also *ahead*: a newer release migrated the database during a
    rolling deploy (a revision this version does not know; migrations keep the previous
    release working). Behind (or never migrated) is not ready."""
    script = ScriptDirectory.from_config(migrate.alembic_config(url))
    head = script.get_current_head()
    ahead = current is not None and current not in {r.revision for r in script.walk_revisions()}
    state: dict[str, Any] = {"ok": current == head or ahead, "current": current, "head": head}
    if ahead:
        state["ahead"] = True
    return state


def create_app(
    settings: Settings | None = None,
    *,
    extension_overrides: dict[str, QueueExtensions] | None = None,
) -> FastAPI:
    settings = settings or get_settings()
    metrics = Metrics(version=__version__, role=settings.role,
                      refresh_interval_ms=settings.metrics_refresh_ms)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(settings, extension_overrides=extension_overrides, metrics=metrics)
        app.state.runtime = runtime
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()  # the event hub too: its read ends before the database

    app = FastAPI(
        title="SubmitQueue",
        version=__version__,
        description="A speculative merge queue.",
        lifespan=lifespan,
        docs_url=None,  # app/api/docs.py serves /docs and /redoc without a CDN
        redoc_url=None,
    )
    app.include_router(health.router)
    install(app)
    install_docs(app)
    # Outermost last: metrics see every answer, security headers reach error pages too.
    app.add_middleware(SecurityHeaders)
    if settings.cors_origin_list:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origin_list,
                           allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Authorization"])
    app.add_middleware(HttpMetrics, observe=metrics.observe_http)
    app.add_middleware(AccessLog)  # outermost: its request id is on every line below
    return app


def app_factory() -> FastAPI:
    """Entry point for ``uvicorn --factory app.main:app_factory``."""
    settings = get_settings()
    configure_logging(settings.log_level, settings.queue_log_level)
    return create_app(settings)
