"""The webhook build runner against a real HTTP "CI" served in the test, and CI's signed
status callback through the real app: trigger body and signature, retryable and
permanent trigger errors, the verdict timeout, and every answer of the callback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.db.engine import Database
from app.db.repos.build_runs import SqlBuildStore
from app.domain.errors import ValidationError
from app.domain.queue_config import QueueConfig
from app.domain.states import BuildStatus
from app.extensions.base import BuildRequest
from app.extensions.builds.webhook import (
    SIGNATURE_HEADER,
    BuildTriggerRefused,
    WebhookBuildRunner,
    sign,
    signature_ok,
)
from app.extensions.factory import build_extensions
from app.queue import classify
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, free_port, serve

pytestmark = pytest.mark.timeout(60)

SECRET = "a-shared-secret-of-some-length"
REQ = BuildRequest(queue="ciq", batch_id="ciq/batch/1", path_id="p1", attempt=2,
                   base_changes=("git://h/r/refs%2Fheads%2Fa/" + "a" * 40,),
                   head_changes=("git://h/r/refs%2Fheads%2Fb/" + "b" * 40,))


@dataclass
class CI:
    """A CI service on a real port: records triggers, answers ``answer``, and (when
    ``server`` is set) reports each build's verdict to its callback URL."""

    answer: int = 202
    verdict: Callable[[dict[str, Any]], str] = lambda body: "succeeded"
    server: Server | None = None
    received: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    callbacks: list[int] = field(default_factory=list)
    url: str = ""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def hook(self, request: Request) -> JSONResponse:
        body = await request.body()
        self.received.append((body, dict(request.headers)))
        if self.server is not None and self.answer < 300:
            task = asyncio.create_task(self.report(json.loads(body)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return JSONResponse({"queued": True} if self.answer < 300 else {"error": "nope"},
                            status_code=self.answer)

    async def report(self, trigger: dict[str, Any]) -> None:
        assert self.server is not None
        path = urlsplit(trigger["callback_url"]).path
        verdict = self.verdict(trigger)
        for report in ({"status": "running"},
                       {"status": verdict, "log_url": f"https://ci.example/logs/{trigger['build_id']}",
                        "detail": f"CI says {verdict}"}):
            await asyncio.sleep(0.05)
            body = json.dumps(report).encode()
            r = await self.server.client.post(path, content=body, headers={
                "content-type": "application/json", SIGNATURE_HEADER: sign(SECRET.encode(), body)})
            self.callbacks.append(r.status_code)


@pytest.fixture
async def ci() -> AsyncIterator[CI]:
    service = CI()
    app = Starlette(routes=[Route("/hook", service.hook, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    service.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield service
    finally:
        for t in list(service.tasks):
            t.cancel()
        server.should_exit = True
        await task


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlBuildStore]:
    db = Database(database_url)
    try:
        yield SqlBuildStore(db)
    finally:
        await db.dispose()


def runner(store: SqlBuildStore, url: str, **kw: Any) -> WebhookBuildRunner:
    return WebhookBuildRunner(queue="ciq", url=url, secret=SECRET,
                              public_url="https://sq.example/", store=store, **kw)


# ---------------------------------------------------------------- trigger


async def test_trigger_posts_the_facts_signed_with_the_queue_secret(
    ci: CI, store: SqlBuildStore
) -> None:
    build_id = await runner(store, ci.url).trigger(REQ)
    [(body, headers)] = ci.received
    assert json.loads(body) == {
        "build_id": build_id, "queue": "ciq", "batch_id": "ciq/batch/1", "path_id": "p1",
        "attempt": 2, "base_changes": list(REQ.base_changes),
        "head_changes": list(REQ.head_changes),
        "callback_url": f"https://sq.example/api/v1/builds/{build_id}/status"}
    signature = headers[SIGNATURE_HEADER.lower()]
    assert signature == "sha256=" + __import__("hmac").new(
        SECRET.encode(), body, "sha256").hexdigest()
    assert signature_ok(SECRET.encode(), body, signature)
    assert not signature_ok(SECRET.encode(), body + b" ", signature)
    assert not signature_ok(b"another secret", body, signature)
    run = await store.get(build_id)
    assert run is not None and run.status is BuildStatus.ACCEPTED and run.runner == "webhook"


async def test_a_5xx_is_retryable_and_a_4xx_is_permanent_without_leaking_credentials(
    ci: CI, store: SqlBuildStore
) -> None:
    ci.answer = 503
    with pytest.raises(httpx.HTTPStatusError) as retry:
        await runner(store, ci.url).trigger(REQ)
    assert classify(retry.value) is True

    ci.answer = 403
    url = ci.url.replace("http://", "http://robot:hunter2@") + "?token=t0psecret"
    with pytest.raises(BuildTriggerRefused) as refused:
        await runner(store, url).trigger(REQ)
    assert classify(refused.value) is False
    message = str(refused.value)
    assert "HTTP 403" in message and ci.url in message and "build_runner.url" in message
    assert "hunter2" not in message and "t0psecret" not in message
    # both runs are on record as errored, with the CI's answer
    runs = [json.loads(b)["build_id"] for b, _ in ci.received]
    for build_id in runs:
        run = await store.get(build_id)
        assert run is not None and run.status is BuildStatus.ERRORED


async def test_an_unreachable_ci_is_retryable(store: SqlBuildStore) -> None:
    with pytest.raises(httpx.ConnectError) as info:
        await runner(store, f"http://127.0.0.1:{free_port()}/hook").trigger(REQ)
    assert classify(info.value) is True


async def test_no_verdict_in_time_is_errored_and_cancel_is_recorded(
    ci: CI, store: SqlBuildStore
) -> None:
    quick = runner(store, ci.url, timeout_s=0.3)
    build_id = await quick.trigger(REQ)
    assert (await quick.status(build_id)).status is BuildStatus.ACCEPTED
    await asyncio.sleep(0.4)
    report = await quick.status(build_id)
    assert (report.status, report.detail) == (
        BuildStatus.ERRORED, "no verdict from CI within 0.3s of the trigger")

    other = await quick.trigger(REQ)
    await quick.cancel(other)
    assert (await quick.status(other)).status is BuildStatus.CANCELLED


def test_a_missing_secret_is_a_clear_start_up_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SQ_WEBHOOK_SECRET_NOPE", raising=False)
    cfg = QueueConfig.model_validate({"name": "ciq", "build_runner": {
        "type": "webhook", "url": "https://ci.example/hook",
        "secret_env": "SQ_WEBHOOK_SECRET_NOPE"}})
    with pytest.raises(ValidationError) as info:
        build_extensions(cfg)
    assert "SQ_WEBHOOK_SECRET_NOPE" in str(info.value) and "'ciq'" in str(info.value)
    monkeypatch.setenv("SQ_WEBHOOK_SECRET_NOPE", SECRET)
    built = build_extensions(cfg, public_url="https://sq.example")
    assert isinstance(built.runner, WebhookBuildRunner)
    assert SECRET not in repr(built.runner) and SECRET not in repr(cfg)


# ---------------------------------------------------------------- through the app


def webhook_queues(ci: CI) -> str:
    return f"""\
queues:
  - name: ciq
    change_provider: {{type: fake}}
    merger: {{type: fake}}
    conflict_analyzer: {{type: pathoverlap, by: directory}}
    build_runner: {{type: webhook, url: "{ci.url}", secret_env: SQ_WEBHOOK_SECRET_CIQ,
                   timeout_s: 60}}
"""


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_ci_reports_through_the_signed_callback_and_requests_end_by_its_verdict(
    database_url: str, tmp_path: Path, ci: CI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SQ_WEBHOOK_SECRET_CIQ", SECRET)
    (tmp_path / "queues.yaml").write_text(webhook_queues(ci))
    ci.verdict = lambda body: ("failed" if any("nogood" in u for u in body["head_changes"])
                               else "succeeded")
    async with serve(database_url, tmp_path, public_url="http://sq.example:9999") as server:
        ci.server = server
        good = await server.land(change("good", files="a/x.py"), queue="ciq")
        bad = await server.land(change("nogood", files="b/y.py"), queue="ciq")
        assert await server.wait_terminal(good) == "landed"
        assert await server.wait_terminal(bad) == "error"
        for body, _ in ci.received:
            trigger = json.loads(body)
            assert trigger["callback_url"] == (
                f"http://sq.example:9999/api/v1/builds/{trigger['build_id']}/status")
        assert set(ci.callbacks) == {204}
        urls = [e["metadata"]["build_url"] for e in await server.history(bad)
                if e.get("event") == "building" and e["metadata"]["build_status"] == "failed"]
        assert urls and urls[0].startswith("https://ci.example/logs/wh-")
        build_id = urls[0].rsplit("/", 1)[1]
        log = await server.client.get(f"/api/v1/builds/{build_id}/log")
        assert log.status_code == 200
        assert "[sq] CI reported failed: CI says failed (log: https://ci.example/logs/" in log.text


async def test_the_callback_refuses_what_it_must(
    database_url: str, tmp_path: Path, ci: CI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SQ_WEBHOOK_SECRET_CIQ", SECRET)
    (tmp_path / "queues.yaml").write_text(webhook_queues(ci))
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(change("slowci", files="a/x.py"), queue="ciq")
        await server.wait_status(sqid, {"speculating"})
        while not ci.received:
            await asyncio.sleep(0.05)
        build_id = json.loads(ci.received[0][0])["build_id"]
        path = f"/api/v1/builds/{build_id}/status"

        async def post(report: Any, *, signature: str | None = "sign",
                       where: str = path) -> httpx.Response:
            body = report if isinstance(report, bytes) else json.dumps(report).encode()
            headers = {"content-type": "application/json"}
            if signature == "sign":
                headers[SIGNATURE_HEADER] = sign(SECRET.encode(), body)
            elif signature is not None:
                headers[SIGNATURE_HEADER] = signature
            return await server.client.post(where, content=body, headers=headers)

        r = await post({"status": "failed"}, signature=None)
        assert r.status_code == 401 and r.json()["error"]["code"] == "bad_signature"
        r = await post({"status": "failed"}, signature=sign(b"wrong secret", b"{}"))
        assert r.status_code == 401
        r = await post({"status": "succeeded"}, where="/api/v1/builds/wh-nope/status")
        assert r.status_code == 404 and "wh-nope" in r.json()["error"]["message"]
        r = await post({"status": "done"})
        assert r.status_code == 422 and "status" in r.json()["error"]["message"]
        r = await post(b"{not json")
        assert r.status_code == 422 and "not valid JSON" in r.json()["error"]["message"]
        r = await post({"status": "failed", "log_url": "javascript:alert(1)"})
        assert r.status_code == 422 and "log_url" in r.json()["error"]["message"]
        run = await server.runtime.extensions.build_store.get(build_id)
        assert run is not None and run.status is BuildStatus.ACCEPTED  # nothing was written

        assert (await post({"status": "running"})).status_code == 204
        assert (await post({"status": "failed", "detail": "red"})).status_code == 204
        assert (await post({"status": "failed", "detail": "red"})).status_code == 204  # again
        r = await post({"status": "succeeded"})
        assert r.status_code == 409 and "already ended failed" in r.json()["error"]["message"]
        assert await server.wait_terminal(sqid) == "error"

        r = await server.client.get("/api/v1/builds/nope/log")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
