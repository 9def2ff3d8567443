"""A build runner that hands each build to external CI through a signed webhook.

Trigger: ``POST <url>`` with the JSON body

```json
{"build_id": "wh-...", "queue": "q", "batch_id": "q/batch/3", "path_id": "...",
 "attempt": 1, "base_changes": ["git://..."], "head_changes": ["git://..."],
 "callback_url": "<public_url>/api/v1/builds/wh-.../status",
 "ref": "refs/sq/builds/wh-...", "sha": "<40 hex>", "tree": "<40 hex>", "base": "<40 hex>"}
```

With a git repository configured (``publisher``: ``publish.TreePublisher``), the queue
makes the build's tree itself before the first POST (the strategies' shape, as the
merger lands it), pushes it to the queue ref ``ref`` and sends its commit ``sha``, its
``tree`` hash and the target tip ``base`` it started from; the CI builds exactly that
commit. Changes that cannot be combined fail the build before anything is sent. The
tree is recorded with the run, so a trigger sent again carries the same fields.
Without a repository the four fields are absent.

and the headers ``X-SubmitQueue-Signature: t=<unix s>,v1=<hex HMAC-SHA256 of
"<t>.<build_id>.<raw body>">`` keyed with the queue's secret (``signature.py``) and
``Idempotency-Key: <BuildRequest.idempotency_key>``.

One build per (queue, path, attempt): the build id is derived from the request's
idempotency key (``BuildRequest.build_id``) and the run is recorded ``accepted``
*before* the POST. So a trigger sent again — the queue redelivers the ``build``
message after a timeout, a lost reply, a 5xx or a crash before or after the POST —
carries the same build id, body and ``Idempotency-Key``, and the CI starts no
second job; once CI has reported on the build (or it ended) nothing is sent again.
Any 2xx accepts the build. A connection error, a timeout, 408, 409 (the CI is still
handling the same key), 429 or 5xx is retryable (the error propagates and the queue
tries again); any other status is permanent (``BuildTriggerRefused``, which
dead-letters the build and fails its batch with the CI's answer).

Result: the CI calls ``POST <callback_url>`` with ``{"status": "running" | "succeeded"
| "failed" | "cancelled" | "errored", "log_url": "...", "detail": "..."}`` (the last
two optional; ``sha`` too, except that a build with a queue ref accepts a terminal
verdict only with ``"sha": "<the sha it was sent>"``: a verdict for another commit is
refused with 409), signed the same way for *that* build id (``accept_callback``): a
report signed for another build, or more than 300 s from now, is refused before the
body is read. The first terminal status stands; repeating it is accepted, contradicting
it is refused. A build with no verdict ``timeout_s`` after its trigger was first
recorded reports ``errored`` (its path gets a new attempt, hence a new build id).
``cancel()`` records ``cancelled`` at once; the protocol has no way to stop the CI
job, whose later callbacks are then refused.
"""

from __future__ import annotations

import json
import time
from typing import Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.domain.build_run import BuildRun
from app.domain.errors import BuildTriggerRefused as BuildTriggerRefused  # re-exported
from app.domain.errors import InvalidState, NotFound
from app.domain.states import BuildStatus
from app.domain.text import check_line, check_text
from app.extensions.base import BuildReport, BuildRequest, BuildStore, TestedTree
from app.extensions.builds import runlog
from app.extensions.builds.signature import SIGNATURE_HEADER, BadSignature, sign, verify
from app.extensions.git.publish import TreePublisher, build_ref
from app.extensions.git.tree import TreeRefused

__all__ = ["IDEMPOTENCY_HEADER", "SIGNATURE_HEADER", "BadSignature", "BuildTriggerRefused",
           "CallbackBody", "WebhookBuildRunner", "sign"]

IDEMPOTENCY_HEADER = "Idempotency-Key"
REQUEST_TIMEOUT_S = 10.0


class CallbackBody(BaseModel):
    """What CI reports to ``POST /api/v1/builds/{build_id}/status``."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["running", "succeeded", "failed", "cancelled", "errored"]
    log_url: str | None = Field(default=None, max_length=2000,
                                description="where a person reads the build's log (http/https)")
    detail: str | None = Field(default=None, max_length=4000,
                               description="one line on why, shown with the build")
    sha: str | None = Field(default=None, pattern=r"^[0-9a-f]{40}$",
                            description="the commit the CI built: the trigger's ``sha`` "
                                        "(required with a terminal status when one was sent)")

    _line = field_validator("log_url", mode="before")(check_line)
    _text = field_validator("detail", mode="before")(check_text)

    @field_validator("log_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and v != "":
            parts = urlsplit(v)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError("log_url must be an http:// or https:// URL")
        return v


def shown(url: str) -> str:
    """A URL as it may appear in logs and errors: no credentials, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class WebhookBuildRunner:
    def __init__(
        self,
        *,
        queue: str,
        url: str,
        secret: str,
        public_url: str,
        store: BuildStore,
        timeout_s: float = 3600.0,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        client: httpx.AsyncClient | None = None,
        publisher: TreePublisher | None = None,
    ) -> None:
        if not secret:
            raise ValueError("the webhook secret must not be empty")
        self.queue = queue
        self.url = url
        self._secret = secret.encode()
        self.public_url = public_url.rstrip("/")
        self.store = store
        self.timeout_s = timeout_s
        self.request_timeout_s = request_timeout_s
        self._client = client
        self.publisher = publisher
        self.clock = _wall_clock_ms

    def callback_url(self, build_id: str) -> str:
        return f"{self.public_url}/api/v1/builds/{build_id}/status"

    def sign(self, build_id: str, body: bytes) -> str:
        """The signature header value for ``body`` sent for ``build_id`` now."""
        return sign(self._secret, build_id, body, t=self.clock() // 1000)

    async def trigger(self, request: BuildRequest) -> str:
        build_id = request.build_id("wh")
        run = await self.store.get(build_id)
        if run is None:
            now = self.clock()
            await self.store.create(BuildRun(
                id=build_id, queue=request.queue, runner="webhook", batch_id=request.batch_id,
                path_id=request.path_id, attempt=request.attempt, status=BuildStatus.ACCEPTED,
                heartbeat_ms=now, created_at_ms=now, updated_at_ms=now))
        elif run.status is not BuildStatus.ACCEPTED:
            return build_id  # CI has reported on it, or it ended: the job exists; send nothing
        else:
            await self._say(build_id, "sending the trigger again (same build id and "
                            f"{IDEMPOTENCY_HEADER}: the CI must not start a second job)")
        tested = await self._tree(request, build_id)
        if tested is False:
            return build_id  # the changes do not combine: failed, nothing to send
        fields: dict[str, object] = {}
        if isinstance(tested, TestedTree):
            fields = {"ref": build_ref(build_id), "sha": tested.commit, "tree": tested.tree,
                      "base": tested.base}
        body = json.dumps({
            "build_id": build_id, "queue": request.queue, "batch_id": request.batch_id,
            "path_id": request.path_id, "attempt": request.attempt,
            "base_changes": list(request.base_changes),
            "head_changes": list(request.head_changes),
            "callback_url": self.callback_url(build_id), **fields,
        }, separators=(",", ":")).encode()
        headers = {"content-type": "application/json", "user-agent": "SubmitQueue",
                   IDEMPOTENCY_HEADER: request.idempotency_key,
                   SIGNATURE_HEADER: self.sign(build_id, body)}
        where = shown(self.url)
        try:
            if self._client is not None:
                response = await self._client.post(self.url, content=body, headers=headers,
                                                   timeout=self.request_timeout_s)
            else:
                async with httpx.AsyncClient(timeout=self.request_timeout_s) as client:
                    response = await client.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            # the CI may have the job (a lost reply): keep the run, the retry resends it
            await self._say(build_id, f"could not reach CI at {where}: {type(exc).__name__}; "
                            "the trigger will be sent again")
            raise
        if response.is_success:
            await self._say(build_id, f"sent to CI at {where}: HTTP {response.status_code}")
            return build_id
        answer = " ".join(response.text.split())[:300]
        detail = f"CI at {where} answered HTTP {response.status_code} to the trigger: {answer}"
        code = response.status_code
        if code in (408, 409, 429) or (code >= 500 and code not in (501, 505)):
            await self._say(build_id, f"{detail}; the trigger will be sent again")
            response.raise_for_status()  # retryable: the queue tries again
        await self._end(build_id, BuildStatus.ERRORED, detail)
        raise BuildTriggerRefused(f"{detail}; check build_runner.url of queue {self.queue!r} "
                                  "and the CI's webhook configuration")

    async def status(self, build_id: str) -> BuildReport:
        run = await self.store.get(build_id)
        if run is None:
            raise NotFound(f"build {build_id!r} is unknown to the webhook runner of queue "
                           f"{self.queue!r}")
        if not run.status.terminal and self.clock() - run.created_at_ms > self.timeout_s * 1000:
            run = await self._end(
                build_id, BuildStatus.ERRORED,
                f"no verdict from CI within {self.timeout_s:g}s of the trigger") or run
        return BuildReport(run.status, log_url=run.log_url, detail=run.detail,
                           tested=run.tested)

    async def _tree(self, request: BuildRequest, build_id: str) -> TestedTree | bool | None:
        """The build's published tree (made and pushed once, then read from the run);
        None without a publisher; False when the changes do not combine (the run has
        failed with the reason)."""
        if self.publisher is None:
            return None
        run = await self.store.get(build_id)
        if run is not None and run.tested is not None:
            return run.tested
        try:
            tested = await self.publisher.publish(request, build_id)
        except TreeRefused as exc:
            await self._end(build_id, BuildStatus.FAILED, str(exc))
            return False
        await self.store.update(build_id, now_ms=self.clock(), tested=tested)
        await self._say(build_id, f"tree: {tested.commit} (tree {tested.tree}) pushed to "
                        f"{build_ref(build_id)}, on {tested.base}")
        return tested

    async def cancel(self, build_id: str) -> None:
        await self._end(build_id, BuildStatus.CANCELLED,
                        "cancelled by SubmitQueue (the CI job is not stopped by the webhook "
                        "protocol; its later reports are refused)")

    async def accept_callback(self, build_id: str, body: bytes, signature: str | None) -> None:
        """Record a signed status report from CI.

        Raises ``NotFound`` (not a webhook build of this queue), ``BadSignature`` (checked
        before the body is read: missing, malformed, stale, or signed for another build or
        body), pydantic's ``ValidationError`` (a body that is not a ``CallbackBody``) or
        ``InvalidState`` (the build already ended with another status)."""
        run = await self.store.get(build_id)
        if run is None or run.runner != "webhook" or run.queue != self.queue:
            raise NotFound(f"build {build_id!r} is not a webhook build of queue {self.queue!r}")
        verify(self._secret, build_id, body, signature, now_s=self.clock() / 1000)
        report = CallbackBody.model_validate_json(body)
        status = BuildStatus(report.status)
        if run.tested is not None and (report.sha is not None or status.terminal) \
                and report.sha != run.tested.commit:
            raise InvalidState(
                f"build {build_id!r} was sent {run.tested.commit} ({build_ref(build_id)}); "
                f"a report for {report.sha or 'no sha'} is not its verdict: send "
                f'"sha": "{run.tested.commit}" with the status of that commit\'s build')
        if run.status.terminal:
            if run.status is status:
                return
            raise InvalidState(f"build {build_id!r} already ended {run.status.value}; "
                               f"a report of {status.value} cannot change that")
        detail = report.detail or ""
        await self._say(build_id, f"CI reported {status.value}"
                        + (f": {detail}" if detail else "")
                        + (f" (log: {report.log_url})" if report.log_url else ""))
        updated = await self.store.update(build_id, now_ms=self.clock(), status=status,
                                          detail=detail if detail else None,
                                          log_url=report.log_url or None)
        if updated is not None and updated.status is not status and updated.status.terminal:
            raise InvalidState(f"build {build_id!r} already ended {updated.status.value}")

    async def _say(self, build_id: str, line: str) -> None:
        await runlog.say(self.store, build_id, line)

    async def _end(self, build_id: str, status: BuildStatus, detail: str) -> BuildRun | None:
        return await runlog.end(self.store, build_id, status, detail, now_ms=self.clock())
