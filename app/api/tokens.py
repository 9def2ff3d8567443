"""API tokens over HTTP: who am I (``GET /api/v1/auth/whoami``, any caller) and the
admin API's token management (``/api/v1/admin/tokens``, scope ``admin``). The rules are
in ``app/domain/access.py``; the work in ``app/gateway/access.py``.

| Route | What |
|---|---|
| ``GET /api/v1/auth/whoami`` | the caller: actor, every scope it has (implied ones included), queues, the server's auth mode; 401 for a token that is not valid |
| ``POST /api/v1/admin/tokens`` | ``{"label", "scopes": [...], "queues": [...]|null, "expires_in_s": n|null}`` -> 201 with the token (shown this once; only its scrypt hash is stored); audited |
| ``GET /api/v1/admin/tokens?include_revoked=`` | every token, newest first, without secrets |
| ``POST /api/v1/admin/tokens/{id}/revoke`` | ``{"reason"}``: revoked at once in every process; a repeat says ``revoked: false``; audited |
"""  # noqa: E501 - the route table reads best unwrapped

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, ConfigDict, Field

from app.api.admin import require_admin
from app.api.auth import Credentials
from app.api.deps import RuntimeDep
from app.api.examples import ok
from app.api.schemas import ErrorOut, SafeLine, SafeText
from app.domain.access import OPEN_SCOPES, Principal, Scope, TokenRecord, anonymous, granted

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 422, 503)
}
router = APIRouter(tags=["access"], responses=_ERRORS)
Actor = Annotated[str, Depends(require_admin)]
TokenId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$",
                              description="The token's id (`sq_<id>_...`), as listed.")]


class WhoAmIOut(BaseModel):
    actor: str = Field(description="Who the history records for this caller.")
    anonymous: bool
    token_id: str = Field(description="The API token's id; empty for SQ_ADMIN_TOKEN and "
                                      "for anonymous callers.")
    scopes: list[str] = Field(description="Every scope the caller has, implied ones included.")
    queues: list[str] | None = Field(description="The queues it may act on; null = all.")
    auth: str = Field(description="The server's SQ_AUTH: required or open.")
    reads_required: bool = Field(description="Whether reads need a token (SQ_AUTH_READS).")


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"label": "ci-bot", "scopes": ["land", "cancel"], "queues": ["demo"],
         "expires_in_s": 7776000},
        {"label": "ops-bob", "scopes": ["admin"]},
    ]})

    label: SafeLine = Field(max_length=100, description="Who uses it, e.g. ci-bot or alice: "
                                                        "the actor the history records.",
                            examples=["ci-bot"])
    scopes: list[Scope] = Field(min_length=1, max_length=5, examples=[["land", "cancel"]])
    queues: list[SafeLine] | None = Field(default=None, max_length=100,
                                          description="Limit it to these queues; null = all.")
    expires_in_s: int | None = Field(default=None, description="Lifetime in seconds; null = "
                                                               "never expires.")


class RevokeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"reason": "rotated: ci-bot has a new token"}]})

    reason: SafeText = Field(default="", max_length=1000)


class TokenOut(BaseModel):
    id: str
    label: str
    scopes: list[str]
    queues: list[str] | None
    created_at_ms: int
    created_by: str
    expires_at_ms: int | None = Field(description="null = never")
    last_used_at_ms: int | None = Field(description="null = never used (recorded at most "
                                                    "once a minute)")
    revoked_at_ms: int | None = Field(description="null = not revoked")

    @classmethod
    def of(cls, r: TokenRecord) -> TokenOut:
        return cls(id=r.id, label=r.label, scopes=sorted(s.value for s in r.scopes),
                   queues=None if r.queues is None else sorted(r.queues),
                   created_at_ms=r.created_at_ms, created_by=r.created_by,
                   expires_at_ms=r.expires_at_ms or None,
                   last_used_at_ms=r.last_used_at_ms or None,
                   revoked_at_ms=r.revoked_at_ms or None)


class TokenCreated(TokenOut):
    token: str = Field(description="The secret token: shown this once, never stored.")


class TokensOut(BaseModel):
    items: list[TokenOut]


class RevokedOut(BaseModel):
    id: str
    label: str
    revoked: bool = Field(description="false: it was revoked before")
    revoked_at_ms: int


@router.get("/api/v1/auth/whoami", response_model=WhoAmIOut, summary="Who am I",
            responses=ok(200, "WHOAMI"))
async def whoami(rt: RuntimeDep, credentials: Credentials = None) -> WhoAmIOut:
    """Who the server takes the caller for, and what it may do (the pages use it to show
    the cancel button only to those who may cancel)."""
    access = rt.access
    who = await access.principal(credentials.credentials if credentials else None)
    if who is None:
        policy = access.policy
        scopes = (OPEN_SCOPES if policy.mode == "open" else
                  frozenset() if policy.reads_required else frozenset({Scope.READ}))
        who = anonymous(scopes)
    elif access.policy.mode == "open":
        # as authorize() treats it: anyone may act anywhere, so no queue limit applies
        who = Principal(actor=who.actor, scopes=who.scopes | OPEN_SCOPES,
                        token_id=who.token_id)
    return WhoAmIOut(actor=who.actor, anonymous=who.anonymous, token_id=who.token_id,
                     scopes=sorted(s.value for s in granted(who.scopes)),
                     queues=None if who.queues is None else sorted(who.queues),
                     auth=access.policy.mode, reads_required=access.policy.reads_required)


@router.post("/api/v1/admin/tokens", status_code=201, response_model=TokenCreated,
             tags=["admin"], summary="Create an API token",
             responses=ok(201, "TOKEN_CREATED"))
async def create_token(body: TokenIn, rt: RuntimeDep, actor: Actor) -> TokenCreated:
    """Create an API token for ``label`` with ``scopes`` (``read``, ``land``, ``cancel``,
    ``cancel:any``, ``admin``), optionally limited to ``queues`` and to a lifetime. The
    answer holds the secret (``sq_<id>_<secret>``) this once: only its scrypt hash is
    stored. Audited."""
    record, token = await rt.access.create_token(
        label=body.label, scopes=body.scopes, queues=body.queues,
        expires_in_s=body.expires_in_s, known_queues=list(rt.queues), actor=actor)
    return TokenCreated(**TokenOut.of(record).model_dump(), token=token)


@router.get("/api/v1/admin/tokens", response_model=TokensOut, tags=["admin"],
            summary="List API tokens", responses=ok(200, "TOKENS"))
async def list_tokens(rt: RuntimeDep, _actor: Actor,
                      include_revoked: bool = False) -> TokensOut:
    """Every API token, newest first, without secrets: label, scopes, queues, who
    created it and when, when it expires and was last used (recorded at most once a
    minute); revoked ones only with ``include_revoked=true``."""
    return TokensOut(items=[TokenOut.of(r) for r in
                            await rt.access.tokens(include_revoked=include_revoked)])


@router.post("/api/v1/admin/tokens/{token_id}/revoke", response_model=RevokedOut,
             tags=["admin"], summary="Revoke an API token",
             responses=ok(200, "TOKEN_REVOKED"))
async def revoke_token(token_id: TokenId, rt: RuntimeDep, actor: Actor,
                       body: RevokeIn | None = None) -> RevokedOut:
    """Revoke a token: every server process refuses it from its next call on (401). A
    repeat answers ``revoked: false`` and changes nothing. Audited with ``reason``."""
    record, revoked = await rt.access.revoke_token(
        token_id, actor=actor, reason=body.reason if body else "")
    return RevokedOut(id=record.id, label=record.label, revoked=revoked,
                      revoked_at_ms=record.revoked_at_ms)
