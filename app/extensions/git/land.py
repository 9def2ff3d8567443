"""Applying merge steps onto a tip in the shape their strategies land them: shared by the
git merger (which pushes the result) and the command build runner (which builds it).

Because the build tree and the landing are made by this one procedure, with the queue's
fixed committer identity and dates taken from the source commits (``git.apply.stamp``),
applying the same steps onto the same tip gives byte-identical commits in both: the
landing fast-forwards the target to exactly the commit that was tested.

Strategies (per step), and when a change counts as already on the tip (skipped):

- ``rebase``: cherry-pick each commit of merge-base(tip, head)..head; skipped per
  commit when a patch-equivalent commit is there (``git cherry``).
- ``squash_rebase``: one commit per change, ``<subject> (<step_id>)`` plus trailers
  ``Source-Ref: <ref>`` and ``Source-Commit: <sha>``, author = the pinned commit's;
  skipped when a commit carries the same ``Source-Commit``, or no net change.
- ``merge``: ``git merge --no-ff`` per change; skipped when the commit is an ancestor.
- ``fast_forward``: the tip becomes the exact SHA (a descendant of the tip); skipped
  when the SHA is already an ancestor. The merger lands it only as the one change of a
  one-step merge (``single_fast_forward``).

A conflict raises ``git.apply.Conflict``; a permanent problem with a step ``Refused``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.domain.states import LandStrategy
from app.extensions.base import MergeStep
from app.extensions.git.apply import (
    cherry_pick,
    git_or_conflict,
    head,
    is_ancestor,
    squash_commit_of,
    stamp,
)
from app.extensions.git.cli import GitChange, GitMirror


class Refused(Exception):
    """A permanent problem with a step (not a conflict)."""


@dataclass(frozen=True, slots=True)
class Applied:
    tip: str
    landed: tuple[tuple[MergeStep, GitChange, str], ...]  # (step, change, commit) in order

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(commit for _, _, commit in self.landed)

    @property
    def commits(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for step, _, commit in self.landed:
            out[step.step_id] = (*out.get(step.step_id, ()), commit)
        return out


async def apply_steps(
    mirror: GitMirror, wt: Path, steps: Sequence[tuple[MergeStep, Sequence[GitChange]]],
    *, single_fast_forward: bool = True,
) -> Applied:
    """Apply every step onto the worktree's HEAD, in order."""
    landed: list[tuple[MergeStep, GitChange, str]] = []
    for step, changes in steps:
        if single_fast_forward and step.strategy is LandStrategy.FAST_FORWARD and (
            len(steps) != 1 or len(changes) != 1
        ):
            raise Refused(
                "fast_forward lands exactly one change: the request must be one "
                f"step with one change (step {step.step_id} has {len(changes)}, "
                f"the merge has {len(steps)} steps)"
            )
        previous: str | None = None
        for change in changes:
            commit = await apply_change(mirror, wt, step, change, previous)
            landed.append((step, change, commit))
            previous = change.sha
    return Applied(tip=await head(mirror, wt), landed=tuple(landed))


async def apply_change(
    mirror: GitMirror, wt: Path, step: MergeStep, change: GitChange, previous: str | None,
) -> str:
    """Apply one change in its step's strategy; returns the commit it landed as."""
    strategy = step.strategy
    if strategy is LandStrategy.REBASE:
        if await is_ancestor(mirror, wt, change.sha, "HEAD"):
            return change.sha
        if not await cherry_pick(mirror, wt, change, previous):
            return await _equivalent_on_head(mirror, wt, change) or await head(mirror, wt)
    elif strategy is LandStrategy.SQUASH_REBASE:
        found = await _squash(mirror, wt, step, change)
        if found:
            return found
    elif strategy is LandStrategy.MERGE:
        if await is_ancestor(mirror, wt, change.sha, "HEAD"):
            return await _merge_commit_of(mirror, wt, change) or change.sha
        when = (await stamp(mirror, change.sha))["GIT_COMMITTER_DATE"]
        await git_or_conflict(
            mirror, wt, change,
            "merge", "--no-ff", "--no-edit", "--no-verify",
            "-m", f"Merge {change.ref} ({step.step_id})\n\nSource-Ref: {change.ref}",
            change.sha, env={"GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when},
        )
    elif strategy is LandStrategy.FAST_FORWARD:
        if not await is_ancestor(mirror, wt, change.sha, "HEAD"):
            if not await is_ancestor(mirror, wt, "HEAD", change.sha):
                raise Refused(
                    f"cannot fast-forward: {change.sha} ({change.ref}) does not descend "
                    "from the target tip; rebase it or use another strategy"
                )
            await mirror.git("merge", "--ff-only", "--quiet", change.sha, cwd=wt)
        return change.sha
    else:  # pragma: no cover - exhaustive over LandStrategy
        raise Refused(f"unknown strategy {strategy!r}")
    return await head(mirror, wt)


async def _equivalent_on_head(mirror: GitMirror, wt: Path, change: GitChange) -> str:
    """The newest commit of HEAD patch-equivalent to one of the change's ("" if none)."""
    res = await mirror.git("log", "--cherry-mark", "--right-only", "--no-merges",
                           "--format=%m %H", f"{change.sha}...HEAD", cwd=wt)
    for line in res.stdout.splitlines():
        mark, _, commit = line.partition(" ")
        if mark == "=":
            return commit.strip()
    return ""


async def _merge_commit_of(mirror: GitMirror, wt: Path, change: GitChange) -> str:
    """The oldest merge commit of HEAD with the change's commit as a parent ("" if none)."""
    res = await mirror.git("rev-list", "--merges", "--parents", "--ancestry-path",
                           f"{change.sha}..HEAD", cwd=wt)
    found = ""
    for line in res.stdout.splitlines():
        commit, *parents = line.split()
        if change.sha in parents[1:]:
            found = commit
    return found


async def _squash(mirror: GitMirror, wt: Path, step: MergeStep, change: GitChange) -> str:
    """Squash the change onto HEAD; returns the target commit if it already landed."""
    trailer = f"Source-Commit: {change.sha}"
    found = await squash_commit_of(mirror, wt, change)
    if found:
        return found
    await git_or_conflict(mirror, wt, change, "merge", "--squash", "--quiet", change.sha)
    staged = await mirror.git("diff", "--cached", "--quiet", cwd=wt, check=False)
    if staged.returncode == 0:  # no net change: the tip holds it already
        return await head(mirror, wt)
    info = await mirror.git("show", "-s", "--format=%s%x00%an%x00%ae%x00%aI%x00%cI",
                            change.sha)
    subject, name, email, date, committed = info.stdout.rstrip("\n").split("\x00", 4)
    message = (
        f"{subject} ({step.step_id})\n\nSource-Ref: {change.ref}\n{trailer}\n"
    )
    await mirror.git(
        "commit", "--quiet", "--no-verify", "--cleanup=whitespace", "-m", message, cwd=wt,
        env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
             "GIT_COMMITTER_DATE": committed},
    )
    return ""
