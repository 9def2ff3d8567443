"""The ``github_checks`` runner against the served fake GitHub and its simulated CI: each
build's tree is pushed as ``sq/<queue>/<path>-<attempt>`` to the real repository and
its verdict is the required checks GitHub reports on that commit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.domain.github_config import GitHubConfig
from app.domain.states import BuildStatus, LandStrategy
from app.extensions.base import BuildRequest, MergeStep
from app.extensions.builds.memory import MemoryBuildStore
from app.extensions.git.publish import TreePublisher
from app.extensions.github.client import Credentials, GitHubClient, GitHubUnavailable
from app.extensions.github.fake import FakeGitHub
from app.extensions.github.runner import GitHubChecksRunner
from tests.support.fake_github import serve_fake_github

KEY = "github.com/acme/widgets"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeGitHub]:
    with serve_fake_github(tmp_path / "widgets.git") as served:
        yield served


def runner(fake: FakeGitHub, tmp_path: Path, *, checks: tuple[str, ...] = ("test",),
           start_timeout_s: float = 60, poll_s: float = 0.001) -> GitHubChecksRunner:
    config = GitHubConfig(repository="acme/widgets", api_url=fake.base_url, token_env="T")
    return GitHubChecksRunner(
        queue="widgets", store=MemoryBuildStore(), checks=checks,
        publisher=TreePublisher({KEY: str(fake.repo.path)}, "main", tmp_path / "pub"),
        client=GitHubClient(config, Credentials(token="fake-token")),
        start_timeout_s=start_timeout_s, timeout_s=3600, poll_s=poll_s)


def request(number: int, sha: str, *, path_id: str = "p1", attempt: int = 1) -> BuildRequest:
    uri = f"github://{KEY}/pull/{number}/{sha}"
    return BuildRequest(queue="widgets", batch_id="widgets/batch/1", path_id=path_id,
                        attempt=attempt, base_changes=(), head_changes=(uri,),
                        steps=(MergeStep("widgets/1", (uri,), LandStrategy.MERGE),))


async def test_the_required_checks_on_the_queue_branch_are_the_verdict(
        fake: FakeGitHub, tmp_path: Path) -> None:
    fake.simulate_ci("test", "lint")
    good = fake.open_pull({"src/ok.py": "fine\n"})
    bad = fake.open_pull({"src/bad.py": "BROKEN\n"})
    r = runner(fake, tmp_path, checks=("test", "lint"))
    ok_id = await r.trigger(request(1, good.head_sha, path_id="p1"))
    bad_id = await r.trigger(request(2, bad.head_sha, path_id="p2"))
    tip = fake.repo.resolve("refs/heads/sq/widgets/p1-1")
    assert tip is not None and fake.repo.is_ancestor(good.head_sha, tip)
    assert await r.trigger(request(1, good.head_sha, path_id="p1")) == ok_id  # redelivered
    ok = await r.status(ok_id)
    assert (ok.status, ok.detail) == (BuildStatus.SUCCEEDED,
                                      "required checks passed: test, lint")
    assert ok.tested is not None and ok.tested.commit == tip
    failed = await r.status(bad_id)
    assert failed.status is BuildStatus.FAILED and "check 'test' failed" in failed.detail
    # finished builds leave no queue branches behind
    assert fake.repo.git("for-each-ref", "refs/heads/sq/").stdout == ""
    assert len([c for c in fake.check_runs if c["name"] == "test"]) == 2
    # the fake's CI ran the sandbox's test in each tree: its output is the check's summary
    [red] = [c for c in fake.check_runs if c["name"] == "test" and c["conclusion"] == "failure"]
    assert "src/bad.py" in red["summary"] and "checked: src/ok.py" not in red["summary"]


async def test_a_ci_that_never_starts_is_no_ci_started(fake: FakeGitHub,
                                                       tmp_path: Path) -> None:
    pull = fake.open_pull({"a.txt": "1\n"})
    r = runner(fake, tmp_path, start_timeout_s=30)
    build = await r.trigger(request(1, pull.head_sha))
    assert (await r.status(build)).status is BuildStatus.ACCEPTED
    started = r.clock()
    r.clock = lambda: started + 31_000
    report = await r.status(build)
    assert report.status is BuildStatus.ERRORED
    assert report.detail.startswith("no_ci_started: none of the required checks (test) "
                                    "appeared on sq/widgets/p1-1 within 30 s")


async def test_a_check_still_running_then_cancel_deletes_the_branch(
        fake: FakeGitHub, tmp_path: Path) -> None:
    fake.simulate_ci("test", "lint", verdict=lambda sha: "success")
    pull = fake.open_pull({"a.txt": "1\n"})
    r = runner(fake, tmp_path, checks=("test", "lint", "e2e"))
    build = await r.trigger(request(1, pull.head_sha))
    report = await r.status(build)
    assert (report.status, report.detail) == (BuildStatus.RUNNING,
                                              "running; not started yet: e2e")
    await r.cancel(build)
    assert (await r.status(build)).status is BuildStatus.CANCELLED
    assert fake.repo.resolve("refs/heads/sq/widgets/p1-1") is None
    await r.cancel(build)  # again: nothing left to do


async def test_changes_that_do_not_combine_fail_before_anything_is_pushed(
        fake: FakeGitHub, tmp_path: Path) -> None:
    one = fake.open_pull({"README.md": "one\n"})
    two = fake.open_pull({"README.md": "two\n"})
    r = runner(fake, tmp_path)
    base_uri = f"github://{KEY}/pull/1/{one.head_sha}"
    req = request(2, two.head_sha)
    req = BuildRequest(queue=req.queue, batch_id=req.batch_id, path_id="p9", attempt=1,
                       base_changes=(base_uri,), head_changes=req.head_changes,
                       steps=(MergeStep("widgets/1", (base_uri,), LandStrategy.MERGE),
                              *req.steps))
    build = await r.trigger(req)
    assert (await r.status(build)).status is BuildStatus.FAILED
    assert fake.repo.git("for-each-ref", "refs/heads/sq/").stdout == ""


def ci_runs_on_queue_commits(fake: FakeGitHub, heads: set[str]) -> list[str]:
    """The shas of check-runs CI reported on anything but the pull requests' heads."""
    return [c["head_sha"] for c in fake.check_runs if c["head_sha"] not in heads]


async def test_a_pull_request_up_to_date_whose_checks_passed_is_not_built_again(
        fake: FakeGitHub, tmp_path: Path) -> None:
    """No CI paid twice: the pull request alone on the target, up to date with it, its
    head's required checks passed on the pull request: the path's tree is exactly that
    head's tree, so the build succeeds at once with the commit pushed to a ref no CI
    runs on (not a sq/ branch), and no check runs on it."""
    fake.simulate_ci("test", pulls=True)
    pull = fake.open_pull({"src/ok.py": "fine\n"})
    r = runner(fake, tmp_path)
    build = await r.trigger(request(1, pull.head_sha))
    report = await r.status(build)
    assert report.status is BuildStatus.SUCCEEDED, report
    assert report.detail == (
        f"no CI paid twice: this tree is exactly pull request head {pull.head_sha}'s, "
        "whose required checks passed (test); nothing was built again")
    assert report.tested is not None
    assert report.tested.tree == fake.repo.out("rev-parse", f"{pull.head_sha}^{{tree}}")
    assert fake.repo.resolve(f"refs/sq/builds/{build}") == report.tested.commit
    assert fake.repo.is_ancestor(pull.head_sha, report.tested.commit)  # the merge shape
    assert fake.repo.git("for-each-ref", "refs/heads/sq/").stdout == ""  # no branch
    assert ci_runs_on_queue_commits(fake, {pull.head_sha}) == []  # CI ran once, on the PR


@pytest.mark.parametrize("why", ["behind", "failed", "not_run", "behind_another"])
async def test_anything_but_an_exact_passed_tree_is_built(
        fake: FakeGitHub, tmp_path: Path, why: str) -> None:
    """The pull request is behind its base (its tree is not the path's), its checks
    failed or never ran on it, or another batch is assumed ahead: the tree is pushed to
    the queue branch and CI runs on it."""
    fake.simulate_ci("test", pulls=why != "not_run",
                     verdict=(lambda sha: "failure") if why == "failed" else None)
    pull = fake.open_pull({"src/ok.py": "fine\n"})
    ahead = fake.open_pull({"other/x.py": "ahead\n"})
    heads = {pull.head_sha, ahead.head_sha}
    if why == "behind":
        fake.repo.set_ref("refs/heads/main", fake.repo.commit(
            fake.tip(), {"moved.txt": "outside\n"}, "main moved"))
    req = request(1, pull.head_sha)
    if why == "behind_another":
        req = BuildRequest(
            queue="widgets", batch_id="widgets/batch/1", path_id="p1", attempt=1,
            base_changes=(f"github://{KEY}/pull/2/{ahead.head_sha}",),
            head_changes=req.head_changes)
    r = runner(fake, tmp_path)
    build = await r.trigger(req)
    assert fake.repo.resolve("refs/heads/sq/widgets/p1-1") is not None  # pushed: CI runs
    assert fake.repo.resolve(f"refs/sq/builds/{build}") is None
    report = await r.status(build)
    assert report.status is (BuildStatus.FAILED if why == "failed" else BuildStatus.SUCCEEDED)
    assert "no CI paid twice" not in report.detail
    assert len(ci_runs_on_queue_commits(fake, heads)) == 1


async def test_github_is_asked_at_most_every_poll_s_unless_a_check_webhook_nudges(
        fake: FakeGitHub, tmp_path: Path) -> None:
    """The build stage asks for the status every few hundred ms; GitHub is asked right
    after the push, then not again within ``poll_s`` — until a check webhook names the
    build's branch (``nudge``), whichever store the run is in."""
    pull = fake.open_pull({"a.txt": "1\n"})
    r = runner(fake, tmp_path, poll_s=600)
    build = await r.trigger(request(1, pull.head_sha))
    calls = len(fake.api_versions)
    assert (await r.status(build)).status is BuildStatus.ACCEPTED  # asked: nothing yet
    asked = len(fake.api_versions)
    assert asked > calls
    fake.simulate_ci("test")  # CI reports now; the queue does not know yet
    for _ in range(5):
        assert (await r.status(build)).status is BuildStatus.ACCEPTED
    assert len(fake.api_versions) == asked  # within poll_s: GitHub not asked again
    assert await r.nudge(["main", "sq/other/p1-1", "sq/widgets/p1-2"]) == 0  # not its branch
    assert await r.nudge(["sq/widgets/p1-1"]) == 1
    report = await r.status(build)
    assert report.status is BuildStatus.SUCCEEDED, report
    assert await r.nudge(["sq/widgets/p1-1"]) == 0  # a finished build is not woken


async def test_with_no_checks_configured_the_branchs_rulesets_and_protection_name_them(
        fake: FakeGitHub, tmp_path: Path) -> None:
    fake.simulate_ci("test", "lint", "e2e", verdict=lambda sha: "success")
    pull = fake.open_pull({"a.txt": "1\n"})
    r = runner(fake, tmp_path, checks=())
    # nothing requires a check on main: the work waits, naming the fix; nothing is pushed
    with pytest.raises(GitHubUnavailable, match=r"main requires no status check .* list them "
                                                r"in build_runner.checks"):
        await r.trigger(request(1, pull.head_sha))
    assert fake.repo.git("for-each-ref", "refs/heads/sq/").stdout == ""
    fake.actions.rulesets["main"] = [["test"], ["lint", "test"]]
    fake.actions.protection["main"] = ["e2e"]
    fake.actions.rulesets["release"] = [["deploy"]]
    assert await r.client.required_checks("main") == (("test", "lint", "e2e"), "")
    build = await r.trigger(request(1, pull.head_sha))
    report = await r.status(build)
    assert (report.status, report.detail) == (BuildStatus.SUCCEEDED,
                                              "required checks passed: test, lint, e2e")
    # a token that may not read the classic protection: the rulesets count, with a note
    fake.actions.protection_readable = False
    names, note = await r.client.required_checks("main")
    assert names == ("test", "lint") and "Administration: read" in note
    # read again at most every REQUIRED_TTL_S
    assert await r.required() == ("test", "lint", "e2e")
    r._required = None
    assert await r.required() == ("test", "lint")


async def test_a_cancelled_or_failed_build_cancels_its_workflow_runs(
        fake: FakeGitHub, tmp_path: Path) -> None:
    fake.simulate_ci("test")
    fake.actions.hold = True  # CI starts and keeps running
    one = fake.open_pull({"a.txt": "1\n"})
    two = fake.open_pull({"b.txt": "2\n"})
    three = fake.open_pull({"c.txt": "3\n"})
    r = runner(fake, tmp_path)
    build = await r.trigger(request(1, one.head_sha))
    assert (await r.status(build)).status is BuildStatus.RUNNING
    [run] = fake.actions.runs
    assert run["head_branch"] == "sq/widgets/p1-1" and run["status"] == "in_progress"
    await r.cancel(build)
    assert run["conclusion"] == "cancelled" and fake.actions.cancels == [run["id"]]
    assert fake.repo.resolve("refs/heads/sq/widgets/p1-1") is None
    assert "cancelled 1 workflow run(s) on sq/widgets/p1-1" in (
        await r.store.get_log(build) or "")
    # a build that passed leaves its branch's other runs alone; one that failed stops them
    fake.actions.release()
    passed = await r.trigger(request(2, two.head_sha, path_id="p2"))
    assert (await r.status(passed)).status is BuildStatus.SUCCEEDED
    assert fake.actions.cancels == [run["id"]]
    fake.actions.hold = True
    failing = await r.trigger(request(3, three.head_sha, path_id="p3"))
    tip = fake.repo.resolve("refs/heads/sq/widgets/p3-1")
    assert (await r.status(failing)).status is BuildStatus.RUNNING
    [check] = [c for c in fake.check_runs if c["head_sha"] == tip]
    check["status"], check["conclusion"] = "completed", "failure"
    await asyncio.sleep(0.01)  # poll_s is 1 ms
    assert (await r.status(failing)).status is BuildStatus.FAILED
    assert fake.actions.runs[-1]["conclusion"] == "cancelled"  # its run stopped
    await r.cancel(build)  # again: nothing left to do
