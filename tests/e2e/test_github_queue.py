"""A queue of pull requests end to end: the real app with a ``github`` queue in
queues.yaml, the fake GitHub served on its own port, webhook deliveries signed and sent
to the server. The pipeline reads each pull request through the API; the first tests
use fake builds and the noop merger, the later ones the ``github_checks`` runner and
the ``github`` merger (docs/github.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.extensions.github.fake import FakeGitHub, app_key_pair
from tests.conftest import BACKENDS
from tests.e2e.harness import serve
from tests.support.fake_github import serve_fake_github
from tests.support.polls import wait_for

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

SECRET = b"e2e-webhook-secret"
QUEUES = """
queues:
  - name: widgets
    change_provider: {type: github}
    build_runner: {type: fake}
    merger: {type: noop}
    github:
      repository: acme/widgets
      api_url: {api}
      token_env: SQ_E2E_GITHUB_TOKEN
      webhook_secret_env: SQ_E2E_GITHUB_WEBHOOK_SECRET
      require_approval: true
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGitHub]:
    monkeypatch.setenv("SQ_E2E_GITHUB_TOKEN", "fake-token")
    monkeypatch.setenv("SQ_E2E_GITHUB_WEBHOOK_SECRET", SECRET.decode())
    with serve_fake_github(tmp_path / "widgets.git") as served:
        (tmp_path / "queues.yaml").write_text(QUEUES.replace("{api}", served.base_url))
        yield served


async def label(fake: FakeGitHub, base_url: str, number: int) -> httpx.Response:
    return await fake.deliver(f"{base_url}/api/v1/github/webhook", "pull_request",
                              fake.pull_request_event(number, "labeled", label="merge-queue"),
                              secret=SECRET)


async def test_labelled_pull_requests_are_read_and_checked_by_the_pipeline(
        database_url: str, tmp_path: Path, fake: FakeGitHub) -> None:
    good = fake.open_pull({"src/a.py": "print('a')\n"}, title="Add a", author="mona")
    fake.review(good.number, "hubot")
    draft = fake.open_pull({"src/b.py": "print('b')\n"}, title="Add b", draft=True)
    fake.review(draft.number, "hubot")
    unapproved = fake.open_pull({"src/c.py": "print('c')\n"}, title="Add c")
    async with serve(database_url, tmp_path) as server:
        sqids = []
        for pull in (good, draft, unapproved):
            r = await label(fake, server.base_url, pull.number)
            assert r.status_code == 200, r.text
            sqids += r.json()["outcomes"][0]["sqids"]
        assert sqids == ["widgets/1", "widgets/2", "widgets/3"]
        assert await server.wait_terminal("widgets/1") == "landed"
        assert await server.wait_terminal("widgets/2") == "error"
        assert await server.wait_terminal("widgets/3") == "error"
        assert "is a draft; mark it ready" in (await server.summary("widgets/2"))["last_error"]
        assert "requires an approving review" in \
            (await server.summary("widgets/3"))["last_error"]
        landed = await server.summary("widgets/1")
        assert landed["submitted_by"] == "github:octocat"
        assert landed["change_uris"] == [
            f"github://github.com/acme/widgets/pull/1/{good.head_sha}"]
    assert set(fake.api_versions) == {"2022-11-28"}


async def test_a_lost_delivery_is_recovered_by_the_resync(
        database_url: str, tmp_path: Path, fake: FakeGitHub) -> None:
    pull = fake.open_pull({"src/lost.py": "print('lost')\n"}, title="Lost")
    fake.review(pull.number, "hubot")
    pull.labels.append("merge-queue")  # labelled; the delivery never reached the server
    async with serve(database_url, tmp_path, github_resync_ms=1000) as server:
        async def queued() -> bool:
            r = await server.client.get("/api/v1/queues/widgets/requests/1")
            return r.status_code == 200

        await wait_for(queued, "the resync to land the labelled pull request", timeout=10)
        assert await server.wait_terminal("widgets/1") == "landed"
        summary = await server.summary("widgets/1")
    assert summary["submitted_by"] == "github:submitqueue-resync"
    assert summary["change_uris"] == [
        f"github://github.com/acme/widgets/pull/1/{pull.head_sha}"]


GIT_QUEUES = """
queues:
  - name: widgets
    change_provider: {type: github}
    build_runner: {type: fake}
    merger: {type: MERGER}
    default_strategy: merge
    git: {repository: ./widgets.git, repo_key: github.com/acme/widgets, target_branch: main}
    github:
      repository: acme/widgets
      api_url: {api}
      token_env: SQ_E2E_GITHUB_TOKEN
      webhook_secret_env: SQ_E2E_GITHUB_WEBHOOK_SECRET
"""


def submitqueue_runs(fake: FakeGitHub) -> dict[str, dict[str, Any]]:
    """The newest SubmitQueue check-run of each head, by head sha."""
    return {r["head_sha"]: r for r in fake.check_runs if r["name"] == "SubmitQueue"}


@pytest.mark.parametrize("merger", ["git", "github"])
async def test_pull_requests_land_on_the_repository(
        database_url: str, tmp_path: Path, fake: FakeGitHub, merger: str) -> None:
    """The git merger lands github:// changes (their refs/pull/<n>/head) by git push, the
    github merger by the API's fast-forward (never forced): the pull requests' commits
    reach main and GitHub (here the fake) sees them merged."""
    (tmp_path / "queues.yaml").write_text(
        GIT_QUEUES.replace("{api}", fake.base_url).replace("MERGER", merger))
    one = fake.open_pull({"src/one.py": "1\n"}, title="One")
    two = fake.open_pull({"docs/two.md": "2\n"}, title="Two")
    async with serve(database_url, tmp_path) as server:
        for pull in (one, two):
            r = await label(fake, server.base_url, pull.number)
            assert r.json()["outcomes"][0]["action"] == "landed", r.text
        assert await server.wait_all_terminal(["widgets/1", "widgets/2"], queue="widgets") == {
            "widgets/1": "landed", "widgets/2": "landed"}

        def landed_statuses() -> list[dict[str, Any]]:  # a token: commit statuses instead
            shown = {s["sha"]: s for s in fake.statuses if s["context"] == "SubmitQueue"}
            done = [shown[p.head_sha] for p in (one, two)
                    if p.head_sha in shown and shown[p.head_sha]["state"] == "success"]
            return done if len(done) == 2 else []

        statuses = await wait_for(landed_statuses, "both heads' SubmitQueue status")
        assert [s["target_url"].rsplit("/", 1)[1] for s in statuses] == ["1", "2"]
        assert not submitqueue_runs(fake)  # GitHub lets only Apps write check-runs
    tip = fake.tip()
    assert fake.repo.is_ancestor(one.head_sha, tip) and fake.repo.is_ancestor(two.head_sha, tip)
    assert fake.repo.out("log", "-1", "--format=%B", tip).count("Source-Ref: refs/pull/") == 1
    assert [fake.pull_json(n)["merged"] for n in (1, 2)] == [True, True]
    if merger == "github":  # one fast-forward per landed batch, each through the API
        assert fake.ref_updates and all(
            (ref, force, status) == ("refs/heads/main", False, 200)
            for ref, _, force, status in fake.ref_updates)
        assert fake.ref_updates[-1][1] == tip
    else:
        assert fake.ref_updates == []


CHECKS_QUEUES = """
queues:
  - name: widgets
    change_provider: {type: github}
    build_runner: {type: github_checks, checks: [test], checks_start_timeout_s: 30}
    merger: {type: github}
    default_strategy: merge
    git: {repository: ./widgets.git, repo_key: github.com/acme/widgets, target_branch: main}
    github:
      repository: acme/widgets
      api_url: {api}
      app_id: 4242
      private_key_env: SQ_E2E_GITHUB_APP_KEY
      webhook_secret_env: SQ_E2E_GITHUB_WEBHOOK_SECRET
"""


def app_auth(fake: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server signs in as a GitHub App the fake knows (so it writes check-runs)."""
    private, public = app_key_pair()
    fake.app_public_key = public
    monkeypatch.setenv("SQ_E2E_GITHUB_APP_KEY", private)


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_six_pull_requests_two_failing_one_pushed_to_three_land_as_tested(
        database_url: str, tmp_path: Path, fake: FakeGitHub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15's scenario: 6 labelled pull requests, 2 failing their check, 1 pushed to
    while queued: the 3 others land on main as exactly the commits whose checks passed,
    the 2 failures are removed ``build_failed`` and the pushed one ``superseded``, each
    head's SubmitQueue check-run tells its end, and nothing is left queued."""
    app_auth(fake, monkeypatch)
    (tmp_path / "queues.yaml").write_text(CHECKS_QUEUES.replace("{api}", fake.base_url))
    fake.simulate_ci("test")
    broken = {2, 5}
    pulls = [fake.open_pull({f"p{i}/f.txt": "BROKEN\n" if i in broken else f"{i}\n"},
                            title=f"Change {i}") for i in range(1, 7)]
    async with serve(database_url, tmp_path) as server:
        for pull in pulls:
            r = await label(fake, server.base_url, pull.number)
            assert r.json()["outcomes"][0]["action"] == "landed", r.text
            if pull.number == 4:  # pushed to at once, while its request is in flight
                old_head = pull.head_sha
                fake.push(4, {"p4/f.txt": "4, amended\n"})
                event = {**fake.pull_request_event(4, "synchronize"), "before": old_head,
                         "after": fake.pulls[4].head_sha}
                r = await fake.deliver(f"{server.base_url}/api/v1/github/webhook",
                                       "pull_request", event, secret=SECRET)
                assert r.json()["outcomes"][0]["detail"] == "superseded by a new push", r.text
        sqids = [f"widgets/{i}" for i in range(1, 7)]
        ends = await server.wait_all_terminal(sqids, queue="widgets", timeout=100)
        assert ends == {"widgets/1": "landed", "widgets/2": "error", "widgets/3": "landed",
                        "widgets/4": "cancelled", "widgets/5": "error", "widgets/6": "landed"}
        reasons = {}
        for sqid in ("widgets/2", "widgets/4", "widgets/5"):
            view = await server.client.get(
                f"/api/v1/queues/widgets/requests/{sqid.split('/')[1]}/view")
            reasons[sqid] = view.json()["removal"]["reason"]
        assert reasons == {"widgets/2": "build_failed", "widgets/4": "superseded",
                           "widgets/5": "build_failed"}
        heads = [old_head if p.number == 4 else p.head_sha for p in pulls]

        def settled() -> bool:
            runs = submitqueue_runs(fake)
            return all(runs.get(h, {}).get("status") == "completed" for h in heads)

        await wait_for(settled, "every queued head's SubmitQueue check-run completed")
        landed = {q: (await server.summary(q))["metadata"]["commits"]
                  for q in ("widgets/1", "widgets/3", "widgets/6")}
        listed = await server.client.get("/api/v1/queues/widgets/requests")
    runs = submitqueue_runs(fake)
    assert [runs[h]["conclusion"] for h in heads] == [
        "success", "failure", "success", "neutral", "failure", "success"]
    assert all("| Stage | At | Took |" in runs[h]["text"] for h in heads)  # each trail
    assert fake.pulls[4].head_sha not in runs  # the new head was never queued
    tip = fake.tip()
    main = fake.repo.out("log", "--format=%H", "--first-parent", "main").split()
    for n, sqid in ((1, "widgets/1"), (3, "widgets/3"), (6, "widgets/6")):
        assert fake.repo.is_ancestor(pulls[n - 1].head_sha, tip)
        assert landed[sqid][0] in main  # the tested commit itself is on main
        assert runs[pulls[n - 1].head_sha]["title"] == f"Landed as {landed[sqid][0][:12]}"
    for n in (2, 4, 5):
        assert not fake.repo.is_ancestor(pulls[n - 1].head_sha, tip)
    assert not fake.repo.is_ancestor(fake.pulls[4].head_sha, tip)
    assert [fake.pull_json(n)["merged"] for n in range(1, 7)] == [
        True, False, True, False, False, True]
    assert sorted(r["status"] for r in listed.json()["items"]) == [  # nothing left queued
        "cancelled", "error", "error", "landed", "landed", "landed"], listed.text


async def test_required_checks_are_the_builds_and_the_tested_commit_lands(
        database_url: str, tmp_path: Path, fake: FakeGitHub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """github_checks runner + github merger: each path's tree is pushed as a sq/ branch,
    the fake's CI reports the check "test" on it (failing on a BROKEN line), passed
    trees land by the API's fast-forward and the failing pull request is removed. The
    queue authenticates as a GitHub App, so each pull request carries the SubmitQueue
    check-run telling its trail: landed with the commit, removed with the reason."""
    app_auth(fake, monkeypatch)
    (tmp_path / "queues.yaml").write_text(CHECKS_QUEUES.replace("{api}", fake.base_url))
    fake.simulate_ci("test")
    pulls = [fake.open_pull({"one/a.txt": "fine\n"}, title="One"),
             fake.open_pull({"two/b.txt": "BROKEN\n"}, title="Two"),
             fake.open_pull({"three/c.txt": "fine\n"}, title="Three")]
    async with serve(database_url, tmp_path) as server:
        for pull in pulls:
            r = await label(fake, server.base_url, pull.number)
            assert r.json()["outcomes"][0]["action"] == "landed", r.text
        sqids = ["widgets/1", "widgets/2", "widgets/3"]
        assert await server.wait_all_terminal(sqids, queue="widgets", timeout=45) == {
            "widgets/1": "landed", "widgets/2": "error", "widgets/3": "landed"}
        error = (await server.summary("widgets/2"))["last_error"]
        assert "every candidate build failed" in error
        build = error.split("last builds: ")[1].split(" ")[0]
        log = await server.client.get(f"/api/v1/builds/{build}/log")
        assert "failed: check 'test' failed: " in log.text, log.text
        heads = [p.head_sha for p in pulls]

        def settled() -> bool:
            runs = submitqueue_runs(fake)
            return all(runs.get(h, {}).get("status") == "completed" for h in heads)

        await wait_for(settled, "every pull request's SubmitQueue check-run completed")
        landed = [(await server.summary(q))["metadata"] for q in ("widgets/1", "widgets/3")]
    runs = submitqueue_runs(fake)
    assert [runs[h]["conclusion"] for h in heads] == ["success", "failure", "success"]
    assert [runs[h]["external_id"] for h in heads] == sqids
    for head, md in zip((heads[0], heads[2]), landed, strict=True):
        assert runs[head]["title"] == f"Landed as {md['commits'][0][:12]}", runs[head]
    failed = runs[heads[1]]
    assert failed["title"].startswith("Removed: "), failed
    assert "Reason: `build_failed`" in failed["summary"]
    assert failed["details_url"].endswith("/queues/widgets/requests/2")
    assert "| Stage | At | Took |" in failed["text"]  # the trail
    assert len([r for r in fake.check_runs if r["name"] == "SubmitQueue"]) == 3  # updated in place
    tip = fake.tip()
    assert fake.repo.is_ancestor(pulls[0].head_sha, tip)
    assert fake.repo.is_ancestor(pulls[2].head_sha, tip)
    assert not fake.repo.is_ancestor(pulls[1].head_sha, tip)
    assert [fake.pull_json(n)["merged"] for n in (1, 2, 3)] == [True, False, True]
    tested = {c["head_sha"] for c in fake.check_runs if c["conclusion"] == "success"}
    assert tip in tested  # main is exactly a commit whose required check passed
    assert all(not force for _, _, force, _ in fake.ref_updates)
    assert fake.repo.git("for-each-ref", "refs/heads/sq/").stdout == ""


async def test_a_ci_that_never_starts_removes_the_request_no_ci_started(
        database_url: str, tmp_path: Path, fake: FakeGitHub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No CI runs on the queue's branches (the fake's CI is off): each attempt of the
    path errors ``no_ci_started`` after ``checks_start_timeout_s``; once the errored
    attempts are spent the request is removed ``no_ci_started`` — not ``build_failed``:
    the page names the checks that never appeared and the fix, and the SubmitQueue
    check-run asks for action. Nothing lands and no queue branch is left behind."""
    app_auth(fake, monkeypatch)
    (tmp_path / "queues.yaml").write_text(CHECKS_QUEUES.replace("{api}", fake.base_url)
                                          .replace("checks_start_timeout_s: 30",
                                                   "checks_start_timeout_s: 0.5, poll_s: 0.25"))
    pull = fake.open_pull({"one/a.txt": "fine\n"}, title="One")
    tip = fake.tip()
    async with serve(database_url, tmp_path) as server:
        r = await label(fake, server.base_url, pull.number)
        assert r.json()["outcomes"][0]["action"] == "landed", r.text
        assert await server.wait_all_terminal(["widgets/1"], queue="widgets",
                                              timeout=45) == {"widgets/1": "error"}
        error = (await server.summary("widgets/1"))["last_error"]
        assert error.startswith("no_ci_started: none of the required checks (test) "
                                "appeared on sq/widgets/"), error
        assert "errored after 5 attempts" in error  # the errored-build retries were spent
        view = (await server.client.get("/api/v1/queues/widgets/requests/1/view")).json()
        removal = view["removal"]
        assert (removal["kind"], removal["reason"]) == ("no_ci_started", "no_ci_started")
        assert removal["text"].startswith("No CI run started for it"), removal
        assert "on: push: branches: ['sq/**']" in removal["text"]
        assert any("sq/**" in step for step in removal["next_steps"]), removal

        def settled() -> bool:
            return submitqueue_runs(fake).get(pull.head_sha, {}).get("status") == "completed"

        await wait_for(settled, "the SubmitQueue check-run completed")
    run = submitqueue_runs(fake)[pull.head_sha]
    assert run["conclusion"] == "action_required", run
    assert "Reason: `no_ci_started`" in run["summary"], run
    assert fake.tip() == tip  # nothing landed
    assert fake.repo.git("for-each-ref", "refs/heads/sq/").stdout == ""


async def test_a_passed_up_to_date_pull_request_lands_without_ci_paid_twice(
        database_url: str, tmp_path: Path, fake: FakeGitHub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CI runs on pull requests too (``pulls=True``) and both pull requests' heads
    passed. The one that lands first is up to date with main: its tree is its head's,
    so its checks count and nothing is built on a queue branch. The other is then
    behind main (the first landed): the tree with both never ran CI, so it is built
    once on a queue branch before it lands. Main ends as commits whose trees passed.
    (Both may first be taken as they are, each first in its lane on the old tip; the
    one that lands second is then refuted by the move and built on the new tip.)"""
    app_auth(fake, monkeypatch)
    (tmp_path / "queues.yaml").write_text(CHECKS_QUEUES.replace("{api}", fake.base_url))
    fake.simulate_ci("test", pulls=True)
    pulls = [fake.open_pull({"one/a.txt": "fine\n"}, title="One"),
             fake.open_pull({"two/b.txt": "fine\n"}, title="Two")]
    heads = {p.head_sha for p in pulls}
    async with serve(database_url, tmp_path) as server:
        for pull in pulls:  # CI's checks on the heads, as a pull_request workflow gives
            assert [c.conclusion for c in await fake_checks(fake, pull.head_sha)] == [
                "success"]
        for pull in pulls:
            r = await label(fake, server.base_url, pull.number)
            assert r.json()["outcomes"][0]["action"] == "landed", r.text
        sqids = ["widgets/1", "widgets/2"]
        assert await server.wait_all_terminal(sqids, queue="widgets", timeout=45) == {
            "widgets/1": "landed", "widgets/2": "landed"}
        histories = [(await server.client.get(
            f"/api/v1/queues/widgets/requests/{n}/history")).text for n in (1, 2)]
    queue_ci = [c for c in fake.check_runs
                if c["name"] == "test" and c["head_sha"] not in heads]
    assert len(queue_ci) == 1, queue_ci  # one of the two was built, once
    # the first to land was not built again; the other may have been too, on the tip
    # before the first landed (then the move made it build on the new tip: once)
    assert any("no CI paid twice" in h for h in histories), histories
    tip = fake.tip()
    assert all(fake.repo.is_ancestor(p.head_sha, tip) for p in pulls)
    trees = {fake.repo.out("rev-parse", f"{c['head_sha']}^{{tree}}")
             for c in fake.check_runs if c["name"] == "test" and c["conclusion"] == "success"}
    assert fake.repo.out("rev-parse", f"{tip}^{{tree}}") in trees  # main's tree passed CI
    assert all(not force for _, _, force, _ in fake.ref_updates)


async def fake_checks(fake: FakeGitHub, sha: str) -> list[Any]:
    from app.domain.github_config import GitHubConfig
    from app.extensions.github.client import Credentials, GitHubClient
    config = GitHubConfig(repository="acme/widgets", api_url=fake.base_url, token_env="T")
    return await GitHubClient(config, Credentials(token="fake-token")).checks(sha)


async def test_a_check_webhook_makes_the_queue_read_a_builds_checks_at_once(
        database_url: str, tmp_path: Path, fake: FakeGitHub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GitHub is asked once right after the push (CI has not started: nothing yet) and
    then only every ``poll_s`` — here 600 s, past the test's timeout. CI reports, and
    its ``check_run`` webhook names the queue branch: the build reads its checks now and
    the pull request lands (the nudge goes through the shared build store)."""
    app_auth(fake, monkeypatch)
    (tmp_path / "queues.yaml").write_text(CHECKS_QUEUES.replace("{api}", fake.base_url)
                                          .replace("checks_start_timeout_s: 30",
                                                   "checks_start_timeout_s: 900, poll_s: 600"))
    fake.simulate_ci("test")
    fake.ci_paused = True
    pull = fake.open_pull({"one/a.txt": "fine\n"}, title="One")
    async with serve(database_url, tmp_path) as server:
        r = await label(fake, server.base_url, pull.number)
        assert r.json()["outcomes"][0]["action"] == "landed", r.text

        def branch() -> str:
            return fake.repo.out("for-each-ref", "--format=%(refname:lstrip=2) %(objectname)",
                                 "refs/heads/sq/")

        await wait_for(lambda: bool(branch()), "the build's queue branch pushed")
        name, sha = branch().split()
        await wait_for(lambda: sha in fake.check_listings, "the build's first poll")
        fake.ci_paused = False  # CI starts and reports; nobody asks for 600 s
        other = {"action": "completed", "repository": fake.repository(),
                 "check_run": {"head_sha": "e" * 40,
                               "check_suite": {"head_branch": "feature"}}}
        quiet = await fake.deliver(f"{server.base_url}/api/v1/github/webhook", "check_run",
                                   other, secret=SECRET)
        assert quiet.json()["outcomes"] == [], quiet.text  # not a queue branch: nothing
        event = {"action": "completed", "repository": fake.repository(),
                 "check_run": {"head_sha": sha, "check_suite": {"head_branch": name}}}
        got = await fake.deliver(f"{server.base_url}/api/v1/github/webhook", "check_run",
                                 event, secret=SECRET)
        assert got.json()["outcomes"] == [{
            "queue": "widgets", "action": "checked", "sqids": [],
            "detail": f"1 build on {name} read GitHub's checks now"}], got.text
        assert await server.wait_all_terminal(["widgets/1"], queue="widgets",
                                              timeout=30) == {"widgets/1": "landed"}
    assert fake.check_listings.count(sha) == 2  # after the push, and after the webhook
    assert fake.repo.is_ancestor(pull.head_sha, fake.tip())



async def test_the_rulesets_required_checks_are_the_builds_and_a_removal_comments_once(
        database_url: str, tmp_path: Path, fake: FakeGitHub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No checks in queues.yaml: the runner reads what main's ruleset requires; the
    queue comments on the pull request it removed (removal_comment), once."""
    app_auth(fake, monkeypatch)
    queues = CHECKS_QUEUES.replace("{api}", fake.base_url).replace(
        "checks: [test], ", "").replace(
        "      webhook_secret_env:", "      removal_comment: true\n      webhook_secret_env:")
    assert "checks: [" not in queues
    (tmp_path / "queues.yaml").write_text(queues)
    fake.actions.rulesets["main"] = [["test"]]
    fake.simulate_ci("test", "lint")  # lint: not required, so not waited for
    pulls = [fake.open_pull({"one/a.txt": "fine\n"}, title="One"),
             fake.open_pull({"two/b.txt": "BROKEN\n"}, title="Two")]
    async with serve(database_url, tmp_path) as server:
        for pull in pulls:
            r = await label(fake, server.base_url, pull.number)
            assert r.json()["outcomes"][0]["action"] == "landed", r.text
        assert await server.wait_all_terminal(["widgets/1", "widgets/2"], queue="widgets",
                                              timeout=45) == {
            "widgets/1": "landed", "widgets/2": "error"}
        error = (await server.summary("widgets/2"))["last_error"]
        build = error.split("last builds: ")[1].split(" ")[0]
        log = await server.client.get(f"/api/v1/builds/{build}/log")
        assert "waiting for test" in log.text, log.text

        def commented() -> bool:
            return len(fake.pulls[2].comments) == 1

        await wait_for(commented, "the removed pull request's comment")
    [comment] = fake.pulls[2].comments
    assert comment["body"].startswith("SubmitQueue removed this pull request from queue")
    assert "Reason: `build_failed`" in comment["body"]
    assert comment["body"].endswith("<!-- submitqueue:removed:widgets/2 -->")
    assert fake.pulls[1].comments == []  # landed: no comment
    assert fake.repo.is_ancestor(pulls[0].head_sha, fake.tip())
