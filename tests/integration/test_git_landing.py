"""What the git merger reports and does once changes land: the landed commit per change
and per request (also when a redelivery finds them already landed), and, with
``move_head_branches``, each change's branch moved to its landed commit."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.domain.states import LandStrategy
from app.extensions.base import MergeSpec, MergeStep
from app.extensions.git.merger import GitMerger
from tests.support.gitremote import KEY, Remote, spec, uri

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote(tmp_path)


def merger_for(remote: Remote, tmp_path: Path, *, move: bool = False) -> GitMerger:
    return GitMerger({KEY: f"file://{remote.bare}"}, "main", tmp_path / "merger",
                     move_head_branches=move)


@pytest.mark.parametrize(
    "strategy",
    [LandStrategy.REBASE, LandStrategy.SQUASH_REBASE, LandStrategy.MERGE,
     LandStrategy.FAST_FORWARD],
)
async def test_a_redelivered_merge_reports_the_same_landed_commits(
    remote: Remote, tmp_path: Path, strategy: LandStrategy
) -> None:
    merger = merger_for(remote, tmp_path)
    head = remote.commit("feature", {"f.txt": "1\n"}, "f", base="main")
    first = await merger.merge(spec(strategy, uri("feature", head)))
    assert first.succeeded, first.reason
    landed = remote.main()
    assert first.outputs == (landed,) and first.commits == {"SQ1": (landed,)}
    # the target moves on (touching the same file, so nothing is patch-equivalent by
    # accident): the redelivery still names the commit the change landed as
    remote.commit("main", {"f.txt": "changed later\n"}, "later", base="main")

    again = await merger.merge(spec(strategy, uri("feature", head)))

    assert again.succeeded, again.reason
    assert again.commits == {"SQ1": (landed,)} and again.outputs == (landed,)


async def test_each_request_of_a_batch_gets_its_own_commits(
    remote: Remote, tmp_path: Path
) -> None:
    merger = merger_for(remote, tmp_path)
    a1 = remote.commit("a", {"a/x.txt": "x\n"}, "a one", base="main")
    a2 = remote.commit("a2", {"a/y.txt": "y\n"}, "a two", base="a")
    b = remote.commit("b", {"b/y.txt": "y\n"}, "request b", base="main")
    batch = MergeSpec(queue="q", id="B1", steps=(
        MergeStep("SQA", (uri("a", a1), uri("a2", a2)), LandStrategy.SQUASH_REBASE),
        MergeStep("SQB", (uri("b", b),), LandStrategy.REBASE),
    ))

    outcome = await merger.merge(batch)

    assert outcome.succeeded, outcome.reason
    log = remote.bare_git("log", "--format=%H %s", "main").splitlines()
    by_subject = {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in log}
    assert outcome.commits == {
        "SQA": (by_subject["a one (SQA)"], by_subject["a two (SQA)"]),
        "SQB": (by_subject["request b"],),
    }
    assert outcome.outputs == (*outcome.commits["SQA"], *outcome.commits["SQB"])


async def test_head_branches_move_to_their_landed_commits_when_configured(
    remote: Remote, tmp_path: Path
) -> None:
    merger = merger_for(remote, tmp_path, move=True)
    one = remote.commit("s1", {"s/one.txt": "1\n"}, "stack one", base="main")
    two = remote.commit("s2", {"s/two.txt": "2\n"}, "stack two", base="s1")

    outcome = await merger.merge(
        spec(LandStrategy.SQUASH_REBASE, uri("s1", one), uri("s2", two)))

    assert outcome.succeeded, outcome.reason
    landed_one, landed_two = outcome.commits["SQ1"]
    assert remote.bare_git("rev-parse", "refs/heads/s2") == landed_two == remote.main()
    assert remote.bare_git("rev-parse", "refs/heads/s1") == landed_one
    assert remote.bare_git("rev-parse", "main^") == landed_one

    # a redelivery finds the branches moved already and leaves them so
    again = await merger.merge(
        spec(LandStrategy.SQUASH_REBASE, uri("s1", one), uri("s2", two)))
    assert again.succeeded, again.reason
    assert again.commits == outcome.commits
    assert remote.bare_git("rev-parse", "refs/heads/s2") == landed_two


async def test_head_branches_are_untouched_when_not_configured_or_moved_on(
    remote: Remote, tmp_path: Path
) -> None:
    plain = merger_for(remote, tmp_path)
    head = remote.commit("feature", {"f.txt": "1\n"}, "f", base="main")
    outcome = await plain.merge(spec(LandStrategy.SQUASH_REBASE, uri("feature", head)))
    assert outcome.succeeded, outcome.reason
    assert remote.bare_git("rev-parse", "refs/heads/feature") == head != remote.main()

    # configured, but the branch moved on after the change was pinned: left alone
    moving = merger_for(remote, tmp_path / "moving", move=True)
    pinned = remote.commit("later", {"l.txt": "1\n"}, "pinned", base="main")
    newer = remote.commit("later", {"l.txt": "2\n"}, "pushed afterwards")
    outcome = await moving.merge(
        spec(LandStrategy.SQUASH_REBASE, uri("later", pinned), step_id="SQ2"))
    assert outcome.succeeded, outcome.reason
    assert remote.show("l.txt") == "1"
    assert remote.bare_git("rev-parse", "refs/heads/later") == newer


async def test_a_gate_that_refuses_right_before_the_push_moves_no_ref(
    remote: Remote, tmp_path: Path
) -> None:
    """The queue's freeze is the merge's gate: asked after the fetch and the apply, right
    before the ref update; a refusal pushes nothing and says ``held`` (the merge stage
    holds the message), and the same merge lands once the gate opens."""
    merger = merger_for(remote, tmp_path)
    head = remote.commit("feature", {"g.txt": "1\n"}, "g", base="main")
    before = remote.main()
    asked: list[str] = []

    async def frozen() -> str:
        asked.append(remote.main())  # the target as the gate sees it: not moved yet
        return "frozen: release cut (manual by ops)"

    base = spec(LandStrategy.REBASE, uri("feature", head))
    held = await merger.merge(MergeSpec(queue=base.queue, id=base.id, steps=base.steps,
                                        gate=frozen))
    assert (held.succeeded, held.code, held.reason) == (
        False, "held", "frozen: release cut (manual by ops)")
    assert asked == [before] and remote.main() == before

    async def open_() -> str:
        return ""

    landed = await merger.merge(MergeSpec(queue=base.queue, id=base.id, steps=base.steps,
                                          gate=open_))
    assert landed.succeeded and remote.main() != before
