"""Why a request left the queue: the one typed vocabulary of removal reasons (pure).

The same words are used wherever a removal is told: the request pages (their finer
page kinds map onto these, ``app/views/trail.py``), outbound notifications
(``app/domain/notifications.py``) and the docs (``docs/notifications.md``).

| Reason | Produced today | When (the request's terminal status and ``last_error``) |
|---|---|---|
| ``build_failed`` | yes | ``error``: no speculation path could pass (every candidate build failed) |
| ``merge_conflict`` | yes | ``error``: the dry-run merge check found a conflict, or the merge failed |
| ``stale`` | yes | ``error``: a change's ref moved away from its pinned commit (or is gone), found when validating or landing |
| ``cancelled`` | yes | ``cancelled``: by its own cancel or with its batch (but for a push, below) |
| ``dependency_failed`` | yes | ``error``: a dependency the queue needs (repository, build system, GitHub) stayed unreachable past the retry window |
| ``dead_lettered`` | yes | ``error``: a stage exhausted its retries and its dead-letter reconciler ended the request |
| ``superseded`` | yes | ``error``: another live request already carries the change (the duplicate check); ``cancelled`` by a push to its pull request (``cancelled: superseded by a new push``) |
| ``no_ci_started`` | yes (GitHub checks) | ``error``: every path's last build ended ``errored`` because none of the queue's required checks appeared on its branch within ``checks_start_timeout_s`` (after the errored-build retries) |
| ``flake_suspected`` | no (flaky builds) | reserved: a failure the queue suspects is a flake |

An ``error`` none of these describes has no reason (``None``): the error text says what
happened. :func:`classify` never produces the reserved words.
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import re
from enum import StrEnum

from app.domain.outages import UNAVAILABLE_PREFIX


class RemovalReason(StrEnum):
    BUILD_FAILED = "build_failed"
    MERGE_CONFLICT = "merge_conflict"
    STALE = "stale"
    CANCELLED = "cancelled"
    DEPENDENCY_FAILED = "dependency_failed"
    DEAD_LETTERED = "dead_lettered"
    NO_CI_STARTED = "no_ci_started"
    FLAKE_SUSPECTED = "flake_suspected"
    SUPERSEDED = "superseded"


#: The reasons some stage produces today; the others are reserved for later features.
PRODUCED = frozenset(RemovalReason) - {RemovalReason.FLAKE_SUSPECTED}

#: Each reason in words (for notifications; the pages tell it with their evidence).
WORDS: dict[RemovalReason, str] = {
    RemovalReason.BUILD_FAILED: "its builds failed: no speculation path could pass",
    RemovalReason.MERGE_CONFLICT: "merge conflict: the change does not apply onto the "
                                  "target branch",
    RemovalReason.STALE: "stale: a change's branch moved away from the commit it pinned",
    RemovalReason.CANCELLED: "cancelled",
    RemovalReason.DEPENDENCY_FAILED: "a dependency stayed unreachable for longer than the "
                                     "queue's retry window",
    RemovalReason.DEAD_LETTERED: "a stage kept failing and was dead-lettered; see the "
                                 "dead letters on /admin",
    RemovalReason.NO_CI_STARTED: "no CI run started for it: none of the required checks "
                                 "appeared on the queue's branch",
    RemovalReason.FLAKE_SUSPECTED: "its build failure looks like a flake",
    RemovalReason.SUPERSEDED: "another live request already carries this change",
}

# The texts the pipeline writes into ``last_error`` (one place for every reader).
#: ``app/speculation/core.py`` fails a head with this reason.
NO_PATH_PASSED = "no speculation path could pass; every candidate build failed"
#: ``app/controllers/dlq/reconcilers.py`` ``failure_text``.
DEAD_LETTER = re.compile(r"^dead-lettered from (?P<topic>[\w.-]+) after (?P<n>\d+) attempts?: "
                         r"(?P<error>.*)$", re.S)
#: the cancel reason of a pull request pushed to while queued (``github_events``); the
#: cancel stage writes ``last_error`` = ``cancelled: <reason>``
SUPERSEDED_BY_PUSH = "superseded by a new push"
#: a build runner's detail when no required check appeared (``github_checks``); the
#: speculate stage puts it first in a failure when it ended every path
#: (``no_ci_started: none of the required checks (...) appeared on ...; <NO_PATH_PASSED>``)
NO_CI_STARTED_PREFIX = "no_ci_started:"
#: ``app/controllers/validate.py``'s duplicate check.
DUPLICATE = re.compile(r"^duplicate of in-flight request (?P<sqid>\S+?):")
#: ``mergeconflictsignal`` / ``mergesignal``.
MERGE_CONFLICT_PREFIX = "merge conflict:"
MERGE_FAILED_PREFIX = "merge failed:"
#: the git provider, tree builder and merger: ``stale: ref <ref> now points at ...``.
STALE_MARK = re.compile(r"(?:^|: )stale: ")


def classify(status: str, last_error: str) -> RemovalReason | None:
    """The reason a request with terminal ``status`` left the queue; None when it
    landed (or is not terminal), or for an ``error`` the vocabulary has no word for."""
    if status == "cancelled":
        return RemovalReason.SUPERSEDED if last_error == f"cancelled: {SUPERSEDED_BY_PUSH}" \
            else RemovalReason.CANCELLED
    if status != "error":
        return None
    err = last_error or ""
    if err.startswith(UNAVAILABLE_PREFIX):
        return RemovalReason.DEPENDENCY_FAILED
    if DEAD_LETTER.match(err):
        return RemovalReason.DEAD_LETTERED
    if STALE_MARK.search(err):
        return RemovalReason.STALE
    if err.startswith((MERGE_CONFLICT_PREFIX, MERGE_FAILED_PREFIX)):
        return RemovalReason.MERGE_CONFLICT
    if err.startswith(NO_CI_STARTED_PREFIX):
        return RemovalReason.NO_CI_STARTED
    if NO_PATH_PASSED in err:
        return RemovalReason.BUILD_FAILED
    if DUPLICATE.match(err):
        return RemovalReason.SUPERSEDED
    return None


#: The pages' finer kinds (``app/views/trail.py``) in this vocabulary.
OF_PAGE_KIND: dict[str, RemovalReason | None] = {
    "build_failed": RemovalReason.BUILD_FAILED,
    "no_ci_started": RemovalReason.NO_CI_STARTED,
    "merge_conflict": RemovalReason.MERGE_CONFLICT,
    "cancelled": RemovalReason.CANCELLED,
    "dead_lettered": RemovalReason.DEAD_LETTERED,
    "dependency_unavailable": RemovalReason.DEPENDENCY_FAILED,
    "duplicate": RemovalReason.SUPERSEDED,
    "rejected": None,  # stale when its text says so (``classify``)
    "error": None,
}
