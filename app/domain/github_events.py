"""What a GitHub webhook event asks of a queue (pure; ``app/gateway/github.py`` acts).

| Event | Asks |
|---|---|
| ``pull_request`` ``labeled`` with the queue's ``land_label``, open, on the queue's target branch | land the head (whoever may label may land: GitHub lets only triage and above label) |
| ``pull_request`` ``unlabeled`` (that label) | cancel: "the <label> label was removed by @<login>" |
| ``pull_request`` ``synchronize`` | cancel the request of the *previous* head (``before``): "superseded by a new push" |
| ``pull_request`` ``closed`` | cancel: "pull request #<n> was closed" (or "... merged outside the queue") |
| ``issue_comment`` ``created`` on a pull request, first line ``/submitqueue land`` | land the current head, if the commenter has write access (checked through the API) |
| ``issue_comment`` ``created``, first line ``/submitqueue cancel`` | cancel, if the commenter has write access |
| ``check_run``, ``check_suite``, ``status`` | ``checks_changed``: the branches whose head's checks changed (a ``sq/`` branch's build asks GitHub at once; ``app/extensions/github/runner.py``) |
| ``ping`` | nothing (GitHub's hello when a webhook is made) |
| anything else | nothing |

A payload that lacks what its event needs is an ``InvalidPayload``: the endpoint
answers 400 naming the missing field.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from app.domain.errors import ValidationError
from app.domain.removals import SUPERSEDED_BY_PUSH

LAND_COMMAND = "/submitqueue land"
CANCEL_COMMAND = "/submitqueue cancel"
SUPERSEDED = SUPERSEDED_BY_PUSH  # its removal reason is ``superseded`` (removals.py)


class InvalidPayload(ValidationError):
    """A webhook body that is not the event its ``X-GitHub-Event`` says."""


@dataclass(frozen=True, slots=True)
class Intent:
    action: Literal["land", "cancel"]
    repository: str  # owner/repo
    number: int
    sender: str
    head_sha: str = ""  # "" = read the pull request's current head
    base_ref: str = ""  # "" = read it with the head
    reason: str = ""  # for a cancel
    needs_write: bool = False  # a comment command: the sender must have write access
    via: str = ""  # a land's origin, kept with the request: "label" or "comment"


def _get(payload: Any, *path: str) -> Any:
    value = payload
    for key in path:
        if not isinstance(value, dict) or key not in value:
            raise InvalidPayload(f"the webhook payload has no {'.'.join(path)}; is it the "
                                 "event its X-GitHub-Event header names?")
        value = value[key]
    return value


def _str(payload: Any, *path: str) -> str:
    value = _get(payload, *path)
    if not isinstance(value, str):
        raise InvalidPayload(f"the webhook payload's {'.'.join(path)} is not a string")
    return value


def _int(payload: Any, *path: str) -> int:
    value = _get(payload, *path)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidPayload(f"the webhook payload's {'.'.join(path)} is not a number")
    return value


def command(body: str | None) -> str | None:
    """``land`` / ``cancel`` when the comment's first line is that command, else None."""
    first = (body or "").strip().splitlines()[0].strip().lower() if (body or "").strip() else ""
    words = first.split()
    if words[:2] == LAND_COMMAND.split():
        return "land"
    if words[:2] == CANCEL_COMMAND.split():
        return "cancel"
    return None


def intent(event: str, payload: Any, *, land_label: str) -> Intent | None:
    """What ``event`` asks (module docstring), or None when it asks nothing."""
    if event == "pull_request":
        return _pull_request(payload, land_label)
    if event == "issue_comment":
        return _comment(payload)
    return None


def _pull_request(payload: Any, land_label: str) -> Intent | None:
    action = _str(payload, "action")
    if action not in ("labeled", "unlabeled", "synchronize", "closed"):
        return None
    repo = _str(payload, "repository", "full_name")
    number = _int(payload, "pull_request", "number")
    sender = _str(payload, "sender", "login")
    head = _str(payload, "pull_request", "head", "sha")
    base = _str(payload, "pull_request", "base", "ref")
    if action in ("labeled", "unlabeled"):
        if _str(payload, "label", "name") != land_label:
            return None
        if action == "unlabeled":
            return Intent("cancel", repo, number, sender, head_sha=head,
                          reason=f"the {land_label} label was removed by @{sender}")
        if _str(payload, "pull_request", "state") != "open":
            return None
        return Intent("land", repo, number, sender, head_sha=head, base_ref=base, via="label")
    if action == "synchronize":
        return Intent("cancel", repo, number, sender, head_sha=_str(payload, "before"),
                      reason=SUPERSEDED)
    merged = _get(payload, "pull_request").get("merged") is True
    how = "merged outside the queue" if merged else "closed"
    return Intent("cancel", repo, number, sender, head_sha=head,
                  reason=f"pull request #{number} was {how} by @{sender}")


def _comment(payload: Any) -> Intent | None:
    if _str(payload, "action") != "created":
        return None
    issue = _get(payload, "issue")
    if not isinstance(issue, dict) or not issue.get("pull_request"):
        return None  # a comment on an issue, not a pull request
    what = command(_get(payload, "comment").get("body") if isinstance(
        _get(payload, "comment"), dict) else None)
    if what is None:
        return None
    sender = _str(payload, "sender", "login")
    repo = _str(payload, "repository", "full_name")
    number = _int(payload, "issue", "number")
    if what == "land":
        return Intent("land", repo, number, sender, needs_write=True, via="comment")
    return Intent("cancel", repo, number, sender, needs_write=True,
                  reason=f"cancelled by @{sender} with {CANCEL_COMMAND}")


CHECK_EVENTS = frozenset({"check_run", "check_suite", "status"})


@dataclass(frozen=True, slots=True)
class ChecksChanged:
    """A check-run, check suite or commit status changed on ``sha``, the head of
    ``branches`` (none when GitHub names no branch, e.g. a commit no branch points at)."""

    repository: str
    sha: str
    branches: tuple[str, ...]


def checks_changed(event: str, payload: Any) -> ChecksChanged | None:
    """What a ``check_run`` / ``check_suite`` / ``status`` event says changed (None for
    another event)."""
    if event not in CHECK_EVENTS:
        return None
    repo = _str(payload, "repository", "full_name")
    if event == "status":
        branches = _get(payload, "branches")
        if not isinstance(branches, list):
            raise InvalidPayload("the webhook payload's branches is not a list")
        names = tuple(b["name"] for b in branches
                      if isinstance(b, dict) and isinstance(b.get("name"), str))
        return ChecksChanged(repo, _str(payload, "sha"), names)
    suite = _get(payload, "check_run", "check_suite") if event == "check_run" \
        else _get(payload, "check_suite")
    if not isinstance(suite, dict):
        raise InvalidPayload(f"the webhook payload's {event} check suite is not an object")
    head = suite.get("head_branch")
    sha = _str(payload, "check_run", "head_sha") if event == "check_run" \
        else _str(payload, "check_suite", "head_sha")
    return ChecksChanged(repo, sha, (head,) if isinstance(head, str) and head else ())
