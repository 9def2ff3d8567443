"""Applying changes in a scratch worktree of a mirror: shared by the git merger (which
lands them) and the command build runner (which builds the speculative tree).

Every helper runs git through ``GitMirror.git`` (an argv list in a fixed environment,
never a shell). A git command that stops on a conflict raises ``Conflict`` naming the
conflicting paths; any other git failure raises ``GitError`` (infrastructure).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from app.extensions.gitutil import GitChange, GitError, GitMirror


class Conflict(Exception):
    """Applying ``change`` stopped on conflicts in ``paths``."""

    def __init__(self, change: GitChange, paths: tuple[str, ...]) -> None:
        super().__init__(change.uri)
        self.change = change
        self.paths = paths


@asynccontextmanager
async def worktree(mirror: GitMirror, path: Path, commit: str) -> AsyncIterator[Path]:
    """A detached worktree of ``mirror`` at ``path`` checked out at ``commit``; removed
    (directory and git's record of it) when the block ends, whatever happened."""
    path.parent.mkdir(parents=True, exist_ok=True)
    await mirror.git("worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        await remove_worktree(mirror, path)


async def remove_worktree(mirror: GitMirror, path: Path) -> None:
    await mirror.git("worktree", "remove", "--force", str(path), check=False)
    shutil.rmtree(path, ignore_errors=True)
    await mirror.git("worktree", "prune", check=False)


async def head(mirror: GitMirror, wt: Path) -> str:
    return (await mirror.git("rev-parse", "--verify", "HEAD", cwd=wt)).stdout.strip()


async def is_ancestor(mirror: GitMirror, wt: Path, a: str, b: str) -> bool:
    res = await mirror.git("merge-base", "--is-ancestor", a, b, cwd=wt, check=False)
    if res.returncode not in (0, 1):
        raise GitError(["merge-base", "--is-ancestor", a, b], res.returncode, res.stderr)
    return res.returncode == 0


async def conflicts(mirror: GitMirror, wt: Path) -> tuple[str, ...]:
    res = await mirror.git("diff", "--name-only", "-z", "--diff-filter=U", cwd=wt)
    return tuple(p for p in res.stdout.split("\x00") if p)


async def git_or_conflict(mirror: GitMirror, wt: Path, change: GitChange, *args: str) -> None:
    """Run a git command that may stop on a conflict; a conflict raises ``Conflict``."""
    res = await mirror.git(*args, cwd=wt, check=False)
    if res.returncode == 0:
        return
    paths = await conflicts(mirror, wt)
    if paths:
        raise Conflict(change, paths)
    raise GitError(list(args), res.returncode, res.stderr + res.stdout)


async def cherry_pick(
    mirror: GitMirror, wt: Path, change: GitChange, previous: str | None
) -> int:
    """Cherry-pick the change's commits not yet on HEAD (by patch id, ``git cherry``);
    returns how many were applied.

    The range is merge-base(HEAD, change)..change, or previous..change when ``previous``
    (the change before it in a stack) is an ancestor. A commit that becomes empty (its
    change is already there) is skipped.
    """
    args = ["cherry", "HEAD", change.sha]
    if previous is not None and await is_ancestor(mirror, wt, previous, change.sha):
        args.append(previous)
    listing = await mirror.git(*args, cwd=wt)
    todo = [line[2:].strip() for line in listing.stdout.splitlines() if line.startswith("+ ")]
    applied = 0
    for commit in todo:
        parents = (await mirror.git("rev-list", "--parents", "-n1", commit, cwd=wt)).stdout.split()
        mainline = ["-m", "1"] if len(parents) > 2 else []
        res = await mirror.git(
            "cherry-pick", "--allow-empty", *mainline, commit, cwd=wt, check=False
        )
        if res.returncode == 0:
            applied += 1
            continue
        paths = await conflicts(mirror, wt)
        if paths:
            raise Conflict(change, paths)
        staged = await mirror.git("diff", "--cached", "--quiet", cwd=wt, check=False)
        if staged.returncode == 0:  # became empty: its change is already there
            await mirror.git("cherry-pick", "--skip", cwd=wt)
            continue
        raise GitError(["cherry-pick", commit], res.returncode, res.stderr + res.stdout)
    return applied


async def squash_commit_of(mirror: GitMirror, wt: Path, change: GitChange) -> str:
    """The commit on HEAD that a squash landing of ``change`` made ("" if none): it
    carries the trailer ``Source-Commit: <sha>``."""
    trailer = f"Source-Commit: {change.sha}"
    found = await mirror.git(
        "log", "-n1", "--format=%H", "--fixed-strings", f"--grep={trailer}", "HEAD", cwd=wt
    )
    return found.stdout.strip()


async def landed_on_head(mirror: GitMirror, wt: Path, change: GitChange) -> bool:
    """The change is already part of HEAD: its commit is an ancestor (merge, fast
    forward) or a squash of it is there. (Rebased commits are recognised one by one by
    ``cherry_pick``.)"""
    if await is_ancestor(mirror, wt, change.sha, "HEAD"):
        return True
    return bool(await squash_commit_of(mirror, wt, change))
