"""The webhook build runner against a real HTTP "CI" served in the test, and CI's signed
status callback through the real app: trigger body, signature and idempotency key,
retryable and permanent trigger errors, a trigger sent again after a lost reply (one CI
job), the verdict timeout, and every answer of the callback. Forged and replayed
callbacks: tests/security/test_webhook_signature.py."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from app.db.repos import speculation as spec_repo
from app.db.repos.build_runs import SqlBuildStore
from app.domain.errors import ValidationError
from app.domain.queue_config import QueueConfig
from app.domain.states import BuildStatus
from app.extensions.base import BuildRequest
from app.extensions.builds.signature import SIGNATURE_HEADER, BadSignature, verify
from app.extensions.builds.webhook import (
    IDEMPOTENCY_HEADER,
    BuildTriggerRefused,
    WebhookBuildRunner,
)
from app.extensions.factory import build_extensions
from app.queue import classify
from app.speculation.scoring import build_scorer
from tests.ci_standin import CI, SECRET, running_ci, signed, webhook_queues
from tests.conftest import BACKENDS
from tests.e2e.harness import change, free_port, serve
from tests.support.polls import wait_for

pytestmark = pytest.mark.timeout(60)

REQ = BuildRequest(queue="ciq", batch_id="ciq/batch/1", path_id="p1", attempt=2,
                   base_changes=("git://h/r/refs%2Fheads%2Fa/" + "a" * 40,),
                   head_changes=("git://h/r/refs%2Fheads%2Fb/" + "b" * 40,),
                   batch_created_at_ms=1_700_000_000_000)


@pytest.fixture
async def ci() -> AsyncIterator[CI]:
    async with running_ci() as service:
        yield service


def runner(store: SqlBuildStore, url: str, **kw: Any) -> WebhookBuildRunner:
    return WebhookBuildRunner(queue="ciq", url=url, secret=SECRET,
                              public_url="https://sq.example/", store=store, **kw)


# ---------------------------------------------------------------- trigger


async def test_trigger_posts_the_facts_signed_for_the_build_with_its_idempotency_key(
    ci: CI, store: SqlBuildStore
) -> None:
    before = int(time.time())
    build_id = await runner(store, ci.url).trigger(REQ)
    assert build_id == REQ.build_id("wh")
    [(body, headers)] = ci.received
    assert ci.refused == []  # the CI stand-in verified the signature for this build
    assert json.loads(body) == {
        "build_id": build_id, "queue": "ciq", "batch_id": "ciq/batch/1", "path_id": "p1",
        "attempt": 2, "base_changes": list(REQ.base_changes),
        "head_changes": list(REQ.head_changes),
        "callback_url": f"https://sq.example/api/v1/builds/{build_id}/status"}
    assert headers[IDEMPOTENCY_HEADER.lower()] == REQ.idempotency_key == (
        "ciq:p1:2:1700000000000")
    signature = headers[SIGNATURE_HEADER.lower()]
    t = int(signature.split(",")[0].removeprefix("t="))
    assert before <= t <= time.time()
    mac = __import__("hmac").new(SECRET.encode(), f"{t}.{build_id}.".encode() + body,
                                 "sha256").hexdigest()
    assert signature == f"t={t},v1={mac}"
    assert verify(SECRET.encode(), build_id, body, signature, now_s=time.time()) == t
    for other_build, other_body, key in ((build_id, body + b" ", SECRET),
                                         ("wh-another", body, SECRET),
                                         (build_id, body, "another secret")):
        with pytest.raises(BadSignature):
            verify(key.encode(), other_build, other_body, signature, now_s=time.time())
    run = await store.get(build_id)
    assert run is not None and run.status is BuildStatus.ACCEPTED and run.runner == "webhook"


def test_build_ids_are_one_per_queue_path_attempt_and_database_lifetime() -> None:
    pattern = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
    variants = [REQ, replace(REQ, attempt=3), replace(REQ, path_id="p2"),
                replace(REQ, queue="ciq2"), replace(REQ, batch_created_at_ms=1),
                replace(REQ, queue="ciq:p1", path_id="2")]
    ids = [r.build_id("wh") for r in variants]
    assert len(set(ids)) == len(ids)
    assert all(pattern.match(i) and i.startswith("wh-") for i in ids)
    # the changes do not name the build: a redelivered trigger names the same one
    assert replace(REQ, head_changes=()).build_id("wh") == REQ.build_id("wh")


async def test_a_5xx_is_retried_as_the_same_build_a_4xx_is_permanent_and_hides_credentials(
    ci: CI, store: SqlBuildStore
) -> None:
    ci.answer = 503
    with pytest.raises(httpx.HTTPStatusError) as retry:
        await runner(store, ci.url).trigger(REQ)
    assert classify(retry.value) is True
    run = await store.get(REQ.build_id("wh"))
    assert run is not None and run.status is BuildStatus.ACCEPTED  # kept for the retry

    ci.answer = 403
    url = ci.url.replace("http://", "http://robot:hunter2@") + "?token=t0psecret"
    with pytest.raises(BuildTriggerRefused) as refused:
        await runner(store, url).trigger(REQ)
    assert classify(refused.value) is False
    message = str(refused.value)
    assert "HTTP 403" in message and ci.url in message and "build_runner.url" in message
    assert "hunter2" not in message and "t0psecret" not in message
    # the retry was the same build, same key; the refusal ended it, with the CI's answer
    assert {json.loads(b)["build_id"] for b, _ in ci.received} == {REQ.build_id("wh")}
    assert {h[IDEMPOTENCY_HEADER.lower()] for _, h in ci.received} == {REQ.idempotency_key}
    run = await store.get(REQ.build_id("wh"))
    assert run is not None and run.status is BuildStatus.ERRORED
    assert "HTTP 403" in run.detail
    assert await runner(store, ci.url).trigger(REQ) == REQ.build_id("wh")  # ended: no resend
    assert len(ci.received) == 2


async def test_an_unreachable_ci_is_retryable_and_the_retry_sends_the_same_build(
    ci: CI, store: SqlBuildStore
) -> None:
    with pytest.raises(httpx.ConnectError) as info:
        await runner(store, f"http://127.0.0.1:{free_port()}/hook").trigger(REQ)
    assert classify(info.value) is True
    # recorded before the call; the retry (here: once CI is reachable) reuses it
    assert await runner(store, ci.url).trigger(REQ) == REQ.build_id("wh")
    [(body, headers)] = ci.received
    assert json.loads(body)["build_id"] == REQ.build_id("wh")
    assert headers[IDEMPOTENCY_HEADER.lower()] == REQ.idempotency_key


async def test_a_lost_reply_is_resent_with_the_same_key_until_ci_reports_then_never(
    ci: CI, store: SqlBuildStore
) -> None:
    ci.reply_delay_s = 1.0
    slow = runner(store, ci.url, request_timeout_s=0.2)
    with pytest.raises(httpx.TimeoutException) as info:
        await slow.trigger(REQ)
    assert classify(info.value) is True
    slow.request_timeout_s = 10.0
    assert await slow.trigger(REQ) == REQ.build_id("wh")  # the CI knows the key: 200
    assert len(ci.received) == 2 and len(ci.jobs) == 1
    assert [json.loads(b)["build_id"] for b, _ in ci.received] == [REQ.build_id("wh")] * 2
    body = json.dumps({"status": "running"}).encode()
    await slow.accept_callback(REQ.build_id("wh"), body, signed(REQ.build_id("wh"), body)[
        SIGNATURE_HEADER])
    assert await slow.trigger(REQ) == REQ.build_id("wh")  # CI reported: nothing is sent
    assert len(ci.received) == 2
    log = await store.get_log(REQ.build_id("wh")) or ""
    assert "could not reach CI" in log and "sending the trigger again" in log


async def test_no_verdict_in_time_is_errored_and_cancel_is_recorded(
    ci: CI, store: SqlBuildStore
) -> None:
    quick = runner(store, ci.url, timeout_s=0.3)
    now = [time.time_ns() // 1_000_000]  # the CI checks the trigger's signature time
    quick.clock = lambda: now[0]
    build_id = await quick.trigger(REQ)
    assert (await quick.status(build_id)).status is BuildStatus.ACCEPTED
    now[0] += 300
    assert (await quick.status(build_id)).status is BuildStatus.ACCEPTED
    now[0] += 1
    report = await quick.status(build_id)
    assert (report.status, report.detail) == (
        BuildStatus.ERRORED, "no verdict from CI within 0.3s of the trigger")

    other = await quick.trigger(replace(REQ, attempt=3))  # the path's next attempt
    assert other != build_id
    await quick.cancel(other)
    assert (await quick.status(other)).status is BuildStatus.CANCELLED


def test_a_missing_secret_is_a_clear_start_up_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SQ_WEBHOOK_SECRET_NOPE", raising=False)
    cfg = QueueConfig.model_validate({"name": "ciq", "build_runner": {
        "type": "webhook", "url": "https://ci.example/hook",
        "secret_env": "SQ_WEBHOOK_SECRET_NOPE"}})
    with pytest.raises(ValidationError) as info:
        build_extensions(cfg, build_scorer)
    assert "SQ_WEBHOOK_SECRET_NOPE" in str(info.value) and "'ciq'" in str(info.value)
    monkeypatch.setenv("SQ_WEBHOOK_SECRET_NOPE", SECRET)
    built = build_extensions(cfg, build_scorer, public_url="https://sq.example")
    assert isinstance(built.runner, WebhookBuildRunner)
    assert SECRET not in repr(built.runner) and SECRET not in repr(cfg)


# ---------------------------------------------------------------- through the app


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
                headers[SIGNATURE_HEADER] = signed(build_id, body)[SIGNATURE_HEADER]
            elif signature is not None:
                headers[SIGNATURE_HEADER] = signature
            return await server.client.post(where, content=body, headers=headers)

        r = await post({"status": "failed"}, signature=None)
        assert r.status_code == 401 and r.json()["error"]["code"] == "bad_signature"
        r = await post({"status": "failed"},
                       signature=signed(build_id, b"{}", secret="wrong secret")[SIGNATURE_HEADER])
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


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_ci_accepts_but_the_reply_is_lost_one_ci_job_and_its_callback_lands_the_request(
    database_url: str, tmp_path: Path, ci: CI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CI takes the job, its answer never arrives in time; the queue retries the
    trigger: same build id, same Idempotency-Key, so still one job, whose signed verdict
    is accepted and lands the request."""
    monkeypatch.setenv("SQ_WEBHOOK_SECRET_CIQ", SECRET)
    (tmp_path / "queues.yaml").write_text(webhook_queues(ci))
    ci.reply_delay_s = 1.5
    async with serve(database_url, tmp_path) as server:
        runner = server.runtime.extensions.for_queue("ciq").runner
        assert isinstance(runner, WebhookBuildRunner)
        runner.request_timeout_s = 0.3  # shorter than the CI's reply: the answer is lost
        sqid = await server.land(change("lostreply", files="a/x.py"), queue="ciq")
        await wait_for(lambda: ci.received, "the trigger")
        runner.request_timeout_s = 10.0  # the first POST keeps 0.3 s; the retry is answered
        await wait_for(lambda: len(ci.received) >= 2, "the trigger sent again")
        assert len(ci.jobs) == 1
        [job] = ci.jobs.values()
        build_id = job["build_id"]
        assert [json.loads(b)["build_id"] for b, _ in ci.received] == [build_id, build_id]
        keys = {h[IDEMPOTENCY_HEADER.lower()] for _, h in ci.received}
        assert len(keys) == 1 and ci.refused == []
        ci.server = server
        await ci.report(job)  # the one job reports: running, then succeeded
        assert ci.callbacks == [204, 204]
        assert await server.wait_terminal(sqid) == "landed"
        assert len(ci.jobs) == 1 and len(ci.received) == 2
        async with server.runtime.db.read() as s:
            build = await spec_repo.get_build(s, queue="ciq", id=build_id)
        assert build.status is BuildStatus.SUCCEEDED


def docs_example(kind: str) -> str:
    """The code block of docs/builds.md after ``<!-- ci-example:<kind> -->``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "builds.md").read_text()
    block = text.split(f"<!-- ci-example:{kind} -->\n", 1)[1].split("```", 2)[1]
    return block.split("\n", 1)[1]


async def test_the_ci_examples_in_the_docs_verify_a_real_trigger_and_report_a_verdict(
    database_url: str, tmp_path: Path, ci: CI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SQ_WEBHOOK_SECRET_CIQ", SECRET)
    (tmp_path / "queues.yaml").write_text(webhook_queues(ci))
    scope: dict[str, Any] = {}
    exec(compile(docs_example("python"), "docs/builds.md", "exec"), scope)
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(change("docs", files="a/x.py"), queue="ciq")
        await wait_for(lambda: ci.received, "a trigger")
        body, headers = ci.received[0]
        header = headers[SIGNATURE_HEADER.lower()]
        trigger = scope["verify_trigger"](SECRET.encode(), body, header)
        assert trigger["build_id"] == json.loads(body)["build_id"]
        for forged in (body.replace(b'"attempt":1', b'"attempt":2'), body + b" "):
            with pytest.raises(PermissionError):
                scope["verify_trigger"](SECRET.encode(), forged, header)
        with pytest.raises(PermissionError):
            scope["verify_trigger"](b"another secret", body, header)

        proc = await asyncio.create_subprocess_exec(
            "bash", "-euc", docs_example("shell"), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={
                "PATH": "/usr/bin:/bin", "SQ_SECRET": SECRET,
                "build_id": trigger["build_id"],
                "callback_url": server.base_url + urlsplit(trigger["callback_url"]).path})
        out, err = await proc.communicate()
        assert proc.returncode == 0, (out, err)
        assert await server.wait_terminal(sqid) == "error"
        run = await server.runtime.extensions.build_store.get(trigger["build_id"])
        assert run is not None and (run.status, run.detail, run.log_url) == (
            BuildStatus.FAILED, "3 tests failed", "https://ci.example/runs/42")
