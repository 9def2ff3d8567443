"""A CI service on a real port for the webhook build runner's tests.

It verifies SubmitQueue's trigger signature (401 otherwise), records one *job* per
``Idempotency-Key`` (a repeated key is the same job: 200, nothing new), answers
``answer``, and — when ``server`` is set — reports each new job's verdict to its
callback URL, signed for that build. ``reply_delay_s`` holds the answer to a job's
first trigger back (longer than the runner's request timeout = a lost reply).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.extensions.builds.signature import SIGNATURE_HEADER, BadSignature, sign, verify
from tests.e2e.harness import Server, free_port

SECRET = "a-shared-secret-of-some-length"


def signed(build_id: str, body: bytes, *, t: int | None = None,
           secret: str = SECRET) -> dict[str, str]:
    """Headers of a report of ``build_id`` signed as a genuine CI would."""
    return {"content-type": "application/json",
            SIGNATURE_HEADER: sign(secret.encode(), build_id, body,
                                   t=int(time.time()) if t is None else t)}


@dataclass
class CI:
    answer: int = 202
    verdict: Callable[[dict[str, Any]], str] = lambda body: "succeeded"
    server: Server | None = None
    reply_delay_s: float = 0.0
    received: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    callbacks: list[int] = field(default_factory=list)
    url: str = ""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def hook(self, request: Request) -> JSONResponse:
        body = await request.body()
        headers = dict(request.headers)
        self.received.append((body, headers))
        trigger = json.loads(body)
        try:
            verify(SECRET.encode(), trigger["build_id"], body,
                   headers.get(SIGNATURE_HEADER.lower()), now_s=time.time())
        except BadSignature as exc:
            self.refused.append(str(exc))
            return JSONResponse({"error": str(exc)}, status_code=401)
        if self.answer >= 300:
            return JSONResponse({"error": "nope"}, status_code=self.answer)
        key = headers.get("idempotency-key") or trigger["build_id"]
        if key in self.jobs:
            return JSONResponse({"queued": True, "repeat": True}, status_code=200)
        self.jobs[key] = trigger
        if self.server is not None:
            task = asyncio.create_task(self.report(trigger))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        if self.reply_delay_s:
            await asyncio.sleep(self.reply_delay_s)
        return JSONResponse({"queued": True}, status_code=self.answer)

    async def report(self, trigger: dict[str, Any]) -> None:
        assert self.server is not None
        path = urlsplit(trigger["callback_url"]).path
        verdict = self.verdict(trigger)
        for report in ({"status": "running"},
                       {"status": verdict,
                        "log_url": f"https://ci.example/logs/{trigger['build_id']}",
                        "detail": f"CI says {verdict}"}):
            await asyncio.sleep(0.05)
            body = json.dumps(report).encode()
            r = await self.server.client.post(path, content=body,
                                              headers=signed(trigger["build_id"], body))
            self.callbacks.append(r.status_code)

    async def post(self, build_id: str, report: Any, **sign_kw: Any) -> httpx.Response:
        """Report on ``build_id`` as its CI (signed for it) to ``server``."""
        assert self.server is not None
        body = json.dumps(report).encode()
        return await self.server.client.post(f"/api/v1/builds/{build_id}/status",
                                             content=body, headers=signed(build_id, body,
                                                                          **sign_kw))


@asynccontextmanager
async def running_ci() -> AsyncIterator[CI]:
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


def webhook_queues(ci: CI) -> str:
    """A ``queues.yaml`` with one queue ``ciq`` whose builds go to ``ci``."""
    return f"""\
queues:
  - name: ciq
    change_provider: {{type: fake}}
    merger: {{type: fake}}
    conflict_analyzer: {{type: pathoverlap, by: directory}}
    build_runner: {{type: webhook, url: "{ci.url}", secret_env: SQ_WEBHOOK_SECRET_CIQ,
                   timeout_s: 60}}
"""
