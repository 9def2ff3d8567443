"""Change-URI grammar: validated in canonical form, never normalised.

| Scheme | Form |
|---|---|
| GitHub | ``github://{host[:port]}/{org...}/{repo}/pull/{n}/{head_sha}`` |
| Phabricator | ``phab://{host[:port]}/D{revision}/{diff}`` |
| git | ``git://{host[:port]}/{repo...}/{ref}/{sha}``; ``ref`` is fully qualified |
|  | (``refs/...``) and percent-encoded as one segment |

Canonical: lowercase host, SHA as 40 lowercase hex, positive numbers without a
leading zero, no empty segments. An optional query carries test/demo markers
(``sq-fake``, ``sq-files``, ``sq-build-ms``, ``sq-title``, ``sq-author``) that only the
fake extensions read.
URIs are compared as opaque strings, except for *change identity*.

Change identity (``ChangeURI.identity``) says when two URIs name the same change, so a
queue lands each change at most once (the gateway's claim key):

| Scheme | Identity | So |
|---|---|---|
| git | ``git://{host}/{repo}@{sha}`` | the same commit pushed under two branch names is one change; two commits of one branch are two |
| GitHub | ``github://{host}/{org...}/{repo}@{sha}`` | the head commit is the change, whichever pull request carries it |
| Phabricator | ``phab://{host}/D{revision}/{diff}`` | each diff of a revision is its own change |

Query markers never count (they steer fakes; they are not part of what lands), so a
URI resubmitted with more, fewer or reordered markers is the same change. The host
and SHA are canonical (lowercase) already, so no further normalisation is needed.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

from app.domain.errors import ValidationError

MAX_URI_BYTES = 1024
MARKER_KEYS = frozenset({"sq-fake", "sq-files", "sq-build-ms", "sq-title", "sq-author"})

_HOST = r"(?P<host>[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?::[0-9]{1,5})?)"
_SEG = r"[A-Za-z0-9._~%+-]+"
_SHA = r"(?P<sha>[0-9a-f]{40})"
_POS = r"[1-9][0-9]*"
_PATTERNS = {
    "github": re.compile(
        rf"^github://{_HOST}/(?P<repo>{_SEG}(?:/{_SEG})+)/pull/(?P<n>{_POS})/{_SHA}$"
    ),
    "phab": re.compile(rf"^phab://{_HOST}/D(?P<rev>{_POS})/(?P<diff>{_POS})$"),
    "git": re.compile(
        rf"^git://{_HOST}/(?P<repo>{_SEG}(?:/{_SEG})*)/(?P<ref>refs%2[Ff]{_SEG})/{_SHA}$"
    ),
}
_EXAMPLE = "git://git.example.com/team/repo/refs%2Fheads%2Fmy-branch/<40 hex sha>"


@dataclass(frozen=True, slots=True)
class ChangeURI:
    raw: str
    scheme: str
    host: str
    repo: str
    ref: str | None
    sha: str | None
    markers: dict[str, str]

    @property
    def identity(self) -> str:
        """The change this URI names (see the module docstring): the claim key."""
        if self.sha is not None:
            return f"{self.scheme}://{self.host}/{self.repo}@{self.sha}"
        return self.raw.partition("?")[0]

    @property
    def fake_tokens(self) -> set[str]:
        return {t for t in self.markers.get("sq-fake", "").split(",") if t}

    @property
    def files(self) -> list[str]:
        return [f for f in self.markers.get("sq-files", "").split(",") if f]


def parse_change_uri(uri: str) -> ChangeURI:
    """Parse and validate one change URI; raises ``ValidationError`` saying what is wrong."""
    if not isinstance(uri, str) or not uri:
        raise ValidationError("a change URI must be a non-empty string")
    if len(uri.encode("utf-8")) > MAX_URI_BYTES:
        raise ValidationError(f"change URI is longer than {MAX_URI_BYTES} bytes")
    base, _, query = uri.partition("?")
    scheme = base.split("://", 1)[0] if "://" in base else ""
    pattern = _PATTERNS.get(scheme)
    if pattern is None:
        raise ValidationError(
            f"change URI {uri!r} has an unknown scheme; use github://, phab:// or git:// "
            f"(e.g. {_EXAMPLE})"
        )
    m = pattern.match(base)
    if m is None:
        raise ValidationError(f"change URI {uri!r} is not in canonical {scheme}:// form; "
                              f"{_HINTS[scheme]}")
    markers = _parse_markers(uri, query) if query or uri.endswith("?") else {}
    groups = m.groupdict()
    ref = unquote(groups["ref"]) if groups.get("ref") else None
    repo = groups.get("repo") or ""
    return ChangeURI(raw=uri, scheme=scheme, host=groups["host"], repo=repo, ref=ref,
                     sha=groups.get("sha"), markers=markers)


_HINTS = {
    "github": "expected github://{host}/{org}/{repo}/pull/{number}/{40-hex head sha}",
    "phab": "expected phab://{host}/D{revision}/{diff} with positive numbers",
    "git": "expected git://{host}/{repo}/{percent-encoded full ref}/{40-hex sha}, "
    f"e.g. {_EXAMPLE}",
}


def _parse_markers(uri: str, query: str) -> dict[str, str]:
    if not query:
        raise ValidationError(f"change URI {uri!r} ends with an empty query")
    parsed = parse_qs(query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(parsed) - MARKER_KEYS)
    if unknown:
        raise ValidationError(
            f"change URI {uri!r} has unknown query keys {unknown}; only {sorted(MARKER_KEYS)} "
            "are allowed"
        )
    out = {k: ",".join(v) for k, v in parsed.items()}
    ms = out.get("sq-build-ms")
    if ms is not None and not ms.isdigit():
        raise ValidationError(f"sq-build-ms must be a whole number of milliseconds, got {ms!r}")
    return out


def validate_stack(uris: list[str], *, max_changes: int = 100) -> list[ChangeURI]:
    """Validate an ordered stack: non-empty, bounded, no duplicates, each URI valid."""
    if not uris:
        raise ValidationError("change_uris must list at least one change")
    if len(uris) > max_changes:
        raise ValidationError(f"a stack may hold at most {max_changes} changes, got {len(uris)}")
    seen: set[str] = set()
    for uri in uris:
        if uri in seen:
            raise ValidationError(f"change URI {uri!r} appears twice in the stack")
        seen.add(uri)
    return [parse_change_uri(u) for u in uris]


def stack_identities(changes: Sequence[ChangeURI]) -> list[str]:
    """The identity of each change of a parsed stack, in order; ``ValidationError`` when
    two URIs of the stack name the same change (same commit, or same URI but markers)."""
    seen: dict[str, str] = {}
    out: list[str] = []
    for change in changes:
        first = seen.setdefault(change.identity, change.raw)
        if first != change.raw:
            raise ValidationError(
                f"change URIs {first!r} and {change.raw!r} name the same change "
                f"({change.identity}); list it once"
            )
        out.append(change.identity)
    return out
