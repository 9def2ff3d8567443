"""The verdict of GitHub's checks on a queue branch (``app/extensions/github/checks.py``)."""

from __future__ import annotations

import pytest

from app.domain.states import BuildStatus
from app.extensions.github.checks import Check, from_status, verdict

REQ = ("test", "lint")


def v(*seen: Check, waited: float = 1.0) -> tuple[BuildStatus, str]:
    return verdict(REQ, seen, waited_s=waited, start_timeout_s=60, branch="sq/q/p-1")


def done(name: str, conclusion: str, url: str = "") -> Check:
    return Check(name, True, conclusion, url)


def test_every_required_check_passed() -> None:
    assert v(done("test", "success"), done("lint", "neutral"))[0] is BuildStatus.SUCCEEDED
    assert v(done("test", "success"), done("lint", "skipped"),
             done("other", "failure"))[0] is BuildStatus.SUCCEEDED  # not required


def test_a_failed_check_fails_the_build_naming_it() -> None:
    assert v(done("test", "failure", "https://ci/1"), Check("lint", False)) == (
        BuildStatus.FAILED, "check 'test' failed: https://ci/1")
    assert v(done("lint", "action_required"))[0] is BuildStatus.FAILED


@pytest.mark.parametrize("conclusion", ["cancelled", "timed_out", "stale"])
def test_a_check_that_did_not_finish_errors_the_build(conclusion: str) -> None:
    status, detail = v(done("test", conclusion), done("lint", "success"))
    assert status is BuildStatus.ERRORED and conclusion in detail


def test_the_newest_run_of_a_check_counts() -> None:
    rerun = v(done("test", "failure"), done("test", "success"), done("lint", "success"))
    assert rerun[0] is BuildStatus.SUCCEEDED


def test_running_until_every_required_check_has_an_answer() -> None:
    assert v(done("test", "success")) == (BuildStatus.RUNNING,
                                          "running; not started yet: lint")
    assert v(Check("test", False), Check("lint", False))[0] is BuildStatus.RUNNING


def test_no_ci_started_names_the_checks_and_the_fix() -> None:
    assert v(waited=59)[0] is BuildStatus.ACCEPTED
    assert v(done("other", "success"), waited=59)[0] is BuildStatus.ACCEPTED
    status, detail = v(waited=60)
    assert status is BuildStatus.ERRORED
    assert detail.startswith("no_ci_started: none of the required checks (test, lint) "
                             "appeared on sq/q/p-1 within 60 s")
    assert "on: push: branches: ['sq/**']" in detail


def test_commit_statuses_count_as_checks() -> None:
    assert from_status("test", "pending") == Check("test", False, "", "")
    assert v(from_status("test", "success"), from_status("lint", "error"))[0] is \
        BuildStatus.ERRORED
    assert v(from_status("test", "failure", "u"))[0] is BuildStatus.FAILED
