"""What a webhook event asks (``app/domain/github_events.py``), read from GitHub's own
example payloads (``@octokit/webhooks-examples``; skipped with the reason when they are
not cached, see ``tests/support/webhook_examples.py``) for every event we consume —
``pull_request``, ``issue_comment``, ``ping``, ``check_run``, ``check_suite``,
``status`` — and from hand-made edge cases.

The rule reads only the fields it needs: githubkit's generated webhook models reject 18
of the 29 ``pull_request`` examples and 1 of the 9 ``issue_comment`` ones (fields the
schema made required after those payloads were recorded), so the endpoint does not
parse deliveries with them (docs/github.md)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.domain.github_events import (
    SUPERSEDED,
    ChecksChanged,
    Intent,
    InvalidPayload,
    checks_changed,
    command,
    intent,
)
from tests.support.webhook_examples import examples

LABEL = "merge-queue"


def _with_label(payload: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(payload)
    out["label"] = {**(out.get("label") or {}), "name": name}
    return out


def test_every_pull_request_example_is_read() -> None:
    seen: set[str] = set()
    for payload in examples("pull_request"):
        action = payload["action"]
        seen.add(action)
        pr = payload["pull_request"]
        got = intent("pull_request", payload, land_label=LABEL)
        if action == "synchronize":
            assert got == Intent("cancel", payload["repository"]["full_name"], pr["number"],
                                 payload["sender"]["login"], head_sha=payload["before"],
                                 reason=SUPERSEDED)
        elif action == "closed":
            assert got is not None and got.action == "cancel"
            assert got.reason.startswith(f"pull request #{pr['number']} was ")
            assert ("merged outside the queue" in got.reason) == bool(pr.get("merged"))
        elif action in ("labeled", "unlabeled"):
            assert got is None  # the examples' labels are not the queue's
            ours = intent("pull_request", _with_label(payload, LABEL), land_label=LABEL)
            if action == "unlabeled":
                assert ours is not None and ours.action == "cancel"
                assert ours.reason == (f"the {LABEL} label was removed by "
                                       f"@{payload['sender']['login']}")
            elif pr["state"] == "open":
                assert ours == Intent("land", payload["repository"]["full_name"], pr["number"],
                                      payload["sender"]["login"], head_sha=pr["head"]["sha"],
                                      base_ref=pr["base"]["ref"], via="label")
            else:
                assert ours is None  # a label on a closed pull request lands nothing
        else:
            assert got is None, action
    assert {"labeled", "unlabeled", "synchronize", "closed", "opened"} <= seen


def test_every_issue_comment_example_is_read() -> None:
    """The package's comments are all on issues; GitHub marks a pull request's comment
    with ``issue.pull_request``, added here to make each one a pull request's."""
    created = 0
    for payload in examples("issue_comment"):
        assert intent("issue_comment", payload, land_label=LABEL) is None  # no command
        landing = copy.deepcopy(payload)
        landing["comment"]["body"] = "/submitqueue land"
        assert intent("issue_comment", landing, land_label=LABEL) is None  # on an issue
        number = payload["issue"]["number"]
        landing["issue"]["pull_request"] = {
            "url": payload["issue"]["url"].replace("/issues/", "/pulls/")}
        got = intent("issue_comment", landing, land_label=LABEL)
        if payload["action"] != "created":
            assert got is None  # an edited or deleted comment commands nothing
            continue
        created += 1
        assert got == Intent("land", payload["repository"]["full_name"], number,
                             payload["sender"]["login"], needs_write=True, via="comment")
        landing["comment"]["body"] = "/submitqueue cancel"
        cancel = intent("issue_comment", landing, land_label=LABEL)
        assert cancel is not None and (cancel.action, cancel.needs_write) == ("cancel", True)
    assert created >= 1


def test_ping_examples_ask_nothing() -> None:
    for payload in examples("ping"):
        assert intent("ping", payload, land_label=LABEL) is None


@pytest.mark.parametrize(("body", "want"), [
    ("/submitqueue land", "land"), ("  /SubmitQueue   LAND  \nthanks", "land"),
    ("/submitqueue cancel please", "cancel"), ("/submitqueue", None), ("", None),
    (None, None), ("please /submitqueue land", None), ("/submitqueue landed", None),
])
def test_commands_are_the_first_line(body: str | None, want: str | None) -> None:
    assert command(body) == want


@pytest.mark.parametrize(("payload", "missing"), [
    ({"action": "labeled"}, "repository.full_name"),
    ({"action": "closed", "repository": {"full_name": "a/b"},
      "pull_request": {"number": "7"}}, "pull_request.number is not a number"),
    ({"action": "synchronize", "repository": {"full_name": "a/b"}, "sender": {"login": "x"},
      "pull_request": {"number": 7, "head": {"sha": "h"}, "base": {"ref": "main"}}}, "before"),
    ([], "action"),
])
def test_a_payload_missing_what_its_event_needs_is_invalid(payload: Any, missing: str) -> None:
    with pytest.raises(InvalidPayload, match=missing):
        intent("pull_request", payload, land_label=LABEL)


def test_comments_on_issues_and_edits_ask_nothing() -> None:
    base = {"action": "created", "issue": {"number": 3}, "comment": {"body": "/submitqueue land"},
            "repository": {"full_name": "a/b"}, "sender": {"login": "x"}}
    assert intent("issue_comment", base, land_label=LABEL) is None
    edited = {**base, "action": "edited", "issue": {"number": 3, "pull_request": {"url": "u"}}}
    assert intent("issue_comment", edited, land_label=LABEL) is None
    assert intent("push", {"ref": "refs/heads/main"}, land_label=LABEL) is None


def test_every_check_example_names_its_commit_and_branches() -> None:
    """Each check_run / check_suite / status example: the repository, the commit and the
    branches whose checks changed (a check suite's head branch; a status's branches)."""
    for event in ("check_run", "check_suite", "status"):
        payloads = examples(event)
        assert payloads, event
        for payload in payloads:
            got = checks_changed(event, payload)
            assert got is not None and got.repository == payload["repository"]["full_name"]
            if event == "status":
                assert got.sha == payload["sha"]
                assert got.branches == tuple(b["name"] for b in payload["branches"])
            else:
                suite = payload["check_suite"] if event == "check_suite" else \
                    payload["check_run"]["check_suite"]
                assert got.sha == suite["head_sha"]
                assert got.branches == ((suite["head_branch"],) if suite["head_branch"]
                                        else ())
            assert intent(event, payload, land_label=LABEL) is None  # nothing to land


def test_a_check_on_no_branch_and_other_events() -> None:
    run = {"repository": {"full_name": "a/b"},
           "check_run": {"head_sha": "c" * 40, "check_suite": {"head_branch": None}}}
    assert checks_changed("check_run", run) == ChecksChanged("a/b", "c" * 40, ())
    assert checks_changed("pull_request", run) is None
    with pytest.raises(InvalidPayload, match="branches is not a list"):
        checks_changed("status", {"repository": {"full_name": "a/b"}, "sha": "s",
                                  "branches": "main"})
    with pytest.raises(InvalidPayload, match="check_suite"):
        checks_changed("check_suite", {"repository": {"full_name": "a/b"}})
