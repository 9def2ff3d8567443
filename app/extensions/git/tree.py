"""The speculative tree of a build: the target tip, then every base change (assumed to
land), then the head changes, applied in a worktree of the runner's own mirror.

Under the mirror's lock (host-wide: ``git.locking.mirror_lock``): fetch the target branch and every change's ref, check each
pinned commit is there, add a detached worktree at the tip and apply the request's
merge steps in the shape their strategies land them (``git.land.apply_steps``, the
merger's own procedure: the squash commit with its trailers, the merge commits, the
cherry-picked commits), so that the landing that follows makes byte-identical commits
and fast-forwards the target to exactly the commit built here. A request without steps
(older callers) has each change's commits cherry-picked in order (``rebase``), a change
already on the target skipped. The tree records what it is: the tip it started from,
the change URIs applied, ``HEAD`` and ``HEAD^{tree}``. The worktree is removed when the
block ends.

| Problem | Raised |
|---|---|
| a URI that is not a usable git change, several repositories, a commit that cannot be fetched (stale) | ``TreeRefused`` (FAILED: this combination cannot land) |
| a conflict while applying a change | ``TreeRefused`` naming the change and the conflicting paths |
| git or the network failing otherwise | ``GitError`` / ``TimeoutError`` (ERRORED: no verdict) |
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from app.extensions.base import ChangeRejected, MergeStep
from app.extensions.git.apply import (
    Conflict,
    cherry_pick,
    head,
    landed_on_head,
    remove_worktree,
    tree_of,
)
from app.extensions.git.cli import GitChange, GitMirror, resolve_change
from app.extensions.git.land import Refused, apply_steps
from app.extensions.git.locking import mirror_lock


class TreeRefused(Exception):
    """The changes cannot be combined into a tree; the build fails with this reason."""


@dataclass(frozen=True, slots=True)
class Tree:
    path: Path
    base: str  # the target tip the tree started from
    head: str  # the tree's HEAD after applying every change
    tree: str = ""  # HEAD^{tree}
    changes: tuple[str, ...] = ()  # the change URIs applied, in order


@asynccontextmanager
async def speculative_tree(
    *,
    path: Path,
    mirror_for: Callable[[str], GitMirror],
    repos: Mapping[str, str],
    target_branch: str,
    base_changes: Sequence[str],
    head_changes: Sequence[str],
    say: Callable[[str], None],
    steps: Sequence[MergeStep] = (),
) -> AsyncIterator[Tree]:
    try:
        changes = [("base", resolve_change(u, repos)) for u in base_changes]
        changes += [("head", resolve_change(u, repos)) for u in head_changes]
        resolved = [(step, [resolve_change(u, repos) for u in step.change_uris])
                    for step in steps]
    except ChangeRejected as exc:
        raise TreeRefused(str(exc)) from None
    keys = sorted({c.key for _, c in changes} or set(repos))
    if len(keys) != 1:
        raise TreeRefused(f"a build must stay in one repository; it names {', '.join(keys)}")
    mirror = mirror_for(keys[0])
    async with mirror_lock(mirror.path):
        tip, values = await mirror.fetch(target_branch, [c.ref for _, c in changes])
        for _, change in changes:
            if not await mirror.has_commit(change.sha):
                now = values.get(change.ref, "nothing (deleted)")
                raise TreeRefused(f"stale: ref {change.ref} now points at {now}, not "
                                  f"{change.sha}, and {change.sha} cannot be fetched")
            await mirror.pin(change.sha)
        path.parent.mkdir(parents=True, exist_ok=True)
        await mirror.git("worktree", "add", "--detach", "--quiet", str(path), tip)
        say(f"tree: {target_branch} at {tip}")
        try:
            if resolved:
                heads = set(head_changes)
                top = await _apply_steps(mirror, path, resolved, heads, target_branch, tip, say)
            else:
                top = await _apply(mirror, path, changes, target_branch, tip, say)
            tree = await tree_of(mirror, top)
        except BaseException:
            await remove_worktree(mirror, path)
            raise
    say(f"tree: {tree}")
    try:
        yield Tree(path=path, base=tip, head=top, tree=tree,
                   changes=tuple(c.uri for _, c in changes))
    finally:
        async with mirror_lock(mirror.path):
            await remove_worktree(mirror, path)


async def _apply(mirror: GitMirror, wt: Path, changes: Sequence[tuple[str, GitChange]],
                 target_branch: str, tip: str, say: Callable[[str], None]) -> str:
    previous: str | None = None
    applied: list[str] = []
    for role, change in changes:
        if await landed_on_head(mirror, wt, change):
            say(f"{role} change {change.uri}: already on {target_branch}, skipped")
            continue
        try:
            count = await cherry_pick(mirror, wt, change, previous)
        except Conflict as exc:
            paths = ", ".join(exc.paths)
            on_top = f" on top of {', '.join(applied)}" if applied else ""
            raise TreeRefused(
                f"merge conflict in {paths} while applying {role} change {change.uri}"
                f"{on_top} onto {target_branch} at {tip}") from None
        say(f"{role} change {change.uri}: {count} commit(s) applied")
        applied.append(change.uri)
        previous = change.sha
    top = await head(mirror, wt)
    say(f"tree: HEAD {top}")
    return top


async def _apply_steps(mirror: GitMirror, wt: Path,
                       steps: Sequence[tuple[MergeStep, Sequence[GitChange]]],
                       heads: set[str], target_branch: str, tip: str,
                       say: Callable[[str], None]) -> str:
    try:
        applied = await apply_steps(mirror, wt, steps, single_fast_forward=False)
    except Conflict as exc:
        paths = ", ".join(exc.paths)
        raise TreeRefused(f"merge conflict in {paths} while applying change "
                          f"{exc.change.uri} onto {target_branch} at {tip}") from None
    except Refused as exc:
        raise TreeRefused(str(exc)) from None
    for step, change, commit in applied.landed:
        role = "head" if change.uri in heads else "base"
        say(f"{role} change {change.uri} ({step.step_id}, {step.strategy.value}): {commit}")
    say(f"tree: HEAD {applied.tip}")
    return applied.tip
