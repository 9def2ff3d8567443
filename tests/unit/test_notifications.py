"""Notifications, the pure parts: the removal vocabulary, which log entries notify whom,
the bodies (json and Slack), the ``notify:`` configuration and its resolution."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.domain import notifications as n
from app.domain import removals as r
from app.domain.entities import RequestLog
from app.domain.errors import ValidationError
from app.domain.outages import unavailable_text
from app.domain.queue_config import parse_queues
from app.domain.states import LogType
from app.extensions.factory import build_extensions, webhook_secrets
from app.speculation import core
from app.speculation.scoring import build_scorer
from app.views import trail

# --- the vocabulary ----------------------------------------------------------------

ERRORS = [
    (unavailable_text("repository:demo", 1_900_000, "refused"), r.RemovalReason.DEPENDENCY_FAILED),
    ("dead-lettered from build after 10 attempts: ConnectionError: down",
     r.RemovalReason.DEAD_LETTERED),
    ("dead-lettered from start after 1 attempt: boom", r.RemovalReason.DEAD_LETTERED),
    ("stale: ref refs/heads/x now points at abc, not def", r.RemovalReason.STALE),
    ("merge failed: stale: ref refs/heads/x now points at abc, not def", r.RemovalReason.STALE),
    ("merge conflict: the changes do not apply (conflicting paths: a.py)",
     r.RemovalReason.MERGE_CONFLICT),
    ("merge failed: the merger gave no reason", r.RemovalReason.MERGE_CONFLICT),
    (f"batch demo/batch/1: {core.NO_PATH_PASSED}", r.RemovalReason.BUILD_FAILED),
    ("no_ci_started: none of the required checks (test) appeared on sq/q/p-1 within 600 s; "
     f"CI must run on pushes to the queue's branches; {core.NO_PATH_PASSED}; last builds: "
     "q-b1 (errored after 5 attempts)", r.RemovalReason.NO_CI_STARTED),
    ("duplicate of in-flight request demo/3: git://x", r.RemovalReason.SUPERSEDED),
    ("the provider could not read the change", None),
    ("", None),
]


@pytest.mark.parametrize(("error", "reason"), ERRORS)
def test_each_error_text_has_its_reason(error: str, reason: r.RemovalReason | None) -> None:
    assert r.classify("error", error) is reason


def test_cancelled_and_landed() -> None:
    assert r.classify("cancelled", "") is r.RemovalReason.CANCELLED
    assert r.classify("cancelled", "cancelled: not needed") is r.RemovalReason.CANCELLED
    # a push to a queued pull request (app/domain/github_events.py) supersedes it
    assert r.classify("cancelled", "cancelled: superseded by a new push") is \
        r.RemovalReason.SUPERSEDED
    assert r.classify("landed", "whatever") is None
    assert r.classify("speculating", "") is None


def test_the_vocabulary_is_the_issues_nine_words_one_reserved() -> None:
    assert [x.value for x in r.RemovalReason] == [
        "build_failed", "merge_conflict", "stale", "cancelled", "dependency_failed",
        "dead_lettered", "no_ci_started", "flake_suspected", "superseded"]
    assert set(r.RemovalReason) - r.PRODUCED == {r.RemovalReason.FLAKE_SUSPECTED}
    produced = {reason for _, reason in ERRORS if reason} | {r.RemovalReason.CANCELLED}
    assert produced == r.PRODUCED  # every produced word has a text that produces it
    assert set(r.WORDS) == set(r.RemovalReason)


def test_the_pages_kinds_map_onto_the_vocabulary() -> None:
    """Every kind the pages' trail can give (its docstring's table) has a mapping, and
    the trail and the vocabulary agree on the texts they both read."""
    kinds = {line.split("|")[1].strip().strip("`") for line in (trail.__doc__ or "").splitlines()
             if line.startswith("| ``")}
    assert kinds | {"dependency_unavailable"} == set(r.OF_PAGE_KIND)
    for error, reason in ERRORS:
        removal = trail.removal(status="error", last_error=error, history=[],
                                batch_id="demo/batch/1", assumptions={}, queue="demo")
        assert removal is not None
        assert removal.reason == (reason.value if reason else None), error
        # the page's finer kind never contradicts the word (a stale merge is shown as
        # a merge that failed, a stale change as an error: their word says stale)
        assert r.OF_PAGE_KIND[removal.kind] in (reason, None) or (
            reason is r.RemovalReason.STALE and removal.kind == "merge_conflict"), error
    cancelled = trail.removal(status="cancelled", last_error="", history=[], batch_id=None,
                              assumptions={}, queue="demo")
    assert cancelled is not None and cancelled.reason == "cancelled"


# --- which entries notify ------------------------------------------------------------

def entry(status: str, last_error: str = "", kind: LogType = LogType.STATUS,
          **md: Any) -> RequestLog:
    return RequestLog(queue="demo", request_id="demo/4", timestamp_ms=1_700_000_000_000,
                      type=kind, status=status if kind is LogType.STATUS else "",
                      event="" if kind is LogType.STATUS else status, request_version=5,
                      last_error=last_error, metadata=md, log_id=f"demo/4/{status}")


def test_events_of_log_entries() -> None:
    assert n.event_of(entry("landed")) == ("landed", None)
    assert n.event_of(entry("cancelled")) == ("removed", r.RemovalReason.CANCELLED)
    assert n.event_of(entry("error", "dead-lettered from build after 3 attempts: x")) == (
        "needs_operator", r.RemovalReason.DEAD_LETTERED)
    assert n.event_of(entry("error", "odd")) == ("removed", None)
    for status in ("accepted", "started", "speculating", "landing", "cancelling"):
        assert n.event_of(entry(status)) is None
    assert n.event_of(entry("building", kind=LogType.EVENT)) is None


def test_subscriptions() -> None:
    assert n.wanted({"landed"}, "landed") and not n.wanted({"landed"}, "removed")
    assert n.wanted({"removed"}, "needs_operator")  # a removal too
    assert n.wanted({"needs_operator"}, "needs_operator")
    assert not n.wanted({"needs_operator"}, "removed")


def test_the_message_and_its_stable_delivery_id() -> None:
    msg = n.message(entry("landed", batch_id="demo/batch/2", commits=["a" * 40]), "team")
    assert msg is not None
    assert msg.delivery_id == "demo/4/landed/team"
    assert (msg.id, msg.event, msg.reason, msg.batch_id, msg.commits) == (
        "demo/4", "landed", None, "demo/batch/2", ["a" * 40])
    assert n.message(entry("started"), "team") is None


# --- bodies -------------------------------------------------------------------------

def test_json_body_is_deterministic_and_complete() -> None:
    msg = n.message(entry("error", f"x: {core.NO_PATH_PASSED}", batch_id="demo/batch/2"), "t")
    assert msg is not None
    one = n.body(msg, fmt="json", public_url="https://sq.example.com/")
    assert one == n.body(msg, fmt="json", public_url="https://sq.example.com/")
    doc = json.loads(one)
    assert doc == {
        "schema": "submitqueue.notification/v1", "delivery_id": "demo/4/error/t",
        "event": "removed", "queue": "demo", "sqid": "demo/4", "status": "error",
        "reason": "build_failed", "reason_text": r.WORDS[r.RemovalReason.BUILD_FAILED],
        "needs_operator": False,
        "text": "demo/4 was removed from demo: its builds failed: no speculation path "
                "could pass",
        "url": "https://sq.example.com/queues/demo/requests/4", "at_ms": 1_700_000_000_000,
        "batch_id": "demo/batch/2", "commits": [], "last_error": f"x: {core.NO_PATH_PASSED}"}


def test_landed_and_needs_operator_texts() -> None:
    landed = n.message(entry("landed", commits=["0123456789abcdef" * 2]), "t")
    assert landed is not None
    assert n.summary(landed) == "demo/4 landed in demo (commit 0123456789ab)"
    dead = n.message(entry("error", "dead-lettered from merge after 10 attempts: x"), "t")
    assert dead is not None
    assert n.summary(dead).startswith("demo/4 needs an operator: it was removed from demo, ")
    assert json.loads(n.body(dead, fmt="json", public_url="http://h"))["needs_operator"]


def test_slack_body_escapes_and_links() -> None:
    msg = n.message(entry("error", "merge conflict: <b>&co</b>"), "chat")
    assert msg is not None
    doc = json.loads(n.body(msg, fmt="slack", public_url="http://sq.local"))
    assert set(doc) == {"text", "blocks"}
    assert doc["text"] == ("demo/4 was removed from demo: merge conflict: the change does "
                           "not apply onto the target branch <http://sq.local/queues/demo/"
                           "requests/4>")
    first = doc["blocks"][0]["text"]["text"]
    assert first.startswith("<http://sq.local/queues/demo/requests/4|demo/4> was removed")
    assert doc["blocks"][1]["text"]["text"] == "```merge conflict: &lt;b&gt;&amp;co&lt;/b&gt;```"
    assert "reason `merge_conflict`" in doc["blocks"][2]["elements"][0]["text"]


# --- configuration ------------------------------------------------------------------

BASE = "queues:\n  - name: demo\n    notify:\n"


def config(endpoints: str) -> Any:
    return parse_queues(BASE + endpoints)["demo"]


def test_a_full_endpoint_and_the_defaults() -> None:
    q = config("      - {name: team, url: 'https://h.example/x', secret_env: S}\n"
               "      - {name: chat, url_env: SLACK_URL, format: slack, events: [removed],"
               " timeout_s: 3}\n")
    team, chat = q.notify
    assert (team.events, team.format, team.timeout_s) == (
        ("landed", "removed", "needs_operator"), "json", 10.0)
    assert (chat.url_env, chat.secret_env, chat.events) == ("SLACK_URL", "", ("removed",))


@pytest.mark.parametrize(("endpoints", "says"), [
    ("      - {name: team, secret_env: S}\n", "needs exactly one of url"),
    ("      - {name: team, url: 'https://h', url_env: U, secret_env: S}\n",
     "needs exactly one of url"),
    ("      - {name: team, url: 'ftp://h/x', secret_env: S}\n",
     "must be an http:// or https:// address"),
    ("      - {name: team, url: 'https://h/x'}\n", "format json is signed; set secret_env"),
    ("      - {name: team, url: 'https://h/x', secret_env: 'hunter2!'}\n",
     "secret_env must name an environment variable"),
    ("      - {name: Team, url: 'https://h/x', secret_env: S}\n", "must be 1-64 of [a-z0-9_-]"),
    ("      - {name: t, url: 'https://h/x', secret_env: S, events: []}\n", "events must list"),
    ("      - {name: t, url: 'https://h/x', secret_env: S, events: [landed, landed]}\n",
     "events must list"),
    ("      - {name: t, url: 'https://h/x', secret_env: S, events: [merged]}\n",
     "'landed', 'removed' or 'needs_operator'"),
    ("      - {name: t, url: 'https://h/x', secret_env: S, colour: red}\n",
     "Extra inputs are not permitted"),
    ("      - {name: t, url: 'https://h/x', secret_env: S}\n"
     "      - {name: t, url: 'https://h/y', secret_env: S}\n",
     "notify endpoint t is declared twice"),
])
def test_bad_endpoints_are_one_clear_line(endpoints: str, says: str) -> None:
    with pytest.raises(ValidationError) as err:
        config(endpoints)
    text = str(err.value)
    assert says in text and "\n" not in text
    assert text.startswith("queues.yaml: queues.0")


def test_urls_and_secrets_come_from_the_environment_and_are_masked(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    q = config("      - {name: team, url: 'https://h.example/x', secret_env: SQ_T_SECRET}\n"
               "      - {name: chat, url_env: SQ_T_SLACK, format: slack}\n")
    with pytest.raises(ValidationError, match="notify endpoint 'team' secret_env names the "
                                              "environment variable SQ_T_SECRET, which is not"):
        build_extensions(q, build_scorer)
    monkeypatch.setenv("SQ_T_SECRET", "s3cret-value")
    with pytest.raises(ValidationError, match="url_env names the environment variable "
                                              "SQ_T_SLACK"):
        build_extensions(q, build_scorer)
    monkeypatch.setenv("SQ_T_SLACK", "not a url")
    with pytest.raises(ValidationError, match="must be an http:// or https:// address"):
        build_extensions(q, build_scorer)
    monkeypatch.setenv("SQ_T_SLACK", "https://hooks.slack.example/services/T/B/tok3n")
    team, chat = build_extensions(q, build_scorer, public_url="https://sq").notify
    assert (team.name, team.url, team.signed, team.public_url) == (
        "team", "https://h.example/x", True, "https://sq")
    assert (chat.url, chat.signed, chat.format) == (
        "https://hooks.slack.example/services/T/B/tok3n", False, "slack")
    assert set(webhook_secrets({"demo": q})) == {
        "s3cret-value", "https://hooks.slack.example/services/T/B/tok3n"}
