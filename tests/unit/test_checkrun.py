"""The SubmitQueue check-run's content (``app/domain/checkrun.py``): one row of its
table per test, and the commit status a token-authenticated queue writes instead."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.domain.checkrun import (
    CheckFacts,
    Link,
    TrailStep,
    commit_status,
    pull_heads,
    render,
)

SHA = "a" * 40
BASE = CheckFacts(sqid="widgets/3", queue="widgets", status="speculating", stage="speculating",
                  page_url="http://sq.example/queues/widgets/requests/3",
                  change_uris=(f"github://github.com/acme/widgets/pull/7/{SHA}",),
                  activity_text="building 2 paths", position=2, p_land=0.914, eta_ms=250_000)


def test_a_queued_request_shows_its_place_chance_and_eta() -> None:
    draft = render(replace(BASE, status="queued", stage="batching"))
    assert (draft.status, draft.conclusion) == ("queued", None)
    assert draft.title == "Queued · #2 in line · 91 % chance to land · lands in ~4 min"
    assert draft.details_url == BASE.page_url and BASE.page_url in draft.summary
    assert commit_status(replace(BASE, stage="batching")).state == "pending"


def test_a_speculating_request_is_in_progress_with_its_activity() -> None:
    draft = render(BASE)
    assert (draft.status, draft.conclusion) == ("in_progress", None)
    assert draft.title.startswith("Building 2 paths · #2 in line")
    assert "- now: building 2 paths" in draft.summary


def test_a_dead_lettered_stage_asks_for_an_operator() -> None:
    draft = render(replace(BASE, needs_operator=True, health_text="dead-lettered at merge"))
    assert draft.status == "in_progress"
    assert draft.title == "Needs an operator: dead-lettered at merge"


def test_a_landed_request_names_its_commit() -> None:
    facts = replace(BASE, status="landed", stage="landed", landed_commits=("b" * 40,))
    draft = render(facts)
    assert (draft.status, draft.conclusion) == ("completed", "success")
    assert draft.title == "Landed as " + "b" * 12
    assert f"landed as `{'b' * 40}`" in draft.summary
    assert commit_status(facts).state == "success"


def test_a_removal_gives_the_reason_the_evidence_and_the_failing_lines() -> None:
    facts = replace(BASE, status="error", stage="error", reason="build_failed",
                    removal_text="its build failed on its own",
                    evidence=(Link("check test failed", "http://ci/test/1"), Link("no url")),
                    next_steps=("fix the test and label it again",),
                    log_lines=("ok 1", "FAILED test_x", "```"), log_url="http://sq/log",
                    trail=(TrailStep("Accepted", 1000), TrailStep("Speculating", 4000, 90_000)))
    draft = render(facts)
    assert (draft.status, draft.conclusion) == ("completed", "failure")
    assert draft.title == "Removed: its build failed on its own"
    assert "Reason: `build_failed`" in draft.summary
    assert "- [check test failed](http://ci/test/1)" in draft.summary
    assert "- no url" in draft.summary and "- fix the test and label it again" in draft.summary
    assert "FAILED test_x" in draft.text and "[whole log](http://sq/log)" in draft.text
    assert draft.text.count("```") == 2  # a fence inside the log cannot close the block
    assert "| Speculating | +3 s | 2 min |" in draft.text
    assert commit_status(facts).state == "failure"


@pytest.mark.parametrize(("reason", "conclusion"), [
    ("cancelled", "cancelled"), ("superseded", "neutral")])
def test_a_cancel_is_cancelled_and_a_superseded_one_neutral(reason: str, conclusion: str) -> None:
    facts = replace(BASE, status="cancelled", stage="cancelled", reason=reason,
                    removal_text="superseded by a new push")
    assert render(facts).conclusion == conclusion
    assert render(facts).title == "Cancelled: superseded by a new push"
    assert commit_status(facts).state == "error"


def test_a_dead_lettered_removal_needs_action() -> None:
    facts = replace(BASE, status="error", stage="error", reason="dead_lettered",
                    last_error="merge kept failing")
    assert render(facts).conclusion == "action_required"
    assert "merge kept failing" in render(facts).text


def test_the_commit_status_description_fits_githubs_140_characters() -> None:
    facts = replace(BASE, status="error", stage="error", removal_text="x" * 500)
    assert len(commit_status(facts).description) == 140


def test_only_this_repositorys_pull_requests_get_a_check_run() -> None:
    uris = (f"github://github.com/acme/widgets/pull/7/{SHA}",
            f"github://github.com/acme/other/pull/8/{SHA}",
            f"github://github.com/acme/widgets/pull/9/{'c' * 40}?sq-fake=pass",
            "git://git.example.com/acme/widgets/refs%2Fheads%2Fx/" + SHA)
    assert pull_heads(uris, "github.com", "acme/widgets") == [(7, SHA), (9, "c" * 40)]
