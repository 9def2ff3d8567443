"""Who may do what: API token scopes, the caller (``Principal``), the token format and
how a token's secret is stored (pure; the gateway's ``app/gateway/access.py`` reads the
tokens and applies it).

**Scopes** and what each one also grants:

| Scope | Grants | Also grants |
|---|---|---|
| ``read`` | status, lists, history, views, events (when ``SQ_AUTH_READS=required``) | - |
| ``land`` | submit land requests | ``read`` |
| ``cancel`` | cancel requests this actor submitted | ``read`` |
| ``cancel:any`` | cancel anyone's request | ``cancel``, ``read`` |
| ``admin`` | the admin API (``/api/v1/admin``: dead letters, consumers, tokens) | every scope |

A token may be limited to named queues; then every scope holds only in those queues and
the admin API (which is not per queue) refuses it.

**Tokens** read ``sq_<id>_<secret>``: ``id`` is 12 hex digits (public: listed,
revoked and logged by it), ``secret`` 43 URL-safe characters (256 random bits). Only
``scrypt(secret)`` is stored (per-token salt, n=2^14, r=8, p=1), so the database and
its dumps never hold a usable token.

**The actor** is who the history records: the token's label, ``SQ_ADMIN_TOKEN``'s label
(``label:secret``, else ``admin``), or ``anonymous`` under ``SQ_AUTH=open`` without a
token. "Own" requests are those whose ``submitted_by`` is the caller's actor.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    READ = "read"
    LAND = "land"
    CANCEL = "cancel"
    CANCEL_ANY = "cancel:any"
    ADMIN = "admin"


_IMPLIES: dict[Scope, frozenset[Scope]] = {
    Scope.READ: frozenset({Scope.READ}),
    Scope.LAND: frozenset({Scope.LAND, Scope.READ}),
    Scope.CANCEL: frozenset({Scope.CANCEL, Scope.READ}),
    Scope.CANCEL_ANY: frozenset({Scope.CANCEL_ANY, Scope.CANCEL, Scope.READ}),
    Scope.ADMIN: frozenset(Scope),
}

ANONYMOUS = "anonymous"
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}$")
LABEL_RULE = "1-100 of letters, digits and . _ @ + - (starting with a letter or digit)"


def granted(scopes: frozenset[Scope]) -> frozenset[Scope]:
    """Every scope ``scopes`` grant, implied ones included."""
    out: set[Scope] = set()
    for scope in scopes:
        out |= _IMPLIES[scope]
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one HTTP request. ``token_id`` is "" for the bootstrap admin token
    and for an anonymous caller; ``queues`` None = every queue."""

    actor: str
    scopes: frozenset[Scope]
    queues: frozenset[str] | None = None
    token_id: str = ""
    anonymous: bool = False

    def missing(self, scope: Scope, queue: str | None = None) -> str | None:
        """Why this caller may not use ``scope`` (in ``queue``), or None if it may."""
        if scope not in granted(self.scopes):
            have = ", ".join(sorted(s.value for s in self.scopes)) or "none"
            return (f"this token lacks the scope {scope.value!r} (it has: {have}); ask an "
                    f"admin for a token with {scope.value!r}")
        if self.queues is not None:
            if scope is Scope.ADMIN:
                return (f"a token limited to queues ({', '.join(sorted(self.queues))}) "
                        "cannot use the admin API; it needs an admin token for every queue")
            if queue is not None and queue not in self.queues:
                return (f"this token may act only on the queues "
                        f"{', '.join(sorted(self.queues))}, not {queue!r}")
        return None


def hotfix_refusal(principal: Principal, allowed: tuple[str, ...], queue: str) -> str | None:
    """Why ``principal`` may not land with priority ``hotfix`` in ``queue``, or None: it
    may with the ``admin`` scope (``SQ_ADMIN_TOKEN`` or an admin token for every queue)
    or when its actor is on the queue's ``hotfix_allowed`` list."""
    if Scope.ADMIN in principal.scopes and principal.queues is None:
        return None
    if principal.actor in allowed and not principal.anonymous:
        return None
    who = "an anonymous caller" if principal.anonymous else repr(principal.actor)
    listed = ", ".join(allowed) if allowed else "nobody"
    return (f"priority 'hotfix' in queue {queue!r} needs the admin token or an actor on "
            f"the queue's hotfix_allowed list (now: {listed}); {who} is not; land with "
            "priority 'high' or 'normal', or ask a queue owner")


OPEN_SCOPES = frozenset({Scope.LAND, Scope.CANCEL_ANY, Scope.READ})  # SQ_AUTH=open


@dataclass(frozen=True, slots=True)
class TokenRecord:
    id: str
    label: str
    scopes: frozenset[Scope]
    queues: frozenset[str] | None
    secret_hash: str
    created_at_ms: int
    created_by: str = ""
    expires_at_ms: int = 0  # 0 = never
    last_used_at_ms: int = 0  # 0 = never used
    revoked_at_ms: int = 0  # 0 = not revoked

    def usable_at(self, now_ms: int) -> str | None:
        """Why the token cannot be used at ``now_ms``, or None."""
        if self.revoked_at_ms:
            return "this token was revoked"
        if self.expires_at_ms and now_ms >= self.expires_at_ms:
            return "this token has expired"
        return None


def anonymous(scopes: frozenset[Scope]) -> Principal:
    return Principal(actor=ANONYMOUS, scopes=scopes, anonymous=True)


# -- the token and its stored form ---------------------------------------------------

PREFIX = "sq_"
_TOKEN = re.compile(r"^sq_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1


def new_token() -> tuple[str, str, str]:
    """A fresh ``(token_id, secret, token)``."""
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return token_id, secret, f"{PREFIX}{token_id}_{secret}"


def parse_token(token: str) -> tuple[str, str] | None:
    """``(token_id, secret)`` of a token in our format, else None."""
    found = _TOKEN.fullmatch(token)
    return (found.group(1), found.group(2)) if found else None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _scrypt(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(secret.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=32,
                          maxmem=64 * 1024 * 1024)


def hash_secret(secret: str) -> str:
    """The stored form: ``scrypt$n$r$p$<salt>$<digest>`` (slow on purpose: ~60 ms)."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(secret, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify_secret(secret: str, stored: str) -> bool:
    """Whether ``secret`` hashes to ``stored`` (constant-time compare); a malformed
    stored value never matches."""
    try:
        algo, n, r, p, salt, digest = stored.split("$")
        if algo != "scrypt":
            return False
        pad = "=" * (-len(salt) % 4)
        got = _scrypt(secret, base64.urlsafe_b64decode(salt + pad), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(_b64(got), digest)


def fingerprint(secret: str) -> bytes:
    """A fast digest of a secret, for an in-memory cache of verified secrets only (it is
    never stored)."""
    return hashlib.sha256(secret.encode("utf-8")).digest()
