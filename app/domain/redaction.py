"""Masking known secret values (the admin token, database passwords, webhook secrets)
in text that is stored and served to anyone, such as build logs.

A defence in depth only: the build sandbox keeps secrets out of a build's reach; this
catches a value that reached the output anyway (e.g. committed into the repository and
printed). Values shorter than :data:`MIN_SECRET_CHARS` are not masked (masking them
would garble every log and protects little); an encoded or split value is not found.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, unquote

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6


@dataclass(frozen=True, slots=True)
class SecretMask:
    """``mask(text)``: ``text`` with every known secret value replaced by ``[redacted]``."""

    values: tuple[str, ...] = ()

    @classmethod
    def of(cls, secrets: Iterable[str | None]) -> SecretMask:
        """From raw values; each is also masked percent-encoded and percent-decoded (as
        it appears in a URL), longest first so a value inside another is not left over."""
        found: set[str] = set()
        for secret in secrets:
            if not secret:
                continue
            found |= {secret, quote(secret, safe=""), unquote(secret)}
        kept = (v for v in found if len(v) >= MIN_SECRET_CHARS)
        return cls(tuple(sorted(kept, key=lambda v: (-len(v), v))))

    def __call__(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, REDACTED)
        return text
