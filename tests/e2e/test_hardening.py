"""HTTP hardening of the real app (body limit, JSON only, no stack traces, CORS off by
default, security headers), and a graceful SIGTERM of `submitqueue serve` with a slow
handler in flight."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from app.db import migrate
from app.main import Runtime, create_app, migration_state
from app.settings import Settings
from tests.e2e.harness import ROOT, free_port, serve
from tests.support.logs import captured_logs
from tests.support.procs import wait_healthy

LEAKY = "cannot reach postgresql://sq:pg-pass-5@db.internal/sq (File \"/srv/app/x.py\")"


def build_app(**overrides: Any) -> FastAPI:
    settings = Settings(_env_file=None, **overrides)  # type: ignore[call-arg]
    app = create_app(settings)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError(LEAKY)

    @app.get("/page", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse("<p>hi</p>")

    @app.get("/strict-page", response_class=HTMLResponse)
    async def strict_page() -> HTMLResponse:
        return HTMLResponse("<p>hi</p>", headers={"Content-Security-Policy": "default-src 'none'",
                                                 "X-Frame-Options": "SAMEORIGIN"})

    return app


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    # No lifespan: every answer below is given before a handler needs the runtime.
    transport = httpx.ASGITransport(app=build_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://sq.test") as c:
        yield c


def error_of(r: httpx.Response) -> dict[str, str]:
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    return dict(body["error"])


def assert_security_headers(r: httpx.Response) -> None:
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["x-frame-options"] == "DENY"


async def test_oversized_and_non_json_bodies_get_json_errors(client: httpx.AsyncClient) -> None:
    url = "/api/v1/queues/demo/requests"
    big = b'{"change_uris": ["' + b"x" * (64 * 1024) + b'"]}'
    r = await client.post(url, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"
    assert "65536 bytes" in error_of(r)["message"]
    assert_security_headers(r)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"x" * 8192

    r = await client.post(url, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"

    r = await client.post(url, content=b"change_uris=x", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and error_of(r)["code"] == "unsupported_media_type"
    assert "text/plain" in error_of(r)["message"]


async def test_a_crash_answers_json_without_internals_and_logs_no_secret(
    client: httpx.AsyncClient,
) -> None:
    with captured_logs() as logs:
        r = await client.get("/boom")
    assert r.status_code == 500
    assert error_of(r) == {"code": "internal_error",
                           "message": "internal error; it has been logged"}
    for leak in ("Traceback", "RuntimeError", "pg-pass-5", "/srv/app", "db.internal"):
        assert leak not in r.text
    assert_security_headers(r)
    logged = logs.text
    assert "RuntimeError" in logged and "Traceback" in logged  # the operator gets it all
    assert "pg-pass-5" not in logged  # but not the password


async def test_cors_is_off_by_default(client: httpx.AsyncClient) -> None:
    origin = {"Origin": "https://elsewhere.example"}
    r = await client.get("/healthz", headers=origin)
    assert r.status_code == 200
    assert not any(h.startswith("access-control-") for h in r.headers)
    r = await client.options("/api/v1/queues/demo/requests", headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert r.status_code == 405
    assert not any(h.startswith("access-control-") for h in r.headers)


async def test_cors_allows_exactly_the_configured_origins() -> None:
    app = build_app(cors_origins="https://ok.example, https://also.example")
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://sq.test") as c:
        pre = {"Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type"}
        r = await c.options("/api/v1/queues/demo/requests",
                            headers={"Origin": "https://ok.example", **pre})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://ok.example"
        r = await c.get("/healthz", headers={"Origin": "https://also.example"})
        assert r.headers["access-control-allow-origin"] == "https://also.example"
        r = await c.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers


async def test_security_headers_on_every_response_without_overriding_a_page(
    client: httpx.AsyncClient,
) -> None:
    for path, status in (("/healthz", 200), ("/no-such-page", 404), ("/openapi.json", 200)):
        r = await client.get(path)
        assert r.status_code == status
        assert_security_headers(r)
        assert "content-security-policy" not in r.headers  # not HTML
    r = await client.get("/page")
    assert_security_headers(r)
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    r = await client.get("/strict-page")
    assert r.headers.get_list("content-security-policy") == ["default-src 'none'"]
    assert r.headers.get_list("x-frame-options") == ["SAMEORIGIN"]
    assert r.headers["x-content-type-options"] == "nosniff"
    r = await client.get("/docs")  # the OpenAPI UI loads its bundle from this origin
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "https:" not in csp


SLOW_MERGE_SERVE = """
import asyncio, os, pathlib, sys
from app.extensions.merger import fake

async def slow_merge(self, spec):
    pathlib.Path(os.environ["SLOW_MERGE_MARKER"]).write_text(spec.id)
    await asyncio.sleep(60)
    raise AssertionError("the grace period should have ended this merge")

fake.FakeMerger.merge = slow_merge
sys.argv = ["submitqueue", "serve"]
from app.cli import main
main()
"""


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_finishes_within_the_grace_period_and_releases_the_slow_handler(
    tmp_path: Path,
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    marker = tmp_path / "merge-started"
    grace_ms = 1000
    env = {**os.environ, "SQ_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'sq.db'}",
           "SQ_PORT": str(port), "SQ_QUEUES_FILE": str(ROOT / "queues.yaml"),
           "SQ_QUEUE_SHUTDOWN_GRACE_MS": str(grace_ms), "SQ_ROLE": "all",
           "SLOW_MERGE_MARKER": str(marker)}
    log = tmp_path / "server.log"
    uri = f"git://demo.example.com/demo/refs%2Fheads%2Fslow/{'5a' * 20}?sq-files=slow/a.py"
    proc = _start(["-c", SLOW_MERGE_SERVE], env, log)
    try:
        wait_healthy(base, proc)
        r = httpx.post(f"{base}/api/v1/queues/demo/requests", json={"change_uris": [uri]})
        assert r.status_code == 202, r.text
        sqid = r.json()["sqid"]
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "the merge never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert proc.wait(timeout=grace_ms / 1000 + 10) == 0
        took = time.monotonic() - sent
        # It waited for the running merge (the grace period), then gave up on it.
        assert grace_ms / 1000 * 0.9 <= took < grace_ms / 1000 + 5, f"shutdown took {took:.1f}s"
        assert "Application shutdown complete" in log.read_text()
    finally:
        _stop(proc)

    # The released merge is redelivered to the next process, which lands it.
    proc = _start(["-m", "app.cli", "serve"], env, log)
    try:
        wait_healthy(base, proc)
        n = sqid.rsplit("/", 1)[1]
        deadline = time.monotonic() + 30
        status = ""
        while time.monotonic() < deadline:
            status = httpx.get(f"{base}/api/v1/queues/demo/requests/{n}").json()["status"]
            if status == "landed":
                break
            time.sleep(0.1)
        assert status == "landed"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        _stop(proc)


async def test_readyz_fails_when_a_consumer_loop_dies(tmp_path: Path) -> None:
    async with serve(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}", tmp_path) as server:
        r = await server.client.get("/readyz")
        assert r.status_code == 200
        consumers = server.runtime.consumers.consumers
        assert r.json()["checks"]["consumers"] == {"ok": True, "running": len(consumers)}
        loop_task = consumers[0]._loop_task
        assert loop_task is not None
        loop_task.cancel()  # as if its claim loop had crashed
        await asyncio.sleep(0.05)
        r = await server.client.get("/readyz")
        assert r.status_code == 503
        body = r.json()
        assert body["ready"] is False
        assert body["checks"]["consumers"] == {"ok": False, "running": len(consumers) - 1}
        assert body["checks"]["database"] == {"ok": True}


def test_migration_state_accepts_head_and_ahead_but_not_behind() -> None:
    url = "sqlite+aiosqlite:///unused.db"
    head = migrate.head_revision(url)
    assert head is not None
    assert migration_state(head, url) == {"ok": True, "current": head, "head": head}
    assert migration_state("9999_from_a_newer_release", url)["ok"] is True  # rolling deploy
    assert migration_state("0001", url)["ok"] is False
    assert migration_state(None, url)["ok"] is False


async def test_start_without_auto_migrate_refuses_a_database_behind(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    migrate.upgrade_sync(url, "0001")
    shutil.copyfile(ROOT / "queues.yaml", tmp_path / "queues.yaml")
    settings = Settings(_env_file=None, database_url=url,  # type: ignore[call-arg]
                        auto_migrate=False, queues_file=tmp_path / "queues.yaml")
    runtime = Runtime(settings)
    try:
        with pytest.raises(RuntimeError, match=r"at migration 0001; this version needs .*"
                                               r"run `submitqueue db upgrade`"):
            await runtime.start()
    finally:
        await runtime.stop()
