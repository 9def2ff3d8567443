"""The ``github`` merger: the git merger, landing through GitHub's API without force.

Everything but the final update is the git merger's (``app/extensions/git/merger.py``):
fetch, apply the steps onto the target tip, the exact-trees guard (only a tested commit
or tree lands), idempotent redelivery, outputs. The update is different:

1. push the new tip to a side branch ``sq/land/<sha>`` (so GitHub has the commit),
2. ``PATCH /repos/{owner}/{repo}/git/refs/heads/{target}`` with ``{sha, force: false}``:
   GitHub moves the base only on a fast-forward, so the base receives exactly the
   commit built and tested,
3. delete the side branch (also when 2 failed).

A refused fast-forward whose base moved meanwhile (a push outside the queue) is the git
merger's lost race: it re-fetches, re-applies, and the exact-trees guard then refuses
the untested result (``untested_tree``, ``moved``: the batch fails and is re-planned).
A refusal while the base did not move (a ruleset, branch protection, a required
check) fails the merge with GitHub's answer as the reason; it is never forced.
GitHub failures (5xx, timeouts) propagate as ``GitHubUnavailable`` (retryable).

Pull requests landed with the ``merge`` or ``fast_forward`` strategy have their commits
on the base, and GitHub marks them merged. Squashed or rebased ones (other commits
landed) are closed with a comment naming the landed commits and the label
``merged-by-queue``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.domain.github_config import MERGED_LABEL
from app.domain.states import LandStrategy
from app.extensions.base import MergeOutcome, MergeSpec
from app.extensions.git.cli import GitError, GitMirror
from app.extensions.git.merger import GitMerger
from app.extensions.github.client import GitHubClient


class FastForwardRefused(Exception):
    """GitHub refused the fast-forward although the base had not moved."""

    retryable = False


class GitHubMerger(GitMerger):
    def __init__(self, repos: Mapping[str, str], target_branch: str, work_dir: Path, *,
                 client: GitHubClient, **kw: Any) -> None:
        super().__init__(repos, target_branch, work_dir, **kw)
        self.client = client

    async def merge(self, spec: MergeSpec) -> MergeOutcome:
        try:
            out = await super().merge(spec)
        except FastForwardRefused as exc:
            return MergeOutcome(succeeded=False, reason=str(exc))
        if out.succeeded:
            await self._close_rewritten(spec, out)
        return out

    async def _close_rewritten(self, spec: MergeSpec, out: MergeOutcome) -> None:
        """Close each pull request landed as other commits than its own (``rebase``,
        ``squash_rebase``) with a comment naming them and the ``merged-by-queue`` label;
        GitHub marks the others merged by itself. One closed already is left alone, so a
        redelivered merge comments once."""
        for step in spec.steps:
            if step.strategy not in (LandStrategy.REBASE, LandStrategy.SQUASH_REBASE):
                continue
            commits = ", ".join(out.commits.get(step.step_id, ())) or "no new commit"
            for uri in step.change_uris:
                number = int(uri.partition("?")[0].split("/")[-2])
                if (await self.client.pull(number)).state != "open":
                    continue
                await self.client.close_landed(
                    number, f"Landed on {self.target_branch} by SubmitQueue as {commits} "
                    f"({step.step_id}, {step.strategy.value}).", MERGED_LABEL)

    async def _push(self, mirror: GitMirror, old: str, new: str) -> bool:
        """Land ``new`` on the target through the API (module docstring); False when the
        base moved away from ``old`` (the caller re-applies)."""
        side = f"refs/heads/sq/land/{new}"
        res = await mirror.git("push", "--porcelain", "--quiet", "--", mirror.url,
                               f"{new}:{side}", check=False)
        if res.returncode != 0:
            raise GitError(["push", mirror.url, side], res.returncode, res.stderr + res.stdout)
        try:
            refused = await self.client.fast_forward(self.target_branch, new)
        finally:
            await mirror.git("push", "--quiet", "--", mirror.url, f":{side}", check=False)
        if refused is None:
            await mirror.update("update-ref", self.target_ref, new)
            return True
        now = await self.client.branch_tip(self.target_branch)
        if now is not None and now != old:
            return False  # the base moved outside the queue: re-apply, then the guard decides
        raise FastForwardRefused(
            f"{refused}; {self.target_branch} is still at {old}, so a ruleset or branch "
            "protection refused the queue's update: allow the queue's GitHub App (or "
            "token) to update the branch; nothing was forced")
