"""Builds run by SubmitQueue's own runners: their logs, and CI's status callback.

| Route | Answer |
|---|---|
| ``GET /api/v1/builds/{build_id}/log`` | 200 ``text/plain``: the log so far (the last MiB), also while the build runs; 404 JSON for a build no runner of ours keeps (fake builds) |
| ``POST /api/v1/builds/{build_id}/status`` | CI reports a webhook build's status: 204 (also for a repeat of the verdict already recorded); 401 missing, malformed, retired ``sha256=``, stale (more than 300 s off) or not matching ``X-SubmitQueue-Signature``; 404 not a webhook build; 409 contradicts a verdict already recorded; 422 a body that is not ``{status, log_url?, detail?}`` |

The signature (``t=<unix s>,v1=<HMAC-SHA256 of "<t>.<build_id>.<raw body>">``,
``app/extensions/builds/signature.py``) is checked for the build id of the URL over
the raw body, before the body is read as JSON: a report signed for another build is
refused.

Needs ``app.state.runtime`` with ``extensions`` (``ExtensionRegistry``: its
``build_store`` and each queue's runner).
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from fastapi.security import APIKeyHeader

from app.api.auth import Reader
from app.api.deps import RuntimeDep
from app.api.examples import media
from app.domain.errors import NotFound
from app.extensions.builds.signature import FORMAT, SIGNATURE_HEADER
from app.extensions.builds.webhook import CallbackBody, WebhookBuildRunner

router = APIRouter(prefix="/api/v1/builds", tags=["builds"])

BuildId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$",
                              description="the build id a runner of ours gave the build")]

# Inline, not {"model": ErrorOut}: FastAPI would document it under the log's text/plain.
_ERROR: dict[str, Any] = {"content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/ErrorOut"}, **media("BUILD_NOT_FOUND")}}}


Runtime = RuntimeDep
# Not a key but an HMAC per request; declared as a header scheme so the docs show it.
signature_header = APIKeyHeader(
    name=SIGNATURE_HEADER, auto_error=False, scheme_name="CallbackSignature",
    description=f"Per-request HMAC of CI's status report: `{FORMAT}`, keyed with the "
                "queue's webhook secret (`build_runner.secret_env`), e.g. "
                "`t=1796415824,v1=<64 hex digits>`. Timestamps more than 300 s off are "
                "refused; several v1= entries may be sent while a secret is rotated.")
Signature = Annotated[str | None, Depends(signature_header)]


def _no_log(build_id: str) -> NotFound:
    return NotFound(f"build {build_id!r} has no log here: only builds of the command and "
                    "webhook runners are kept (fake builds keep none); check the build id "
                    "in the request's history (build_url)")


def _not_webhook(build_id: str) -> NotFound:
    return NotFound(f"build {build_id!r} is not a webhook build of this server: only builds "
                    "triggered by a queue's webhook runner take status reports; use the "
                    "build_id of the trigger's body")


@router.get(
    "/{build_id}/log",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"},
                                                **media("BUILD_LOG")}},
                     "description": "the build's output so far"},
               401: {**_ERROR, "description": "SQ_AUTH_READS=required and no valid token"},
               403: {**_ERROR, "description": "the token lacks the scope 'read'"},
               404: {**_ERROR, "description": "no such build"},
               422: {**_ERROR, "description": "the build id is not 1-200 of [A-Za-z0-9._-]"}},
    summary="A build's log (the last MiB), also while it runs",
)
async def build_log(build_id: BuildId, runtime: Runtime, _caller: Reader) -> PlainTextResponse:
    """The output of a build run by this server's ``command`` or ``webhook`` runner: the
    command's stdout and stderr (the last MiB) with the runner's own ``[sq]`` lines
    (waiting for a slot, the command run, the outcome), as plain text, uncached, also
    while the build runs. ``build_id`` is the one in the request's history
    (``build_id``, ``build_url``). Fake builds keep no log: 404. Needs the ``read``
    scope when ``SQ_AUTH_READS=required``."""
    text = await runtime.extensions.build_store.get_log(build_id)
    if text is None:
        raise _no_log(build_id)
    return PlainTextResponse(text, headers={"cache-control": "no-store"})


@router.post(
    "/{build_id}/status",
    status_code=204,
    response_class=Response,
    responses={
        204: {"description": "recorded"},
        401: {**_ERROR, "description": f"{SIGNATURE_HEADER} missing, malformed, stale or "
                                       f"wrong; expected `{FORMAT}`"},
        404: {**_ERROR, "description": "not a webhook build of this server"},
        409: {**_ERROR, "description": "the build already ended with another status"},
        422: {**_ERROR, "description": "the body is not a status report"},
    },
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": CallbackBody.model_json_schema(),
        **media("BUILD_STATUS_IN")}}}},
    summary="CI reports a webhook build's status (signed)",
)
async def build_status(build_id: BuildId, request: Request, runtime: Runtime,
                       signature: Signature = None) -> Response:
    """CI's report on a build that a queue's ``webhook`` runner triggered: ``running``
    while it runs, then one terminal status (``succeeded``, ``failed``, ``cancelled``,
    ``errored``) with the commit it built (``sha``, the trigger's) and where its log is.
    The request is signed, not token-authenticated: ``X-SubmitQueue-Signature:
    t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<build id>.<raw body>">`` keyed with
    the queue's webhook secret, checked over the raw bytes before they are parsed, so
    a report signed for another build or more than 300 s ago is refused (401). A
    repeat of the verdict already recorded is a 204 too; a different verdict after a
    terminal one is a 409."""
    body = await request.body()
    run = await runtime.extensions.build_store.get(build_id)
    runner: Any = None
    if run is not None:
        runner = runtime.extensions.for_queue(run.queue).runner
    if run is None or not isinstance(runner, WebhookBuildRunner):
        raise _not_webhook(build_id)
    try:  # a BadSignature is a 401 (app/api/errors.py)
        await runner.accept_callback(build_id, body, signature)
    except pydantic.ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
    return Response(status_code=204)
