"""Applying changes in a scratch worktree of a mirror: shared by the git merger (which
lands them) and the command build runner (which builds the speculative tree).

Every helper runs git through ``GitMirror.git`` (an argv list in a fixed environment,
never a shell). A git command that stops on a conflict raises ``Conflict`` naming the
conflicting paths; any other git failure raises ``GitError`` (infrastructure).

Scratch directories are named after their OWNER, ``<host>~<pid>~<start>~<random>``
(``new_owner()``; ``host`` is the host name and pid namespace, ``start`` the process's
start time from ``/proc``, so a reused pid is told apart). Several processes may share
one work directory, so a process removes only what it owns or what a provably dead
owner left: same host, and the pid is gone, a zombie, or now another process
(``owner_is_dead``). An owner on another host (or pid namespace), or a name of another
form, is never judged dead: what it leaves stays until someone removes it by hand.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from app.extensions.git.cli import GitChange, GitError, GitMirror


class Conflict(Exception):
    """Applying ``change`` stopped on conflicts in ``paths``."""

    def __init__(self, change: GitChange, paths: tuple[str, ...]) -> None:
        super().__init__(change.uri)
        self.change = change
        self.paths = paths


def _host() -> str:
    """This host's name, plus its pid namespace where ``/proc`` tells it (containers that
    share a host name but not their pids are different hosts here)."""
    name = "".join(c if c.isalnum() or c in "-._" else "_" for c in socket.gethostname())
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return name
    return f"{name}.pidns{''.join(c for c in ns if c.isdigit())}"


def _process(pid: int) -> tuple[str, str] | None:
    """``(state, start time)`` of ``pid`` from ``/proc`` (None: no such process, or no
    ``/proc`` to ask)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def new_owner() -> str:
    """A fresh owner name for this process: ``<host>~<pid>~<start>~<random>``."""
    me = _process(os.getpid())
    start = me[1] if me is not None else "-"
    return f"{_host()}~{os.getpid()}~{start}~{uuid.uuid4().hex[:12]}"


def owner_is_dead(name: str) -> bool:
    """True only when ``name`` is an owner of this host whose process is provably gone."""
    parts = name.split("~")
    if len(parts) != 4 or parts[0] != _host() or not parts[1].isdigit():
        return False
    pid, start = int(parts[1]), parts[2]
    if Path("/proc/self/stat").exists():
        now = _process(pid)
        return now is None or now[0] == "Z" or (start != "-" and now[1] != start)
    try:  # no /proc: the pid alone says it
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sweep_scratch(root: Path, *, prefix: str = "", keep: str | None = None,
                  strays: bool = False) -> list[Path]:
    """Remove the entries ``<root>/<prefix><owner>`` whose owner is provably dead (and,
    with ``strays``, every entry not named after an owner, other than ``keep``); returns
    what it removed. The caller prunes git's records of worktrees that were in them."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    removed: list[Path] = []
    for entry in entries:
        name = entry.name
        if name == keep or not name.startswith(prefix):
            continue
        owner = name[len(prefix):]
        if owner_is_dead(owner) or (strays and len(owner.split("~")) != 4):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


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


async def git_or_conflict(mirror: GitMirror, wt: Path, change: GitChange, *args: str,
                          env: dict[str, str] | None = None) -> None:
    """Run a git command that may stop on a conflict; a conflict raises ``Conflict``."""
    res = await mirror.git(*args, cwd=wt, check=False, env=env)
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
            "cherry-pick", "--allow-empty", *mainline, commit, cwd=wt, check=False,
            env=await stamp(mirror, commit),
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


async def stamp(mirror: GitMirror, sha: str) -> dict[str, str]:
    """The dates a commit made from ``sha`` carries: its own committer date, as both
    author and committer date of a commit the queue makes. With the fixed committer
    identity this makes applying the same changes onto the same tip give byte-identical
    commits, wherever it runs: a build tree and the landing that follows it agree."""
    res = await mirror.git("show", "-s", "--format=%cI", sha)
    date = res.stdout.strip()
    return {"GIT_COMMITTER_DATE": date}


async def tree_of(mirror: GitMirror, commit: str) -> str:
    """The tree hash of ``commit``."""
    return (await mirror.git("rev-parse", "--verify", f"{commit}^{{tree}}")).stdout.strip()


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
