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
from fastapi import APIRouter, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse

from app.api.auth import Reader
from app.api.deps import RuntimeDep
from app.domain.errors import NotFound
from app.extensions.builds.signature import FORMAT, SIGNATURE_HEADER
from app.extensions.builds.webhook import CallbackBody, WebhookBuildRunner

router = APIRouter(prefix="/api/v1/builds", tags=["builds"])

BuildId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$",
                              description="the build id a runner of ours gave the build")]

_ERROR = {"content": {"application/json": {"schema": {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"type": "string"}, "message": {"type": "string"}}}}}}}}


Runtime = RuntimeDep


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
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                     "description": "the build's output so far"},
               401: {**_ERROR, "description": "SQ_AUTH_READS=required and no valid token"},
               403: {**_ERROR, "description": "the token lacks the scope 'read'"},
               404: {**_ERROR, "description": "no such build"}},
    summary="A build's log (the last MiB), also while it runs",
)
async def build_log(build_id: BuildId, runtime: Runtime, _caller: Reader) -> PlainTextResponse:
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
                                       f"wrong; expected {FORMAT}"},
        404: {**_ERROR, "description": "not a webhook build of this server"},
        409: {**_ERROR, "description": "the build already ended with another status"},
        422: {**_ERROR, "description": "the body is not a status report"},
    },
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": CallbackBody.model_json_schema()}}}},
    summary="CI reports a webhook build's status (signed)",
)
async def build_status(build_id: BuildId, request: Request, runtime: Runtime) -> Response:
    body = await request.body()
    run = await runtime.extensions.build_store.get(build_id)
    runner: Any = None
    if run is not None:
        runner = runtime.extensions.for_queue(run.queue).runner
    if run is None or not isinstance(runner, WebhookBuildRunner):
        raise _not_webhook(build_id)
    try:  # a BadSignature is a 401 (app/api/errors.py)
        await runner.accept_callback(build_id, body, request.headers.get(SIGNATURE_HEADER))
    except pydantic.ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
    return Response(status_code=204)
