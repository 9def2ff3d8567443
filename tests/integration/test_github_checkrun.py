"""The SubmitQueue check-run writer (``app/extensions/github/checkrun.py``) against the
fake GitHub: an App writes one check-run per (request, head) and updates it in place,
a replay writes nothing twice, a token writes commit statuses (GitHub lets only Apps
write check-runs), and GitHub down is retryable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from app.domain.checkrun import CHECK_NAME, CheckFacts
from app.domain.github_config import GitHubConfig
from app.extensions.github.checkrun import CheckRunPublisher
from app.extensions.github.client import Credentials, GitHubClient, GitHubUnavailable
from app.extensions.github.fake import FakeGitHub, app_key_pair

API = "http://fake-github.test"


@pytest.fixture(scope="module")
def keys() -> tuple[str, str]:
    return app_key_pair()


def publisher(fake: FakeGitHub, *, app: tuple[str, str] | None) -> CheckRunPublisher:
    fake.base_url = API
    if app is None:
        config = GitHubConfig(repository="acme/widgets", api_url=API, token_env="T")
        creds = Credentials(token=fake.token)
    else:
        config = GitHubConfig(repository="acme/widgets", api_url=API, app_id=fake.app_id,
                              private_key_env="K")
        creds = Credentials(app_id=fake.app_id, private_key=app[0])
    return CheckRunPublisher(GitHubClient(config, creds,
                                          transport=httpx.ASGITransport(app=fake.app)))


def facts(sqid: str, *heads: tuple[int, str], status: str = "queued",
          stage: str = "batching") -> CheckFacts:
    return CheckFacts(sqid=sqid, queue="widgets", status=status, stage=stage,
                      page_url=f"http://sq.test/queues/widgets/requests/{sqid[-1]}",
                      change_uris=tuple(f"github://github.com/acme/widgets/pull/{n}/{sha}"
                                        for n, sha in heads), position=1, p_land=0.9)


def ours(fake: FakeGitHub) -> list[dict[str, object]]:
    return [r for r in fake.check_runs if r["name"] == CHECK_NAME]


async def test_an_app_writes_one_check_run_per_request_and_updates_it(
        tmp_path: Path, keys: tuple[str, str]) -> None:
    fake = FakeGitHub(tmp_path / "w.git", app_public_key=keys[1])
    one, two = fake.open_pull({"a.txt": "1\n"}), fake.open_pull({"b.txt": "2\n"})
    pub = publisher(fake, app=keys)
    queued = facts("widgets/1", (1, one.head_sha), (2, two.head_sha))
    assert await pub.publish(queued) == 2
    assert [(r["head_sha"], r["status"], r["external_id"]) for r in ours(fake)] == [
        (one.head_sha, "queued", "widgets/1"), (two.head_sha, "queued", "widgets/1")]
    assert ours(fake)[0]["title"] == "Queued · #1 in line · 90 % chance to land"
    landed = replace(queued, status="landed", stage="landed", landed_commits=("c" * 40,))
    await pub.publish(landed)
    await pub.publish(landed)  # a replayed message: the same runs, the same content
    assert [(r["status"], r.get("conclusion"), r["title"]) for r in ours(fake)] == [
        ("completed", "success", "Landed as " + "c" * 12)] * 2
    # the same head queued again later (a new request) gets a run of its own
    await pub.publish(facts("widgets/4", (1, one.head_sha)))
    assert [r["external_id"] for r in ours(fake)] == ["widgets/1", "widgets/1", "widgets/4"]
    assert ours(fake)[0]["status"] == "completed"


async def test_a_token_writes_commit_statuses_instead(tmp_path: Path) -> None:
    fake = FakeGitHub(tmp_path / "w.git")
    pull = fake.open_pull({"a.txt": "1\n"})
    pub = publisher(fake, app=None)
    assert not pub.uses_check_runs
    await pub.publish(facts("widgets/1", (1, pull.head_sha)))
    await pub.publish(replace(facts("widgets/1", (1, pull.head_sha)), status="error",
                              stage="error", removal_text="merge conflict in a.txt"))
    assert [(s["context"], s["state"], s["description"]) for s in fake.statuses] == [
        ("SubmitQueue", "pending", "Queued · #1 in line · 90 % chance to land"),
        ("SubmitQueue", "failure", "Removed: merge conflict in a.txt")]
    assert fake.statuses[-1]["target_url"] == "http://sq.test/queues/widgets/requests/1"
    assert ours(fake) == []


async def test_a_removal_comments_once_per_pull_request_when_the_queue_asks(
        tmp_path: Path) -> None:
    fake = FakeGitHub(tmp_path / "w.git")
    one, two = fake.open_pull({"a.txt": "1\n"}), fake.open_pull({"b.txt": "2\n"})
    pub = publisher(fake, app=None)
    quiet = publisher(fake, app=None)
    pub.comment_removals = True
    queued = facts("widgets/1", (1, one.head_sha), (2, two.head_sha))
    await pub.publish(queued)  # in flight: no comment
    assert fake.pulls[1].comments == []
    removed = replace(queued, status="error", stage="error", reason="build_failed",
                      removal_text="its build failed: check 'test' failed",
                      next_steps=("fix the test and label the pull request again",))
    await quiet.publish(removed)  # a queue without removal_comment: no comment
    assert fake.pulls[1].comments == []
    await pub.publish(removed)
    await pub.publish(removed)  # a replayed message: nothing twice
    for number in (1, 2):
        [comment] = fake.pulls[number].comments
        body = comment["body"]
        assert body.startswith("SubmitQueue removed this pull request from queue `widgets`.")
        assert "Reason: `build_failed`" in body and "check 'test' failed" in body
        assert "fix the test and label the pull request again" in body
        assert body.endswith("<!-- submitqueue:removed:widgets/1 -->")
    landed = replace(facts("widgets/3", (1, one.head_sha)), status="landed", stage="landed")
    await pub.publish(landed)
    assert len(fake.pulls[1].comments) == 1  # landing comments nothing


async def test_changes_of_other_repositories_get_nothing(tmp_path: Path) -> None:
    fake = FakeGitHub(tmp_path / "w.git")
    uri = "git://git.example.com/acme/widgets/refs%2Fheads%2Fx/" + "a" * 40
    pub = publisher(fake, app=None)
    assert await pub.publish(replace(facts("widgets/1"), change_uris=(uri,))) == 0
    assert fake.statuses == []


async def test_github_down_is_retryable(tmp_path: Path) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, json={"message": "Bad gateway"})

    config = GitHubConfig(repository="acme/widgets", api_url=API, token_env="T")
    pub = CheckRunPublisher(GitHubClient(config, Credentials(token="t"),
                                         transport=httpx.MockTransport(down)))
    with pytest.raises(GitHubUnavailable):
        await pub.publish(facts("widgets/1", (1, "a" * 40)))
