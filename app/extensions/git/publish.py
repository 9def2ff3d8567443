"""The tree of a build whose CI runs elsewhere (webhook runner): made by the queue, in
the shape the strategies land it (``tree.py``), then pushed to the repository as the
queue ref ``refs/sq/builds/<build id>`` for the CI to fetch. The CI builds exactly that
commit; the queue accepts a verdict only for that sha.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from app.extensions.base import BuildRequest, TestedTree
from app.extensions.git.apply import tree_of
from app.extensions.git.cli import DEFAULT_TIMEOUT, GitMirror, mirror_name, repo_url
from app.extensions.git.locking import mirror_lock
from app.extensions.git.tree import speculative_tree

BUILD_REF_PREFIX = "refs/sq/builds/"


def build_ref(build_id: str) -> str:
    return f"{BUILD_REF_PREFIX}{build_id}"


class TreePublisher:
    def __init__(self, repos: Mapping[str, str], target_branch: str, work_dir: Path, *,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.repos = dict(repos)
        self.target_branch = target_branch
        self.work_dir = Path(work_dir)
        self.timeout = timeout

    def _mirror(self, key: str) -> GitMirror:
        return GitMirror(self.work_dir / "mirrors" / mirror_name(key), repo_url(self.repos[key]),
                         self.work_dir / ".home", self.timeout)

    async def publish(self, request: BuildRequest, build_id: str, *,
                      ref: str | None = None) -> TestedTree:
        """Make the build's tree and push it as ``ref`` (default ``build_ref(build_id)``;
        the github_checks runner pushes a branch); raises ``TreeRefused`` when the
        changes cannot be combined (the build fails)."""
        tested, _ = await self.publish_unless_same(request, build_id, ref=ref)
        return tested

    async def publish_unless_same(self, request: BuildRequest, build_id: str, *,
                                  ref: str | None = None, same_as: str = "",
                                  same_ref: str = "") -> tuple[TestedTree, bool]:
        """``publish``; but when the tree made is exactly the tree of commit ``same_as``
        (e.g. a pull request's head whose checks passed), push it as ``same_ref``
        instead (a ref no CI runs on). Returns the tree and whether it was ``same_as``'s."""
        used: list[GitMirror] = []

        def mirror_for(key: str) -> GitMirror:
            used.append(self._mirror(key))
            return used[-1]

        async with speculative_tree(
            path=self.work_dir / "trees" / build_id, mirror_for=mirror_for, repos=self.repos,
            target_branch=self.target_branch, base_changes=request.base_changes,
            head_changes=request.head_changes, say=lambda _: None, steps=request.steps,
        ) as tree:
            mirror = used[-1]
            async with mirror_lock(mirror.path):
                same = bool(same_as) and await tree_of(mirror, same_as) == tree.tree
                to = same_ref if same else (ref or build_ref(build_id))
                await mirror.git("push", "--quiet", "--force", "--", mirror.url,
                                 f"{tree.head}:{to}")
            return TestedTree(base=tree.base, commit=tree.head, tree=tree.tree,
                              changes=tree.changes, build_id=build_id), same
