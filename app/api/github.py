"""GitHub's webhook: ``POST /api/v1/github/webhook`` (``app/gateway/github.py`` acts).

| Answer | When |
|---|---|
| 200 ``{"delivery", "event", "duplicate": false, "outcomes": [{queue, action, detail, sqids}]}`` | verified and handled (``action``: landed, cancelled, refused, ignored, checked — a check event woke a queue build's poll; an event that asks nothing has no outcome) |
| 200 ``{..., "duplicate": true, "outcomes": []}`` | this ``X-GitHub-Delivery`` was handled before: nothing is done again |
| 400 | ``X-GitHub-Delivery`` missing, the body not JSON, or not the event ``X-GitHub-Event`` names |
| 401 | ``X-Hub-Signature-256`` missing, malformed or matching no queue's ``github.webhook_secret_env`` |
| 503 | GitHub or the database did not answer: nothing was done; redeliver it |

Signed, not token-authenticated: the signature is checked over the raw body before it is
parsed. Configure the webhook (or the GitHub App's) with content type
``application/json``, the secret of ``github.webhook_secret_env``, and the events
``pull_request`` and ``issue_comment``, and for a ``github_checks`` queue ``check_run``,
``check_suite`` and ``status`` (docs/github.md).
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from pydantic import BaseModel

from app.api.deps import RuntimeDep
from app.gateway import github

router = APIRouter(prefix="/api/v1/github", tags=["github"])


class OutcomeOut(BaseModel):
    queue: str
    action: Literal["landed", "cancelled", "refused", "ignored", "checked"]
    detail: str
    sqids: list[str]


class WebhookOut(BaseModel):
    delivery: str
    event: str
    duplicate: bool
    outcomes: list[OutcomeOut]


_LANDED = {"delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958", "event": "pull_request",
           "duplicate": False, "outcomes": [{
               "queue": "widgets", "action": "landed", "sqids": ["widgets/7"],
               "detail": "pull request #42 at 6dcb09b5b578 queued"}]}
_PAYLOAD = {"action": "labeled", "number": 42, "label": {"name": "merge-queue"},
            "pull_request": {"number": 42, "state": "open",
                             "head": {"sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e"},
                             "base": {"ref": "main"}},
            "repository": {"full_name": "acme/widgets"}, "sender": {"login": "mona"}}


def _error(description: str, code: str, message: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {
        "schema": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"], "properties": {
                "code": {"type": "string"}, "message": {"type": "string"}}}}},
        "example": {"error": {"code": code, "message": message}}}}}


@router.post(
    "/webhook",
    response_model=WebhookOut,
    responses={
        200: {"description": "verified; what it did (or that it was a redelivery)",
              "content": {"application/json": {"example": _LANDED}}},
        400: _error("no X-GitHub-Delivery, or a body that is not the event",
                    "validation_error", "the X-GitHub-Delivery header is missing or not an "
                    "id (1-100 of [A-Za-z0-9._:-]); GitHub sends one with every delivery"),
        401: _error("X-Hub-Signature-256 missing or not matching", "bad_signature",
                    "the X-Hub-Signature-256 signature does not match any queue's webhook "
                    "secret"),
        422: _error("a header longer than GitHub sends", "invalid_request",
                    "header x-github-delivery: String should have at most 200 characters"),
        503: _error("GitHub or the database did not answer; redeliver", "service_unavailable",
                    "GitHub did not answer; nothing was done: redeliver the webhook once "
                    "GitHub answers"),
    },
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"type": "object", "description": "a GitHub webhook payload"},
        "example": _PAYLOAD}}}},
    summary="GitHub webhook: labels and /submitqueue comments land and cancel",
)
async def webhook(
    request: Request, runtime: RuntimeDep,
    x_github_event: Annotated[str, Header(max_length=100, description="the event")] = "",
    x_github_delivery: Annotated[str | None, Header(
        max_length=200, description="GitHub's id of this delivery")] = None,
    x_hub_signature_256: Annotated[str | None, Header(
        max_length=200, description="sha256=<hex HMAC-SHA256 of the raw body>")] = None,
) -> WebhookOut:
    """A delivery of GitHub's webhook: the label ``github.land_label`` added to an open pull
    request, or a comment ``/submitqueue land`` by someone with write access, lands it
    (the same path as ``POST /api/v1/queues/{queue}/requests``, actor ``github:<login>``);
    removing the label, ``/submitqueue cancel``, closing the pull request or pushing to
    it (``synchronize``: "superseded by a new push") cancels its request. Each
    ``X-GitHub-Delivery`` is acted on once."""
    body = await request.body()
    result = await github.handle(runtime, event=x_github_event, delivery=x_github_delivery,
                                 body=body, signature=x_hub_signature_256)
    return WebhookOut.model_validate(result.to_json())
