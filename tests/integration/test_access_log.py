"""``AccessLog``: one structured line per request with a request id that every line of
the request carries, the caller's id kept only when it is a plain token."""

from __future__ import annotations

import logging
from typing import Any

import httpx
from fastapi import FastAPI

from app.api.access_log import AccessLog
from tests.support.logs import captured_logs

inner = logging.getLogger("submitqueue.test")


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/api/v1/queues/{queue}/things")
    async def things(queue: str) -> dict[str, str]:
        inner.info("inside the handler", extra={"queue": queue})
        return {"queue": queue}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.add_middleware(AccessLog)
    return app


async def get(path: str, headers: dict[str, str] | None = None,
              level: str = "INFO") -> tuple[httpx.Response, list[dict[str, Any]]]:
    transport = httpx.ASGITransport(app=make_app())
    with captured_logs(level) as out:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get(path, headers=headers or {})
    return response, [r for r in out.records() if r.get("logger", "").startswith(
        "submitqueue") or r["event"] in ("http request", "inside the handler")]


async def test_a_request_is_one_line_with_fields_and_its_id_on_every_line() -> None:
    r, logs = await get("/api/v1/queues/demo/things?token=hunter2&x=1",
                        headers={"X-Request-ID": "ci-run.42:a"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "ci-run.42:a"
    inside, access = logs
    assert inside["event"] == "inside the handler" and inside["request_id"] == "ci-run.42:a"
    assert access["event"] == "http request" and access["level"] == "info"
    assert access["method"] == "GET" and access["status"] == 200
    assert access["route"] == "/api/v1/queues/{queue}/things"
    # the renderer masks a secret-named query value, as everywhere in the logs
    assert access["target"] == "/api/v1/queues/demo/things?token=[redacted]&x=1"
    assert access["request_id"] == "ci-run.42:a"
    assert isinstance(access["duration_ms"], float) and access["duration_ms"] >= 0


async def test_an_unsafe_request_id_is_replaced_and_probes_log_at_debug() -> None:
    r, logs = await get("/healthz", headers={"X-Request-ID": "a b\"<script>"})
    rid = r.headers["x-request-id"]
    assert rid != "a b\"<script>" and len(rid) == 32
    assert logs == []  # a probe at INFO writes nothing
    r, logs = await get("/healthz", level="DEBUG")
    (access,) = [x for x in logs if x["event"] == "http request"]
    assert access["level"] == "debug" and access["request_id"] == r.headers["x-request-id"]
    r2, logs2 = await get("/nope")
    (miss,) = logs2
    assert r2.status_code == 404 and miss["route"] == "unmatched" and miss["status"] == 404
