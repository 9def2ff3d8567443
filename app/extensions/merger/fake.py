"""Mergers that touch no repository: outcomes come from the change URIs.

``FakeMerger`` reads tokens (``sq-fake=<token>``) from every change of every step:

| Token | ``check`` (dry run at validation) | ``merge`` (at landing) |
|---|---|---|
| ``merge-conflict`` | fails: ``merge conflict in <files>`` | fails likewise |
| ``merge-conflict-late`` | passes | fails (a conflict after a passed build) |
| ``merge-error`` | raises ``FakeConnectionError`` | raises ``FakeConnectionError`` |
| ``merge-error-late`` | passes | raises ``FakeConnectionError`` |

``FakeConnectionError`` (a ``ConnectionError`` marked ``infrastructure = False``): the
queue retries it within its attempt budget, then dead-letters (the outage guard leaves it be).
The conflicting paths are the change's ``sq-files`` or its default file (see
``app.extensions.changes.fake.default_paths``).

A successful outcome's ``outputs`` hold one deterministic 40-hex "commit" per change,
in step order: the SHA-1 of the change URI (``landed_sha``); ``commits`` the same per
step (request). Both operations are
stateless, hence trivially idempotent. ``NoopMerger`` always succeeds likewise.
"""

from __future__ import annotations

import hashlib

from app.extensions.base import FakeConnectionError, MergeOutcome, MergeSpec
from app.extensions.changes.fake import default_paths, parse_or_reject

MERGE_CONFLICT = "merge-conflict"
MERGE_CONFLICT_LATE = "merge-conflict-late"
MERGE_ERROR = "merge-error"
MERGE_ERROR_LATE = "merge-error-late"


def landed_sha(uri: str) -> str:
    """The fake commit a change lands as: SHA-1 of its URI."""
    return hashlib.sha1(uri.encode("utf-8")).hexdigest()


def _uris(spec: MergeSpec) -> list[str]:
    return [uri for step in spec.steps for uri in step.change_uris]


def _success(spec: MergeSpec) -> MergeOutcome:
    return MergeOutcome(
        succeeded=True, outputs=tuple(landed_sha(u) for u in _uris(spec)),
        commits={step.step_id: tuple(landed_sha(u) for u in step.change_uris)
                 for step in spec.steps},
    )


class FakeMerger:
    async def check(self, spec: MergeSpec) -> MergeOutcome:
        return self._run(spec, late=False)

    async def merge(self, spec: MergeSpec) -> MergeOutcome:
        return self._run(spec, late=True)

    def _run(self, spec: MergeSpec, *, late: bool) -> MergeOutcome:
        errors = {MERGE_ERROR, MERGE_ERROR_LATE} if late else {MERGE_ERROR}
        conflicts = {MERGE_CONFLICT, MERGE_CONFLICT_LATE} if late else {MERGE_CONFLICT}
        changes = [parse_or_reject(u) for u in _uris(spec)]
        for change in changes:
            if change.fake_tokens & errors:
                raise FakeConnectionError(
                    f"fake merge service unavailable while merging {change.raw} ({spec.id})"
                )
        conflicting = [c for c in changes if c.fake_tokens & conflicts]
        if not conflicting:
            return _success(spec)
        paths = tuple(dict.fromkeys(p for c in conflicting for p in default_paths(c)))
        return MergeOutcome(
            succeeded=False,
            reason=f"merge conflict in {', '.join(paths)} "
            f"(change {', '.join(c.raw for c in conflicting)})",
            conflicting_paths=paths,
        )


class NoopMerger:
    """Always succeeds; ignores every token."""

    async def check(self, spec: MergeSpec) -> MergeOutcome:
        return _success(spec)

    async def merge(self, spec: MergeSpec) -> MergeOutcome:
        return _success(spec)
