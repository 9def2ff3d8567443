"""Composition root: ``create_app(settings)`` builds the FastAPI app; its lifespan
migrates the database and starts the background services (queue consumers)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from app import __version__
from app.api import health
from app.controllers.pipeline import Pipeline, build_pipeline
from app.db import migrate
from app.db.engine import Database
from app.logs import configure_logging
from app.queue import Broker, ConsumerService, backend_for_url
from app.settings import Settings, get_settings

log = logging.getLogger("submitqueue")


class Runtime:
    """Everything the lifespan starts, reachable from request handlers via app.state."""

    def __init__(self, settings: Settings, pipeline: Pipeline) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.db = Database(settings.database_url)
        self.broker = Broker(
            backend_for_url(settings.effective_queue_database_url),
            pipeline.topology,
            max_payload_bytes=settings.queue_max_payload_bytes,
        )
        runs_workers = settings.role in ("all", "worker")
        self.consumers = ConsumerService(
            self.broker,
            pipeline.consumers if runs_workers else [],
            poll_interval_ms=settings.queue_poll_interval_ms,
            shutdown_grace_ms=settings.queue_shutdown_grace_ms,
            retention_ms=settings.queue_retention_ms if runs_workers else None,
            gc_interval_ms=settings.queue_gc_interval_ms,
        )
        self.started = False

    async def start(self) -> None:
        if self.settings.auto_migrate:
            await migrate.upgrade(self.settings.database_url)
            if self.settings.queue_database_url:
                await migrate.upgrade(self.settings.queue_database_url)
        await self.broker.start()
        await self.consumers.start()
        self.started = True
        log.info("submitqueue started", extra={"role": self.settings.role})

    async def stop(self) -> None:
        self.started = False
        await self.consumers.stop()
        await self.broker.close()
        await self.db.dispose()

    async def readiness(self) -> dict[str, dict[str, Any]]:
        checks: dict[str, dict[str, Any]] = {}
        try:
            await self.db.ping()
            current = await migrate.current_revision(self.db.engine)
            head = migrate.head_revision(self.settings.database_url)
            checks["database"] = {"ok": True}
            checks["migrations"] = {"ok": current == head, "current": current, "head": head}
        except Exception as exc:
            checks["database"] = {"ok": False, "error": type(exc).__name__}
        checks["consumers"] = {
            "ok": self.started,
            "running": len(self.consumers.consumers),
        }
        return checks


def create_app(settings: Settings | None = None, pipeline: Pipeline | None = None) -> FastAPI:
    settings = settings or get_settings()
    pipeline = pipeline or build_pipeline()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(settings, pipeline)
        app.state.runtime = runtime
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(
        title="SubmitQueue",
        version=__version__,
        description="A speculative merge queue.",
        lifespan=lifespan,
    )
    app.include_router(health.router)
    return app


def app_factory() -> FastAPI:
    """Entry point for ``uvicorn --factory app.main:app_factory``."""
    settings = get_settings()
    configure_logging(settings.log_level, settings.queue_log_level)
    return create_app(settings)
