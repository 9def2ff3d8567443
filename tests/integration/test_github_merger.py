"""The ``github`` merger against the served fake GitHub (a real bare repository): the
landing commit is built by the git merger's code, and the base moves only by the API's
fast-forward (``PATCH git/refs/heads/main``, ``force: false``), never forced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.domain.build_run import TestedTree
from app.domain.github_config import GitHubConfig
from app.domain.states import LandStrategy
from app.extensions.base import MergeSpec, MergeStep
from app.extensions.github.client import Credentials, GitHubClient, GitHubUnavailable
from app.extensions.github.fake import FakeGitHub
from app.extensions.github.fake_git import BareRepo
from app.extensions.github.merger import GitHubMerger
from tests.support.fake_github import serve_fake_github

KEY = "github.com/acme/widgets"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeGitHub]:
    with serve_fake_github(tmp_path / "widgets.git") as served:
        yield served


def merger(fake: FakeGitHub, tmp_path: Path, *, token: str = "fake-token") -> GitHubMerger:
    config = GitHubConfig(repository="acme/widgets", api_url=fake.base_url, token_env="T")
    return GitHubMerger({KEY: str(fake.repo.path)}, "main", tmp_path / "work",
                        client=GitHubClient(config, Credentials(token=token)))


def spec(*pulls: tuple[int, str], strategy: LandStrategy = LandStrategy.MERGE,
         tested: tuple[TestedTree, ...] | None = None) -> MergeSpec:
    steps = tuple(MergeStep(f"widgets/{i + 1}", (f"github://{KEY}/pull/{n}/{sha}",), strategy)
                  for i, (n, sha) in enumerate(pulls))
    return MergeSpec(queue="widgets", id="widgets/batch/1", steps=steps, tested=tested)


async def test_lands_by_fast_forward_through_the_api(fake: FakeGitHub, tmp_path: Path) -> None:
    one = fake.open_pull({"a.txt": "1\n"})
    two = fake.open_pull({"b.txt": "2\n"})
    base = fake.tip()
    m = merger(fake, tmp_path)
    assert (await m.check(spec((1, one.head_sha), (2, two.head_sha)))).succeeded
    assert fake.tip() == base and fake.ref_updates == []  # a check moves nothing
    done = await m.merge(spec((1, one.head_sha), (2, two.head_sha)))
    assert done.succeeded, done.reason
    tip = fake.tip()
    assert fake.ref_updates == [("refs/heads/main", tip, False, 200)]
    assert fake.repo.is_ancestor(base, tip) and fake.repo.is_ancestor(two.head_sha, tip)
    assert [fake.pull_json(n)["merged"] for n in (1, 2)] == [True, True]
    assert fake.repo.git("for-each-ref", "refs/heads/sq/").stdout == ""  # side branch gone
    again = await m.merge(spec((1, one.head_sha), (2, two.head_sha)))  # redelivered
    assert again.succeeded and again.outputs == done.outputs
    assert len(fake.ref_updates) == 1 and fake.tip() == tip


async def test_a_base_moved_outside_the_queue_is_never_forced(fake: FakeGitHub,
                                                              tmp_path: Path) -> None:
    pull = fake.open_pull({"a.txt": "1\n"})
    m = merger(fake, tmp_path)
    tested = await m.check(spec((1, pull.head_sha)))
    assert tested.succeeded

    def push_outside(branch: str) -> None:  # someone pushes to main just before the update
        fake.before_ref_update = None
        moved = fake.repo.commit(fake.tip(branch), {"hotfix.txt": "x\n"}, "Hotfix")
        fake.repo.set_ref(f"refs/heads/{branch}", moved)

    fake.before_ref_update = push_outside
    base = fake.tip()
    [commit] = tested.outputs  # what a build on this base tested (commits are deterministic)
    tree = BareRepo(m.mirror(KEY).path).out("rev-parse", f"{commit}^{{tree}}")
    guarded = spec((1, pull.head_sha), tested=(TestedTree(
        commit=commit, tree=tree, base=base, build_id="b-1"),))
    out = await m.merge(guarded)
    assert not out.succeeded and (out.code, out.moved) == ("untested_tree", True)
    assert fake.ref_updates[0][2:] == (False, 422)  # refused, and never retried with force
    assert all(not force for _, _, force, _ in fake.ref_updates)
    assert fake.repo.out("log", "-1", "--format=%s", fake.tip()) == "Hotfix"


async def test_a_ruleset_refusal_fails_the_merge_with_githubs_reason(
        fake: FakeGitHub, tmp_path: Path) -> None:
    pull = fake.open_pull({"a.txt": "1\n"})
    fake.protected["main"] = "Repository rule violations found"
    base = fake.tip()
    out = await merger(fake, tmp_path).merge(spec((1, pull.head_sha)))
    assert not out.succeeded
    assert "Repository rule violations found" in out.reason
    assert "a ruleset or branch protection refused" in out.reason
    assert fake.tip() == base


async def test_github_down_is_retryable_and_lands_nothing(fake: FakeGitHub,
                                                          tmp_path: Path) -> None:
    pull = fake.open_pull({"a.txt": "1\n"})
    base = fake.tip()
    with pytest.raises(GitHubUnavailable):
        await merger(fake, tmp_path, token="revoked").merge(spec((1, pull.head_sha)))
    assert fake.tip() == base
    assert fake.repo.git("for-each-ref", "refs/heads/sq/").stdout == ""


async def test_squashed_pull_requests_are_closed_with_a_comment_and_the_label(
        fake: FakeGitHub, tmp_path: Path) -> None:
    pull = fake.open_pull({"a.txt": "1\n"}, title="Squash me")
    m = merger(fake, tmp_path)
    done = await m.merge(spec((1, pull.head_sha), strategy=LandStrategy.SQUASH_REBASE))
    assert done.succeeded, done.reason
    [landed] = done.commits["widgets/1"]
    assert fake.tip() == landed and not fake.repo.is_ancestor(pull.head_sha, landed)
    closed = fake.pull_json(1)
    assert (closed["state"], closed["merged"]) == ("closed", False)
    assert [lb["name"] for lb in closed["labels"]] == ["merged-by-queue"]
    assert [c["body"] for c in fake.pulls[1].comments] == [
        f"Landed on main by SubmitQueue as {landed} (widgets/1, squash_rebase)."]
    again = await m.merge(spec((1, pull.head_sha), strategy=LandStrategy.SQUASH_REBASE))
    assert again.succeeded and len(fake.pulls[1].comments) == 1  # redelivered: once
