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

router = APIRouter(tags=["health"])

READY_TIMEOUT_S = 5.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
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
