"""Exact trees (issue 18), on real git: a landing's tree is always a passed build's tree,
or the merge is refused ``untested_tree`` and the target is left as it was.

Builds are made by the command runner's own tree maker (``git/tree.py``), either in
the request's strategy shape (what the queue does) or the old way (every change's
commits cherry-picked, whatever the strategy), so the guard meets trees that differ
from the landing's. Histories include a constructed one where a 3-way merge and a
cherry-pick of the same branch give different trees: the branch changes ``f.txt`` x→y
and back y→x, while ``main`` changed x→y on its own after the fork (merge: y; the
cherry-picks: x).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.states import LandStrategy
from app.extensions.base import MergeSpec, MergeStep, TestedTree
from app.extensions.git.cli import GitMirror
from app.extensions.git.merger import GitMerger
from app.extensions.git.tree import TreeRefused, speculative_tree
from tests.support.gitremote import KEY, Remote, uri

pytestmark = pytest.mark.timeout(600)

STRATEGIES = list(LandStrategy)
FILES = ("f.txt", "g.txt", "h.txt")


def divergent(remote: Remote) -> list[str]:
    """A branch whose 3-way merge and cherry-pick onto main give different trees."""
    remote.commit("main", {"f.txt": "x\n"}, "f is x", base="main")
    remote.commit("side", {"f.txt": "y\n"}, "f becomes y", base="main")
    back = remote.commit("side", {"f.txt": "x\n"}, "f back to x")
    remote.commit("main", {"f.txt": "y\n"}, "main makes f y on its own", base="main")
    return [uri("side", back)]


def stack(remote: Remote, edits: list[tuple[str, str]]) -> list[str]:
    """A stack of one change per edit (file, content), each on top of the last."""
    uris, base = [], "main"
    for i, (name, content) in enumerate(edits):
        sha = remote.commit(f"s{i}", {name: f"{content}edit {i}\n"}, f"edit {i}", base=base)
        uris.append(uri(f"s{i}", sha))
        base = f"s{i}"
    return uris


async def build(remote: Remote, root: Path, uris: list[str], strategy: LandStrategy,
                shaped: bool) -> TestedTree | None:
    """What a build of ``uris`` tests (None: it could not make the tree)."""
    def mirror_for(key: str) -> GitMirror:
        return GitMirror(root / "builds" / "mirror.git", f"file://{remote.bare}",
                         root / "builds" / ".home")
    steps = (MergeStep("SQ1", tuple(uris), strategy),) if shaped else ()
    try:
        async with speculative_tree(
            path=root / "builds" / "tree", mirror_for=mirror_for,
            repos={KEY: f"file://{remote.bare}"}, target_branch="main", base_changes=(),
            head_changes=tuple(uris), say=lambda _: None, steps=steps,
        ) as tree:
            return TestedTree(base=tree.base, commit=tree.head, tree=tree.tree,
                              changes=tree.changes, build_id="b1")
    except TreeRefused:
        return None


async def land(remote: Remote, root: Path, uris: list[str], strategy: LandStrategy,
               shaped: bool, move: bool) -> None:
    tested = await build(remote, root, uris, strategy, shaped)
    if move:  # someone pushes straight to main between the build and the landing
        remote.commit("main", {"moved.txt": "outside\n"}, "outside the queue", base="main")
    before = remote.main()
    merger = GitMerger({KEY: f"file://{remote.bare}"}, "main", root / "merger")
    outcome = await merger.merge(MergeSpec(queue="q", id="B1", steps=(
        MergeStep("SQ1", tuple(uris), strategy),), tested=(tested,) if tested else ()))
    after = remote.main()
    if outcome.succeeded and after != before:
        assert tested is not None
        assert remote.bare_git("rev-parse", "main^{tree}") == tested.tree
    if not outcome.succeeded:
        assert after == before, "a refused merge pushed nothing"
    if outcome.code == "untested_tree":
        assert outcome.moved is (tested is not None and tested.base != before)
    one_ff = strategy is not LandStrategy.FAST_FORWARD or len(uris) == 1
    if shaped and not move and tested is not None and one_ff:
        # the build made the very commits the landing makes: main IS the tested commit
        assert outcome.succeeded, outcome.reason
        assert after == tested.commit
    if move and tested is not None and after != before:
        raise AssertionError("landed on a tip no build ran on")


EDITS = st.lists(st.tuples(st.sampled_from(FILES), st.sampled_from(["1\n", "2\n", "3\n"])),
                 min_size=1, max_size=3)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(edits=EDITS, history=st.sampled_from(["stack", "divergent"]),
       strategy=st.sampled_from(STRATEGIES), shaped=st.booleans(), move=st.booleans())
def test_every_landing_is_a_passed_builds_tree_or_refused_untested(
    edits: list[tuple[str, str]], history: str, strategy: LandStrategy, shaped: bool,
    move: bool,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        remote = Remote(root)
        uris = divergent(remote) if history == "divergent" else stack(remote, edits)
        asyncio.run(land(remote, root, uris, strategy, shaped, move))


async def test_a_merge_whose_tree_differs_from_the_cherry_picked_build_is_refused(
    tmp_path: Path
) -> None:
    remote = Remote(tmp_path)
    uris = divergent(remote)
    tested = await build(remote, tmp_path, uris, LandStrategy.MERGE, shaped=False)
    assert tested is not None
    built = tmp_path / "builds" / "mirror.git"  # the build's own mirror holds its commit
    assert remote.git("show", f"{tested.commit}:f.txt", cwd=built) == "x"  # picked: x
    before = remote.main()
    merger = GitMerger({KEY: f"file://{remote.bare}"}, "main", tmp_path / "merger")
    outcome = await merger.merge(MergeSpec(queue="q", id="B1", steps=(
        MergeStep("SQ1", tuple(uris), LandStrategy.MERGE),), tested=(tested,)))
    assert not outcome.succeeded and outcome.code == "untested_tree"
    assert outcome.moved is False and outcome.tip == before
    assert "no passed build tested" in outcome.reason and "nothing was pushed" in outcome.reason
    assert remote.main() == before
    # built in the merge's own shape, the same landing goes through, as that very commit
    shaped = await build(remote, tmp_path / "again", uris, LandStrategy.MERGE, shaped=True)
    assert shaped is not None and remote.git(
        "show", f"{shaped.commit}:f.txt", cwd=tmp_path / "again" / "builds" / "mirror.git") == "y"
    landed = await merger.merge(MergeSpec(queue="q", id="B1", steps=(
        MergeStep("SQ1", tuple(uris), LandStrategy.MERGE),), tested=(shaped,)))
    assert landed.succeeded, landed.reason
    assert remote.main() == shaped.commit
