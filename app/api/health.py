"""Operations endpoints: ``/healthz`` (the process is up), ``/readyz`` (it can do its
work) and ``/metrics`` (Prometheus exposition).

| Route | Answer |
|---|---|
| ``GET /healthz`` | always ``200 {"status": "ok"}`` while the process serves HTTP |
| ``GET /readyz`` | ``200`` when every check passes (database reachable, migrations at head, the database takes a write — a rolled-back write transaction within 2 s —, every consumer loop alive); ``503`` with the checks otherwise — also while starting, stopping, or when the checks take over ``READY_TIMEOUT_S`` |
| ``GET /metrics`` | Prometheus text (OpenMetrics if the ``Accept`` header asks for it); refreshes the database-derived gauges first, at most once per ``SQ_METRICS_REFRESH_MS`` |

The app must set ``app.state.runtime`` with ``readiness()`` (``{check: {"ok": bool,
...}}``) and ``metrics`` (``refresh()``, ``render(accept)``; see ``app/metrics.py``).
"""  # noqa: E501 - route tables read best unwrapped

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from app.api.examples import media, ok

router = APIRouter(tags=["health"])

READY_TIMEOUT_S = 5.0


class CheckOut(BaseModel):
    """One readiness check; each adds its own details (``current``, ``running``, ...)."""

    model_config = ConfigDict(extra="allow")
    ok: bool
    error: str | None = Field(default=None, description="Why it failed.")
    warning: str | None = Field(default=None, description="Worth a look; never unready.")


class ReadyOut(BaseModel):
    ready: bool
    checks: dict[str, CheckOut]


@router.get("/healthz", summary="Liveness: the process serves HTTP",
            responses=ok(200, "HEALTHZ"))
async def healthz() -> dict[str, str]:
    """Always ``200 {"status": "ok"}`` while the process answers HTTP; it checks nothing
    else (use ``/readyz`` to know whether the server can do its work). No token needed."""
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: every check the server needs to do its work",
            responses={**ok(200, "READYZ", description="every check passed"),
                       503: {"description": "a check failed, timed out, or the server is "
                                            "starting or stopping", "model": ReadyOut,
                             "content": {"application/json": media("READYZ_NOT_READY")}}},
            response_model=ReadyOut)
async def readyz(request: Request) -> JSONResponse:
    """``200`` when every check passes: ``database`` answers, ``migrations`` at head,
    ``database_writes`` (a rolled-back write within 2 s), ``builds`` (each command
    runner can sandbox its builds as configured) and ``consumers`` (every consumer loop
    alive). ``dependencies`` (each circuit breaker's state) and ``auth`` (the mode, and a
    ``warning`` for ``open`` on a reachable address) are reported but never make it
    unready. ``503`` with the same body otherwise, also while starting or stopping or
    when the checks take over 5 s; a failed check says why in ``error``. No token
    needed: point a load balancer's health check here."""
    runtime: Any = getattr(request.app.state, "runtime", None)
    if runtime is None:
        checks: dict[str, dict[str, Any]] = {"runtime": {"ok": False, "error": "not started"}}
    else:
        try:
            checks = await asyncio.wait_for(runtime.readiness(), READY_TIMEOUT_S)
        except TimeoutError:
            checks = {"readiness": {"ok": False,
                                    "error": f"checks took over {READY_TIMEOUT_S:g} s"}}
    ready = all(c["ok"] for c in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    registry: Any = request.app.state.runtime.metrics
    await registry.refresh()
    body, content_type = registry.render(request.headers.get("accept"))
    return Response(content=body, headers={"Content-Type": content_type})
