"""The fake GitHub (``app/extensions/github/fake.py``), served on a loopback port.

The contract: every answer of an endpoint it implements parses with githubkit's models
for REST 2022-11-28, generated from GitHub's OpenAPI description. Its ref updates move
the real repository's commits (fast-forward only without ``force``), lists are paged as
GitHub pages them, and its webhook deliveries are signed as GitHub signs them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from githubkit.webhooks import verify
from githubkit_schemas.v2022_11_28 import models as M

from app.domain.github_config import GitHubConfig
from app.extensions.github import fake_json as J
from app.extensions.github.client import Credentials, GitHubClient
from app.extensions.github.fake import FakeGitHub
from tests.support.fake_github import serve_fake_github

HEADERS = {"Authorization": "token fake-token", "X-GitHub-Api-Version": "2022-11-28"}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeGitHub]:
    with serve_fake_github(tmp_path / "widgets.git") as served:
        yield served


def api(fake: FakeGitHub, method: str, path: str, *, headers: dict[str, str] | None = None,
        **kw: Any) -> httpx.Response:
    return httpx.request(method, f"{fake.base_url}/repos/acme/widgets{path}",
                         headers=headers or HEADERS, timeout=10, **kw)


def test_answers_validate_against_githubs_api_description(fake: FakeGitHub) -> None:
    pull = fake.open_pull({"src/a.py": "a\nb\n", "README.md": None}, title="Fix a")
    fake.review(1, "mona")
    fake.permissions["mona"] = "maintain"
    M.PullRequest.model_validate(api(fake, "GET", "/pulls/1").json())
    [listed_pull] = api(fake, "GET", "/pulls", params={"state": "open", "base": "main"}).json()
    assert M.PullRequestSimple.model_validate(listed_pull).number == 1
    assert api(fake, "GET", "/pulls", params={"base": "release"}).json() == []
    files = [M.DiffEntry.model_validate(f) for f in api(fake, "GET", "/pulls/1/files").json()]
    assert {(f.filename, f.status, f.additions, f.deletions) for f in files} == \
        {("src/a.py", "added", 2, 0), ("README.md", "removed", 0, 1)}
    review = M.PullRequestReview.model_validate(api(fake, "GET", "/pulls/1/reviews").json()[0])
    assert (review.state, review.commit_id) == ("APPROVED", pull.head_sha)
    perm = M.RepositoryCollaboratorPermission.model_validate(
        api(fake, "GET", "/collaborators/mona/permission").json())
    assert (perm.permission, perm.role_name) == ("write", "maintain")
    M.IssueComment.model_validate(
        api(fake, "POST", "/issues/1/comments", json={"body": "hi"}).json())
    M.IssueComment.model_validate(api(fake, "GET", "/issues/1/comments").json()[0])
    M.GitRef.model_validate(api(fake, "GET", "/git/ref/heads/main").json())
    labels = api(fake, "POST", "/issues/1/labels", json={"labels": ["merge-queue"]}).json()
    assert [M.Label.model_validate(lb).name for lb in labels] == ["merge-queue"]
    closed = M.PullRequest.model_validate(
        api(fake, "PATCH", "/pulls/1", json={"state": "closed"}).json())
    assert (closed.state, closed.merged) == ("closed", False)
    assert api(fake, "PATCH", "/pulls/1", json={"state": "merged"}).status_code == 422
    api(fake, "PATCH", "/pulls/1", json={"state": "open"})
    create = {"name": "SubmitQueue", "head_sha": pull.head_sha, "status": "in_progress"}
    refused = api(fake, "POST", "/check-runs", json=create)
    assert refused.status_code == 403 and "GitHub App" in refused.json()["message"]
    fake.installation_tokens["ghs_test"] = time.time() + 60
    as_app = {**HEADERS, "Authorization": "token ghs_test"}
    run = M.CheckRun.model_validate(api(fake, "POST", "/check-runs", json=create,
                                        headers=as_app).json())
    done = M.CheckRun.model_validate(api(fake, "PATCH", f"/check-runs/{run.id}", json={
        "conclusion": "success", "output": {"title": "ok", "summary": "landed"}},
        headers=as_app).json())
    assert (done.status, done.conclusion) == ("completed", "success")
    listed = api(fake, "GET", f"/commits/{pull.head_sha}/check-runs").json()
    assert [M.CheckRun.model_validate(r).id for r in listed["check_runs"]] == [run.id]
    named = api(fake, "GET", f"/commits/{pull.head_sha}/check-runs",
                params={"check_name": "ci/test"}).json()
    assert named == {"total_count": 0, "check_runs": []}
    M.Status.model_validate(api(fake, "POST", f"/statuses/{pull.head_sha}", json={
        "state": "success", "context": "ci/test"}).json())
    statuses = api(fake, "GET", "/commits/change-1/statuses").json()
    assert [M.Status.model_validate(s).context for s in statuses] == ["ci/test"]
    # (the App endpoints are parsed by githubkit itself in test_github_client.py)
    M.Installation.model_validate(J.installation(fake.base_url, fake.user("acme"), 7, 1))
    event = fake.pull_request_event(1, "labeled", label="merge-queue")
    M.PullRequest.model_validate(event["pull_request"])
    M.Label.model_validate(event["label"])


def test_branch_rules_and_workflow_runs_validate_against_githubs_api_description(
        fake: FakeGitHub) -> None:
    assert api(fake, "GET", "/rules/branches/main").json() == []
    assert api(fake, "GET", "/branches/main/protection/required_status_checks"
               ).status_code == 404
    fake.actions.rulesets["main"] = [["test", "lint"]]
    fake.actions.protection["main"] = ["e2e"]
    rules = api(fake, "GET", "/rules/branches/main").json()
    M.RepositoryRuleDetailedOneof2.model_validate(rules[0])  # deletion
    checks = M.RepositoryRuleDetailedOneof8.model_validate(rules[1])  # required_status_checks
    assert [c.context for c in checks.parameters.required_status_checks] == ["test", "lint"]
    policy = M.StatusCheckPolicy.model_validate(
        api(fake, "GET", "/branches/main/protection/required_status_checks").json())
    assert policy.contexts == ["e2e"]
    fake.actions.protection_readable = False
    assert api(fake, "GET", "/branches/main/protection/required_status_checks"
               ).status_code == 403
    fake.simulate_ci("test")
    fake.actions.hold = True
    fake.repo.set_ref("refs/heads/sq/widgets/p-1", fake.tip())
    fake._run_ci(fake.tip())
    listed = api(fake, "GET", "/actions/runs", params={"branch": "sq/widgets/p-1"}).json()
    [run] = M.ReposOwnerRepoActionsRunsGetResponse200.model_validate(listed).workflow_runs
    assert (run.status, run.head_branch) == ("in_progress", "sq/widgets/p-1")
    assert api(fake, "GET", "/actions/runs", params={"branch": "other"}).json()[
        "total_count"] == 0
    assert api(fake, "POST", f"/actions/runs/{run.id}/cancel").status_code == 202
    assert api(fake, "POST", f"/actions/runs/{run.id}/cancel").status_code == 409
    assert api(fake, "POST", "/actions/runs/1/cancel").status_code == 404
    [check] = fake.check_runs
    assert (check["status"], check["conclusion"]) == ("completed", "cancelled")


def test_ref_update_fast_forwards_only_without_force(fake: FakeGitHub) -> None:
    base = fake.tip()
    pull = fake.open_pull({"a.txt": "1\n"})
    assert api(fake, "PATCH", "/git/refs/heads/main",
               json={"sha": pull.head_sha, "force": False}).status_code == 200
    assert fake.tip() == pull.head_sha  # the real branch moved
    assert (fake.pulls[1].state, fake.pulls[1].merged) == ("closed", True)
    sideways = fake.repo.commit(base, {"b.txt": "2\n"}, "elsewhere")
    refused = api(fake, "PATCH", "/git/refs/heads/main", json={"sha": sideways, "force": False})
    assert (refused.status_code, refused.json()["message"]) == \
        (422, "Update is not a fast forward")
    assert fake.tip() == pull.head_sha
    missing = api(fake, "PATCH", "/git/refs/heads/main", json={"sha": "f" * 40})
    assert missing.status_code == 422
    assert api(fake, "PATCH", "/git/refs/heads/main",
               json={"sha": sideways, "force": True}).status_code == 200
    assert fake.tip() == sideways


def test_lists_are_paged_like_github(fake: FakeGitHub) -> None:
    fake.open_pull({f"f/{i:03}.txt": f"{i}\n" for i in range(130)})
    first = api(fake, "GET", "/pulls/1/files", params={"per_page": 100})
    assert len(first.json()) == 100 and 'rel="next"' in first.headers["link"]
    second = api(fake, "GET", "/pulls/1/files", params={"per_page": 100, "page": 2})
    assert len(second.json()) == 30 and "link" not in second.headers


async def test_the_client_reads_every_page(fake: FakeGitHub) -> None:
    fake.open_pull({f"f/{i:03}.txt": f"{i}\n" for i in range(205)})
    config = GitHubConfig(repository="acme/widgets", api_url=fake.base_url, token_env="T")
    files = await GitHubClient(config, Credentials(token="fake-token")).files(1)
    assert len(files) == 205 and len({f.filename for f in files}) == 205


def test_refuses_bad_credentials_unknown_versions_and_other_repositories(
        fake: FakeGitHub) -> None:
    fake.open_pull({"a.txt": "1\n"})
    bad = httpx.get(f"{fake.base_url}/repos/acme/widgets/pulls/1",
                    headers={"Authorization": "token nope"})
    assert (bad.status_code, bad.json()["message"]) == (401, "Bad credentials")
    old = httpx.get(f"{fake.base_url}/repos/acme/widgets/pulls/1",
                    headers={**HEADERS, "X-GitHub-Api-Version": "2021-01-01"})
    assert old.status_code == 400
    other = httpx.get(f"{fake.base_url}/repos/acme/gadgets/pulls/1", headers=HEADERS)
    assert other.status_code == 404
    assert api(fake, "GET", "/pulls/7").status_code == 404
    assert api(fake, "POST", "/statuses/abc", json={"state": "green"}).status_code == 422


def test_webhook_deliveries_are_signed_as_github_signs_them(fake: FakeGitHub) -> None:
    fake.open_pull({"a.txt": "1\n"})
    body, headers = fake.signed("pull_request", fake.pull_request_event(1, "opened"),
                                b"s3cret", delivery="d-1")
    assert verify("s3cret", body, headers["X-Hub-Signature-256"])
    assert not verify("other", body, headers["X-Hub-Signature-256"])
    assert (headers["X-GitHub-Event"], headers["X-GitHub-Delivery"]) == ("pull_request", "d-1")


async def test_deliver_posts_the_signed_body(fake: FakeGitHub) -> None:
    fake.open_pull({"a.txt": "1\n"})
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202)

    res = await fake.deliver("http://sq.test/api/v1/github/webhook", "issue_comment",
                             fake.comment_event(1, "/submitqueue land", sender="mona"),
                             secret=b"k", transport=httpx.MockTransport(record))
    assert res.status_code == 202
    assert verify("k", seen[0].content, seen[0].headers["x-hub-signature-256"])
    assert seen[0].headers["x-github-event"] == "issue_comment"
