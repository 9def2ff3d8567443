"""Who is calling, and may they: the gateway's authentication and authorization
(the rules are in ``app/domain/access.py``), and the admin API's token management.

| Bearer token given | ``SQ_AUTH=required`` | ``SQ_AUTH=open`` |
|---|---|---|
| none | land/cancel/admin: 401 (admin: 403 ``admin_disabled`` without ``SQ_ADMIN_TOKEN``); reads: public (401 with ``SQ_AUTH_READS=required``) | anyone may land, cancel and read, as ``anonymous``; admin: 401 (403 ``admin_disabled`` without ``SQ_ADMIN_TOKEN``) |
| ``SQ_ADMIN_TOKEN`` | every scope, as its label | the same |
| anything but an API token, without ``SQ_ADMIN_TOKEN`` set, to the admin API | 403 ``admin_disabled`` | the same |
| an API token, valid | its scopes in its queues, as its label; a scope it lacks: 403 ``missing_scope`` naming it | its scopes plus open mode's, as its label |
| unknown, malformed, wrong, revoked or expired | 401, saying which | 401 (a credential that was sent is never ignored) |

A secret is verified with scrypt (~60 ms, in a worker thread) once per process; later
calls with the same token compare a SHA-256 fingerprint held in memory (never stored).
The token's row is read on every call, so a revocation holds at once in every process.
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

from app.db.engine import Database
from app.db.repos import audit as audit_repo
from app.db.repos import tokens as repo
from app.domain.access import (
    ANONYMOUS,
    LABEL,
    LABEL_RULE,
    OPEN_SCOPES,
    Principal,
    Scope,
    TokenRecord,
    anonymous,
    fingerprint,
    granted,
    hash_secret,
    new_token,
    parse_token,
    verify_secret,
)
from app.domain.errors import (
    AdminDisabled,
    Forbidden,
    MissingScope,
    NotFound,
    Unauthorized,
    ValidationError,
)

log = logging.getLogger("submitqueue.access")

CACHE_SIZE = 1024
MAX_EXPIRY_S = 10 * 366 * 24 * 3600


def admin_label(token: str) -> str:
    """``label:secret`` -> ``label``; any other admin token -> ``admin``."""
    label, sep, secret = token.partition(":")
    return label if sep and label and secret else "admin"


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    mode: Literal["required", "open"]
    reads_required: bool = False
    admin_token: str | None = None


class Access:
    """One per process: ``authorize`` for the routes, token management for the admin
    API. ``clock`` is the gateway's (epoch ms)."""

    def __init__(self, db: Database, policy: AccessPolicy, clock: Callable[[], int]) -> None:
        self.db = db
        self.policy = policy
        self.clock = clock
        self._verified: OrderedDict[str, bytes] = OrderedDict()

    # -- authentication ----------------------------------------------------------------
    async def principal(self, bearer: str | None) -> Principal | None:
        """The caller a bearer token names (None when none was sent); ``Unauthorized``
        for a token that is not valid now."""
        given = (bearer or "").strip()
        if not given:
            return None
        admin = self.policy.admin_token
        if admin and hmac.compare_digest(given.encode(), admin.encode()):
            return Principal(actor=admin_label(admin), scopes=frozenset({Scope.ADMIN}))
        parsed = parse_token(given)
        if parsed is None:
            shape = ("API tokens read sq_<id>_<secret>, as `submitqueue token create` "
                     "printed them")
            raise Unauthorized(f"wrong admin token, and not an API token either ({shape})"
                               if admin else f"this is not a SubmitQueue token ({shape})")
        token_id, secret = parsed
        async with self.db.read() as s:
            record = await repo.get(s, token_id)
        if record is None:
            raise Unauthorized(f"token {token_id} does not exist (it may have been deleted "
                               "with its database); ask an admin for a new one")
        unusable = record.usable_at(self.clock())
        if unusable is not None:
            raise Unauthorized(f"token {token_id} ({record.label}): {unusable}; ask an admin "
                               "for a new one")
        await self._verify(record, secret)
        await self._touch(record)
        return Principal(actor=record.label, scopes=record.scopes, queues=record.queues,
                         token_id=record.id)

    async def _verify(self, record: TokenRecord, secret: str) -> None:
        seen = fingerprint(secret)
        known = self._verified.get(record.id)
        if known is not None and hmac.compare_digest(known, seen):
            self._verified.move_to_end(record.id)
            return
        if not await asyncio.to_thread(verify_secret, secret, record.secret_hash):
            raise Unauthorized(f"wrong secret for token {record.id}")
        self._verified[record.id] = seen
        while len(self._verified) > CACHE_SIZE:
            self._verified.popitem(last=False)

    async def _touch(self, record: TokenRecord) -> None:
        now = self.clock()
        if now - record.last_used_at_ms < repo.LAST_USED_EVERY_MS:
            return
        try:
            async with self.db.write() as s:
                await repo.touch(s, record.id, now_ms=now)
        except Exception:  # a missed "last used" must not refuse the call
            log.warning("could not record a token's use", exc_info=True,
                        extra={"token": record.id})

    async def authorize(self, bearer: str | None, scope: Scope,
                        queue: str | None = None) -> Principal:
        """The caller, allowed ``scope`` (in ``queue``); else 401 / 403 saying why."""
        if scope is Scope.ADMIN and not self.policy.admin_token and \
                parse_token((bearer or "").strip()) is None:
            raise _admin_disabled()  # (nothing else could be an admin credential)
        who = await self.principal(bearer)
        open_mode = self.policy.mode == "open" and scope is not Scope.ADMIN
        if who is None:
            if open_mode:
                return anonymous(OPEN_SCOPES)
            if scope is Scope.READ and not self.policy.reads_required:
                return anonymous(frozenset({Scope.READ}))
            raise Unauthorized(f"{_what(scope)} needs a token with the scope {scope.value!r}; "
                               "send 'Authorization: Bearer <token>' (SQ_TOKEN for the CLI)")
        if open_mode:
            who = Principal(actor=who.actor, scopes=who.scopes | OPEN_SCOPES,
                            token_id=who.token_id)
        why = who.missing(scope, queue)
        if why is not None:
            raise MissingScope(why) if scope not in granted(who.scopes) else Forbidden(why)
        return who

    # -- tokens (the admin API) ------------------------------------------------------
    async def create_token(self, *, label: str, scopes: Collection[Scope],
                           queues: Collection[str] | None, expires_in_s: int | None,
                           known_queues: Collection[str], actor: str,
                           ) -> tuple[TokenRecord, str]:
        """A new token and its secret (returned only here). Audited."""
        if not LABEL.fullmatch(label) or label == ANONYMOUS:
            raise ValidationError(f"label {label!r} is not usable; use {LABEL_RULE} "
                                  f"(not {ANONYMOUS!r}), e.g. ci-bot or alice")
        if not scopes:
            raise ValidationError("a token needs at least one scope of "
                                  f"{', '.join(s.value for s in Scope)}")
        unknown = sorted(set(queues or ()) - set(known_queues))
        if unknown:
            raise ValidationError(f"queues {unknown} are not configured (configured: "
                                  f"{', '.join(sorted(known_queues)) or 'none'})")
        if queues is not None and not queues:
            raise ValidationError("queues: [] would allow nothing; leave it out (or null) "
                                  "for every queue, or name at least one")
        if queues is not None and Scope.ADMIN in scopes:
            raise ValidationError("the 'admin' scope is not per queue; create an admin "
                                  "token without queues")
        if expires_in_s is not None and not 0 < expires_in_s <= MAX_EXPIRY_S:
            raise ValidationError(f"expires_in_s must be 1..{MAX_EXPIRY_S} (ten years), or "
                                  "null for a token that never expires")
        now = self.clock()
        token_id, secret, token = new_token()
        record = TokenRecord(
            id=token_id, label=label, scopes=frozenset(scopes),
            queues=None if queues is None else frozenset(queues),
            secret_hash=await asyncio.to_thread(hash_secret, secret), created_at_ms=now,
            created_by=actor, expires_at_ms=now + expires_in_s * 1000 if expires_in_s else 0)
        async with self.db.write() as s:  # the token and its audit entry, or neither
            await repo.create(s, record)
            await audit_repo.append(s, at_ms=now, actor=actor, action="token.create",
                                    result={"id": token_id, "label": label,
                                            "scopes": sorted(x.value for x in scopes),
                                            "queues": sorted(queues) if queues else None})
        return record, token

    async def tokens(self, *, include_revoked: bool = False) -> list[TokenRecord]:
        async with self.db.read() as s:
            return await repo.list_all(s, include_revoked=include_revoked)

    async def revoke_token(self, token_id: str, *, actor: str,
                           reason: str) -> tuple[TokenRecord, bool]:
        """Revoke ``token_id``: ``(record, revoked_now)``; a second revoke is harmless
        (False); an unknown id is ``NotFound``. Audited when it revokes."""
        now = self.clock()
        async with self.db.write() as s:  # the revocation and its audit entry, or neither
            revoked = await repo.revoke(s, token_id, now_ms=now)
            record = await repo.get(s, token_id)
            if record is not None and revoked:
                await audit_repo.append(s, at_ms=now, actor=actor, action="token.revoke",
                                        reason=reason,
                                        result={"id": token_id, "label": record.label})
        if record is None:
            raise NotFound(f"token {token_id!r} does not exist; see GET /api/v1/admin/tokens")
        self._verified.pop(token_id, None)
        return record, revoked


def _admin_disabled() -> AdminDisabled:
    return AdminDisabled("the admin API is disabled; set SQ_ADMIN_TOKEN to a secret "
                         "(optionally 'label:secret') and restart to enable it, or send an "
                         "API token with the 'admin' scope")


def _what(scope: Scope) -> str:
    return {Scope.LAND: "landing", Scope.CANCEL: "cancelling", Scope.CANCEL_ANY: "cancelling",
            Scope.READ: "reading", Scope.ADMIN: "the admin API"}[scope]
