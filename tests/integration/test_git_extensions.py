"""The git change provider and git merger against real repositories in tmp_path.

A bare ``remote.git`` (with reflogs) plays the server; a working clone pushes ``main``
and feature branches to it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.domain.states import LandStrategy
from app.extensions.base import ChangeRejected, MergeSpec, MergeStep
from app.extensions.git.cli import GitError, ref_problem, run_git
from app.extensions.git.merger import GitMerger
from app.extensions.git.provider import GitChangeProvider, parse_numstat
from tests.support.gitremote import ALICE, KEY, Remote, spec, uri

pytestmark = pytest.mark.timeout(60)

@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote(tmp_path)


@pytest.fixture
def provider(remote: Remote, tmp_path: Path) -> GitChangeProvider:
    return GitChangeProvider({KEY: str(remote.bare)}, "main", tmp_path / "mirrors")


@pytest.fixture
def merger(remote: Remote, tmp_path: Path) -> GitMerger:
    return GitMerger({KEY: f"file://{remote.bare}"}, "main", tmp_path / "merger")


# ---------------------------------------------------------------- git runner


async def test_runner_raises_git_error_and_times_out(tmp_path: Path) -> None:
    with pytest.raises(GitError) as info:
        await run_git(["rev-parse", "--verify", "nope"], home=tmp_path / "h", cwd=tmp_path)
    assert info.value.returncode != 0 and info.value.git_args[0] == "rev-parse"
    assert info.value.retryable is True
    # a git alias that sleeps (a child process): the whole group is killed on timeout
    with pytest.raises(TimeoutError, match="timed out"):
        await run_git(["-c", "alias.hang=!sleep 30", "hang"], home=tmp_path / "h",
                      cwd=tmp_path, timeout=0.5)


def test_ref_problem_and_numstat() -> None:
    assert ref_problem("refs/heads/ok-branch") is None
    assert ref_problem("refs/heads/a..b") is not None
    assert ref_problem("refs/heads/a\x01") is not None
    assert ref_problem("heads/x") is not None
    parsed = parse_numstat("3\t1\ta.txt\x00-\t-\tbin.dat\x001\t0\t\x00old.txt\x00new.txt\x00")
    assert [(f.path, f.lines_added, f.lines_deleted) for f in parsed] == [
        ("a.txt", 3, 1), ("bin.dat", 0, 0), ("new.txt", 1, 0)]


# ---------------------------------------------------------------- change provider


async def test_provider_reports_files_lines_renames_author_and_title(
    remote: Remote, provider: GitChangeProvider
) -> None:
    big = remote.show("big.txt") + "\n"
    first = remote.commit(
        "feature",
        {"a.txt": "one\nTWO\nthree\nfour\n", "bin.dat": b"\x00\x01\x02binary",
         "big.txt": None, "moved.txt": big + "extra\n"},
        "first change", base="main", env=ALICE,
    )
    second = remote.commit("feature2", {"c.txt": "c\n"}, "second", base="feature")
    # main moves on independently: the first change's diff is still from the merge base
    remote.commit("main", {"other.txt": "x\n"}, "unrelated on main", base="main")

    got = await provider.get("q", [uri("feature", first), uri("feature2", second)])

    files = {f.path: (f.lines_added, f.lines_deleted) for f in got[0].changed_files}
    assert files == {"a.txt": (2, 1), "bin.dat": (0, 0), "moved.txt": (1, 0)}
    assert (got[0].author_name, got[0].author_email) == ("Alice Author", "alice@example.com")
    assert [d.title for d in got] == ["first change", "second"]  # each commit's subject
    assert [f.path for f in got[1].changed_files] == ["c.txt"]
    assert got[1].uri == uri("feature2", second)


async def test_provider_rejects_a_moved_ref_as_stale(
    remote: Remote, provider: GitChangeProvider
) -> None:
    old = remote.commit("feature", {"f.txt": "1\n"}, "one", base="main")
    new = remote.commit("feature", {"f.txt": "2\n"}, "two")
    with pytest.raises(ChangeRejected, match=f"stale: ref refs/heads/feature now points at {new}"):
        await provider.get("q", [uri("feature", old)])
    with pytest.raises(ChangeRejected, match="no longer exists"):
        await provider.get("q", [uri("gone", old)])


async def test_provider_rejects_unknown_repository_and_other_schemes(
    provider: GitChangeProvider,
) -> None:
    sha = "a" * 40
    with pytest.raises(ChangeRejected, match="does not know"):
        await provider.get("q", [uri("x", sha, key="example.com/other/repo")])
    with pytest.raises(ChangeRejected, match="not a git:// change"):
        await provider.get("q", [f"github://github.com/o/r/pull/1/{sha}"])
    with pytest.raises(ChangeRejected, match="cannot read"):
        await provider.get("q", ["git://nope"])
    with pytest.raises(ChangeRejected, match="names ref"):
        await provider.get("q", [f"git://{KEY}/refs%2Fheads%2Fa..b/{sha}"])


# ---------------------------------------------------------------- merger


async def test_rebase_cherry_picks_each_commit(remote: Remote, merger: GitMerger) -> None:
    remote.commit("feature", {"f.txt": "1\n"}, "f one", base="main")
    head = remote.commit("feature", {"g.txt": "2\n"}, "f two")
    remote.commit("main", {"m.txt": "m\n"}, "main moved", base="main")
    moves = remote.main_moves()

    assert (await merger.check(spec(LandStrategy.REBASE, uri("feature", head)))).succeeded
    assert remote.main_moves() == moves  # a check pushes nothing
    outcome = await merger.merge(spec(LandStrategy.REBASE, uri("feature", head)))

    assert outcome.succeeded, outcome.reason
    log = remote.bare_git("log", "--format=%s", "main").splitlines()
    assert log == ["f two", "f one", "main moved", "initial"]
    assert remote.show("g.txt") == "2" and remote.show("m.txt") == "m"
    assert outcome.outputs == (remote.main(),)
    assert remote.main_moves() == moves + 1


async def test_squash_rebase_one_commit_per_change_with_trailer(
    remote: Remote, merger: GitMerger
) -> None:
    remote.commit("feature", {"f.txt": "1\n"}, "feature subject", base="main", env=ALICE)
    head = remote.commit("feature", {"g.txt": "2\n"}, "more", env=ALICE)

    outcome = await merger.merge(spec(LandStrategy.SQUASH_REBASE, uri("feature", head)))

    assert outcome.succeeded, outcome.reason
    message = remote.bare_git("log", "-n1", "--format=%B", "main")
    assert message.splitlines()[0] == "more (SQ1)"
    assert "Source-Ref: refs/heads/feature" in message
    assert remote.bare_git("log", "-n1", "--format=%an <%ae>", "main") == (
        "Alice Author <alice@example.com>")
    assert remote.bare_git("rev-list", "--count", "main") == "2"
    assert remote.show("f.txt") == "1" and remote.show("g.txt") == "2"


async def test_merge_no_ff_and_fast_forward(remote: Remote, merger: GitMerger) -> None:
    head = remote.commit("feature", {"f.txt": "1\n"}, "f", base="main")
    outcome = await merger.merge(spec(LandStrategy.MERGE, uri("feature", head)))
    assert outcome.succeeded, outcome.reason
    parents = remote.bare_git("rev-list", "--parents", "-n1", "main").split()
    assert len(parents) == 3 and parents[2] == head

    ff = remote.commit("ff", {"h.txt": "h\n"}, "ff change", base="main")
    outcome = await merger.merge(spec(LandStrategy.FAST_FORWARD, uri("ff", ff), step_id="SQ2"))
    assert outcome.succeeded, outcome.reason
    assert remote.main() == ff and outcome.outputs == (ff,)

    # not a descendant of the tip: refused, main untouched
    behind = remote.commit("behind", {"z.txt": "z\n"}, "old base", base="feature")
    outcome = await merger.merge(
        spec(LandStrategy.FAST_FORWARD, uri("behind", behind), step_id="SQ3"))
    assert not outcome.succeeded and "fast-forward" in outcome.reason
    assert remote.main() == ff


async def test_stack_lands_in_one_ref_update(remote: Remote, merger: GitMerger) -> None:
    one = remote.commit("s1", {"s/one.txt": "1\n"}, "stack one", base="main")
    two = remote.commit("s2", {"s/two.txt": "2\n"}, "stack two", base="s1")
    moves = remote.main_moves()

    outcome = await merger.merge(
        spec(LandStrategy.SQUASH_REBASE, uri("s1", one), uri("s2", two)))

    assert outcome.succeeded, outcome.reason
    assert remote.main_moves() == moves + 1
    assert remote.bare_git("log", "--format=%s", "main").splitlines() == [
        "stack two (SQ1)", "stack one (SQ1)", "initial"]
    assert len(outcome.outputs) == 2 and outcome.outputs[1] == remote.main()


async def test_batch_of_two_requests_lands_in_one_ref_update(
    remote: Remote, merger: GitMerger
) -> None:
    a = remote.commit("a", {"a/x.txt": "x\n"}, "request a", base="main")
    b = remote.commit("b", {"b/y.txt": "y\n"}, "request b", base="main")
    moves = remote.main_moves()
    batch = MergeSpec(queue="q", id="B1", steps=(
        MergeStep("SQA", (uri("a", a),), LandStrategy.REBASE),
        MergeStep("SQB", (uri("b", b),), LandStrategy.SQUASH_REBASE),
    ))

    outcome = await merger.merge(batch)

    assert outcome.succeeded, outcome.reason
    assert remote.main_moves() == moves + 1
    assert remote.bare_git("log", "--format=%s", "main").splitlines() == [
        "request b (SQB)", "request a", "initial"]


async def test_conflict_names_the_path_and_leaves_main_untouched(
    remote: Remote, merger: GitMerger
) -> None:
    head = remote.commit("feature", {"a.txt": "one\nFEATURE\nthree\n"}, "feature", base="main")
    remote.commit("main", {"a.txt": "one\nMAIN\nthree\n"}, "main edit", base="main")
    before, moves = remote.main(), remote.main_moves()

    for strategy in (LandStrategy.REBASE, LandStrategy.SQUASH_REBASE, LandStrategy.MERGE):
        check = await merger.check(spec(strategy, uri("feature", head)))
        outcome = await merger.merge(spec(strategy, uri("feature", head)))
        for result in (check, outcome):
            assert not result.succeeded
            assert result.conflicting_paths == ("a.txt",)
            assert "a.txt" in result.reason
    assert remote.main() == before and remote.main_moves() == moves


@pytest.mark.parametrize(
    "strategy",
    [LandStrategy.REBASE, LandStrategy.SQUASH_REBASE, LandStrategy.MERGE,
     LandStrategy.FAST_FORWARD],
)
async def test_redelivery_is_a_noop(
    remote: Remote, merger: GitMerger, strategy: LandStrategy
) -> None:
    head = remote.commit("feature", {"f.txt": "1\n"}, "f", base="main")
    first = await merger.merge(spec(strategy, uri("feature", head)))
    assert first.succeeded, first.reason
    landed, moves = remote.main(), remote.main_moves()
    # the target moves on after the landing: the change is still recognised
    remote.commit("main", {"f.txt": "changed later\n"}, "later", base="main")
    later = remote.main()

    again = await merger.merge(spec(strategy, uri("feature", head)))

    assert again.succeeded, again.reason
    assert remote.main() == later and remote.main_moves() == moves + 1
    assert landed in remote.bare_git("rev-list", "main").split()


async def test_moved_tip_between_check_and_merge_still_lands(
    remote: Remote, merger: GitMerger
) -> None:
    head = remote.commit("feature", {"f.txt": "1\n"}, "f", base="main")
    assert (await merger.check(spec(LandStrategy.SQUASH_REBASE, uri("feature", head)))).succeeded
    moved = remote.commit("main", {"m.txt": "m\n"}, "moved", base="main")

    outcome = await merger.merge(spec(LandStrategy.SQUASH_REBASE, uri("feature", head)))

    assert outcome.succeeded, outcome.reason
    assert remote.bare_git("rev-parse", "main^") == moved


async def test_lost_push_race_reapplies_on_the_new_tip(
    remote: Remote, tmp_path: Path
) -> None:
    class RacingMerger(GitMerger):
        raced = 0

        async def _push(self, mirror, old, new):  # type: ignore[no-untyped-def]
            if not self.raced:
                self.raced += 1
                remote.commit("main", {"race.txt": "r\n"}, "racer", base="main")
            return await super()._push(mirror, old, new)

    merger = RacingMerger({KEY: str(remote.bare)}, "main", tmp_path / "racing")
    head = remote.commit("feature", {"f.txt": "1\n"}, "f", base="main")

    outcome = await merger.merge(spec(LandStrategy.REBASE, uri("feature", head)))

    assert outcome.succeeded, outcome.reason
    assert remote.bare_git("log", "--format=%s", "main").splitlines() == [
        "f", "racer", "initial"]


async def test_merger_rejects_unknown_repo_and_unreachable_remote_raises(
    remote: Remote, tmp_path: Path
) -> None:
    head = remote.commit("feature", {"f.txt": "1\n"}, "f", base="main")
    merger = GitMerger({KEY: str(tmp_path / "missing.git")}, "main", tmp_path / "m2")
    outcome = await merger.check(spec(LandStrategy.REBASE, uri("feature", head, key="x.org/y")))
    assert not outcome.succeeded and "does not know" in outcome.reason
    with pytest.raises(GitError):
        await merger.merge(spec(LandStrategy.REBASE, uri("feature", head)))
