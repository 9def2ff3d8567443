"""A change provider that reads everything from the change URI (for tests and demos).

Author: the ``sq-author`` marker (``Name <email>`` or just a name), else ``Fake Author
<fake@example.com>``. Title: the ``sq-title`` marker, else one made up from the URI:
the branch of a git:// ref in words (``refs/heads/fix-login_bug`` -> ``Fix login bug``),
``Pull request #<n>`` (github://) or ``Revision D<rev>`` (phab://).

Changed files: the comma-separated ``sq-files`` marker, one added line each, e.g.
``...?sq-files=src/a.py,docs/b.md``. Without the marker each change gets one file of
its own, ``<repo>/<key>/change.txt`` (see ``default_paths``): the key is the first 12
characters of the SHA (github://, git://) or ``D<revision>`` (phab://, where ``<repo>``
is the host). The file sits in a directory of its own so that independent changes
conflict neither by file nor by directory; two URIs of the same commit (or diffs of
the same revision) share it, as they would share their real files.

Tokens (``sq-fake=<token>[,<token>...]``):

| Token | Effect |
|---|---|
| ``provider-error`` | ``get`` raises ``ChangeRejected`` naming the URI |

An unparseable URI is rejected with ``ChangeRejected`` too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from app.domain.change_uri import ChangeURI, parse_change_uri
from app.domain.entities import ChangeDetails, ChangedFile
from app.domain.errors import ValidationError
from app.extensions.base import ChangeRejected

FAKE_AUTHOR_NAME = "Fake Author"
FAKE_AUTHOR_EMAIL = "fake@example.com"
PROVIDER_ERROR = "provider-error"


def default_paths(change: ChangeURI) -> list[str]:
    """The files a change touches: its ``sq-files`` marker, else one file of its own."""
    if change.files:
        return change.files
    # github:// and git:// carry a SHA; phab://host/D<rev>/<diff> does not
    key = change.sha[:12] if change.sha else change.raw.partition("?")[0].split("/")[3]
    prefix = change.repo or change.host
    return [f"{prefix}/{key}/change.txt"]


_AUTHOR = re.compile(r"^\s*(?P<name>[^<>]*?)\s*(?:<(?P<email>[^<>]*)>)?\s*$")


def fake_title(change: ChangeURI) -> str:
    """The ``sq-title`` marker, else a title made up from the URI (module docstring)."""
    given = change.markers.get("sq-title", "").strip()
    if given:
        return given
    if change.ref is not None:
        words = re.sub(r"[-_./]+", " ", change.ref.removeprefix("refs/heads/")).strip()
        return words[:1].upper() + words[1:] if words else change.ref
    path = change.raw.partition("?")[0].split("/")
    if change.scheme == "github":
        return f"Pull request #{path[-2]}"
    return f"Revision {path[3]}" if len(path) > 3 else change.raw


def fake_author(change: ChangeURI) -> tuple[str, str]:
    """``(name, email)`` from the ``sq-author`` marker, else the fake author."""
    m = _AUTHOR.match(change.markers.get("sq-author", ""))
    name, email = (m["name"] or "", m["email"] or "") if m else ("", "")
    if not name and not email:
        return FAKE_AUTHOR_NAME, FAKE_AUTHOR_EMAIL
    if not email and "@" in name:  # just an address
        email = name
    return name or email, email


def parse_or_reject(uri: str) -> ChangeURI:
    try:
        return parse_change_uri(uri)
    except ValidationError as exc:
        raise ChangeRejected(f"cannot read change {uri!r}: {exc}") from None


class FakeChangeProvider:
    """Details derived from the URI alone; deterministic, no I/O."""

    async def get(self, queue: str, change_uris: Sequence[str]) -> list[ChangeDetails]:
        out: list[ChangeDetails] = []
        for uri in change_uris:
            change = parse_or_reject(uri)
            if PROVIDER_ERROR in change.fake_tokens:
                raise ChangeRejected(
                    f"change {uri!r} was rejected by the fake change provider "
                    f"(it carries sq-fake={PROVIDER_ERROR})"
                )
            name, email = fake_author(change)
            out.append(
                ChangeDetails(
                    uri=uri,
                    author_name=name,
                    author_email=email,
                    title=fake_title(change),
                    changed_files=tuple(
                        ChangedFile(path, lines_added=1) for path in default_paths(change)
                    ),
                )
            )
        return out
