"""A merger that lands changes into a git repository's target branch.

``check`` and ``merge`` share one procedure, under the mirror's lock: fetch the target
and every change's ref into our own bare mirror, then apply the steps in order onto the
target tip in a scratch worktree. ``check`` stops there; ``merge`` pushes the result as
ONE update of ``refs/heads/<target>`` with a lease on the tip it built on. If the tip
moved meanwhile, it re-fetches, re-applies and retries (at most ``max_push_attempts``).

Strategies (per step), and when a change counts as already on the target (skipped):

- ``rebase``: cherry-pick each commit of merge-base(target, head)..head; skipped per
  commit when a patch-equivalent commit is on the target (``git cherry``).
- ``squash_rebase``: one commit per change, ``<subject> (<step_id>)`` plus trailers
  ``Source-Ref: <ref>`` and ``Source-Commit: <sha>``, author = the pinned commit's;
  skipped when a target commit carries the same ``Source-Commit``, or no net change.
- ``merge``: ``git merge --no-ff`` per change; skipped when the commit is an ancestor.
- ``fast_forward``: the target becomes the exact SHA (one step with one change, a
  descendant of the tip); skipped when the SHA is already an ancestor of the tip.

Scratch worktrees live in ``<work_dir>/worktrees/<mirror>/<owner>/`` (``gitapply``:
host, pid, process start and a random part), made and removed under the mirror's lock,
which is host-wide. Several processes may share ``work_dir``: before it adds one, a
merger removes its own leftovers and those of owners that are provably dead (their
process is gone), never a live process's, and then prunes git's records of them.

So redelivery is idempotent: a merge that already landed finds nothing to do and
succeeds without pushing. A conflict is a failed outcome naming the conflicting paths
(the target untouched). A change whose pinned commit cannot be fetched any more is a
failed outcome (stale). Git and network failures propagate (retryable).

Outputs: one commit per change, in step order: the target commit holding it (its own
commit for ``fast_forward``; the last cherry-pick, the squash commit or the merge
commit otherwise). ``commits`` holds the same per step (request). A change found
already landed is looked up, so a redelivery reports the same commits: by its
``Source-Commit`` trailer (squash), the merge commit whose parent it is (merge), the
newest patch-equivalent commit (rebase, ``git log --cherry-mark``), or itself when it
is an ancestor of the target; a squash with no net change reports the tip.

With ``move_head_branches`` (``git.move_head_branches`` in queues.yaml), once the
target holds the changes each change's branch (``refs/heads/...``, not the target) is
moved to the commit its change landed as, with a lease on the pinned SHA, so the
branch shows as merged. A branch that moved on meanwhile (or was deleted, or already
points there) is left alone; a branch push that fails while the branch still points at
the pinned SHA raises (retryable: the redelivered merge lands nothing twice and moves
the branch then).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app.domain.states import LandStrategy
from app.extensions.base import ChangeRejected, MergeOutcome, MergeSpec, MergeStep
from app.extensions.gitapply import (
    Conflict,
    cherry_pick,
    git_or_conflict,
    head,
    is_ancestor,
    new_owner,
    squash_commit_of,
    sweep_scratch,
    worktree,
)
from app.extensions.gitutil import (
    DEFAULT_TIMEOUT,
    GitChange,
    GitError,
    GitMirror,
    mirror_lock,
    mirror_name,
    repo_url,
    resolve_change,
)

MAX_PUSH_ATTEMPTS = 5


class _Refused(Exception):
    """A permanent problem with a step (not a conflict)."""


@dataclass(frozen=True, slots=True)
class _Applied:
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


class GitMerger:
    def __init__(
        self,
        repos: Mapping[str, str],
        target_branch: str,
        work_dir: Path,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_push_attempts: int = MAX_PUSH_ATTEMPTS,
        move_head_branches: bool = False,
    ) -> None:
        self.repos = dict(repos)
        self.move_head_branches = move_head_branches
        self.target_branch = target_branch
        self.work_dir = Path(work_dir)
        self.timeout = timeout
        self.max_push_attempts = max_push_attempts
        self.owner = new_owner()

    @property
    def target_ref(self) -> str:
        return f"refs/heads/{self.target_branch}"

    def mirror(self, key: str) -> GitMirror:
        return GitMirror(
            self.work_dir / "mirrors" / mirror_name(key),
            repo_url(self.repos[key]),
            self.work_dir / ".home",
            self.timeout,
        )

    async def check(self, spec: MergeSpec) -> MergeOutcome:
        return await self._run(spec, push=False)

    async def merge(self, spec: MergeSpec) -> MergeOutcome:
        return await self._run(spec, push=True)

    async def _run(self, spec: MergeSpec, *, push: bool) -> MergeOutcome:
        try:
            steps = [(step, [resolve_change(u, self.repos) for u in step.change_uris])
                     for step in spec.steps]
        except ChangeRejected as exc:
            return MergeOutcome(succeeded=False, reason=str(exc))
        changes = [c for _, cs in steps for c in cs]
        if not changes:
            return MergeOutcome(succeeded=True)
        keys = sorted({c.key for c in changes})
        if len(keys) > 1:
            return MergeOutcome(
                succeeded=False, reason=f"a merge must stay in one repository; got {keys}"
            )
        mirror = self.mirror(keys[0])
        async with mirror_lock(mirror.path):
            for attempt in range(1, self.max_push_attempts + 1):
                tip, values = await mirror.fetch(self.target_branch, [c.ref for c in changes])
                for change in changes:
                    if not await mirror.has_commit(change.sha):
                        now = values.get(change.ref, "nothing (deleted)")
                        return MergeOutcome(
                            succeeded=False,
                            reason=f"stale: ref {change.ref} now points at {now}, "
                            f"not {change.sha}, and {change.sha} cannot be fetched",
                        )
                    await mirror.pin(change.sha)
                try:
                    applied = await self._apply(mirror, tip, steps)
                except Conflict as exc:
                    paths = ", ".join(exc.paths) or "(unknown paths)"
                    return MergeOutcome(
                        succeeded=False,
                        reason=f"merge conflict in {paths} while applying {exc.change.uri} "
                        f"onto {self.target_branch} at {tip}",
                        conflicting_paths=exc.paths,
                    )
                except _Refused as exc:
                    return MergeOutcome(succeeded=False, reason=str(exc))
                done = MergeOutcome(succeeded=True, outputs=applied.outputs,
                                    commits=applied.commits)
                if not push:
                    return done
                if applied.tip == tip or await self._push(mirror, tip, applied.tip):
                    if self.move_head_branches:
                        await self._move_heads(mirror, values, applied)
                    return done
                if attempt == self.max_push_attempts:
                    break
        raise TimeoutError(
            f"{self.target_branch} kept moving: gave up pushing {spec.id} after "
            f"{self.max_push_attempts} attempts"
        )

    async def _push(self, mirror: GitMirror, old: str, new: str) -> bool:
        """Push ``new`` as the target with a lease on ``old``; False if the tip moved."""
        res = await mirror.git(
            "push", "--porcelain", "--quiet",
            f"--force-with-lease={self.target_ref}:{old}",
            "--", mirror.url, f"{new}:{self.target_ref}",
            check=False,
        )
        if res.returncode == 0:
            await mirror.update("update-ref", self.target_ref, new)
            return True
        now = (await mirror.remote_refs([self.target_ref])).get(self.target_ref)
        if now is not None and now != old:
            return False  # lost the race: re-apply on the new tip
        raise GitError(["push", mirror.url], res.returncode, res.stderr + res.stdout)

    async def _move_heads(self, mirror: GitMirror, values: Mapping[str, str],
                          applied: _Applied) -> None:
        """Move each change's branch to its landed commit (lease: the pinned SHA)."""
        for _, change, commit in applied.landed:
            ref = change.ref
            if (not ref.startswith("refs/heads/") or ref == self.target_ref or not commit
                    or commit == change.sha or values.get(ref) != change.sha):
                continue
            res = await mirror.git(
                "push", "--porcelain", "--quiet", f"--force-with-lease={ref}:{change.sha}",
                "--", mirror.url, f"{commit}:{ref}", check=False,
            )
            if res.returncode != 0 and (
                    await mirror.remote_refs([ref])).get(ref) == change.sha:
                raise GitError(["push", mirror.url, f"{commit}:{ref}"], res.returncode,
                               res.stderr + res.stdout)

    async def _apply(
        self, mirror: GitMirror, tip: str, steps: list[tuple[MergeStep, list[GitChange]]]
    ) -> _Applied:
        scratch = self.work_dir / "worktrees" / mirror.path.name
        mine = scratch / self.owner
        # We hold the mirror's lock: none of our worktrees is in use. Other owners'
        # are left alone unless their process is provably dead.
        left = sweep_scratch(scratch, keep=self.owner, strays=True)
        if mine.is_dir():
            for entry in mine.iterdir():
                shutil.rmtree(entry, ignore_errors=True)
                left.append(entry)
        if left:
            await mirror.git("worktree", "prune", check=False)
        async with worktree(mirror, mine / uuid.uuid4().hex, tip) as wt:
            landed: list[tuple[MergeStep, GitChange, str]] = []
            for step, changes in steps:
                if step.strategy is LandStrategy.FAST_FORWARD and (
                    len(steps) != 1 or len(changes) != 1
                ):
                    raise _Refused(
                        "fast_forward lands exactly one change: the request must be one "
                        f"step with one change (step {step.step_id} has {len(changes)}, "
                        f"the merge has {len(steps)} steps)"
                    )
                previous: str | None = None
                for change in changes:
                    commit = await self._apply_change(mirror, wt, step, change, previous)
                    landed.append((step, change, commit))
                    previous = change.sha
            return _Applied(tip=await head(mirror, wt), landed=tuple(landed))

    async def _apply_change(
        self, mirror: GitMirror, wt: Path, step: MergeStep, change: GitChange,
        previous: str | None,
    ) -> str:
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
            await git_or_conflict(
                mirror, wt, change,
                "merge", "--no-ff", "--no-edit", "--no-verify",
                "-m", f"Merge {change.ref} ({step.step_id})\n\nSource-Ref: {change.ref}",
                change.sha,
            )
        elif strategy is LandStrategy.FAST_FORWARD:
            if not await is_ancestor(mirror, wt, change.sha, "HEAD"):
                if not await is_ancestor(mirror, wt, "HEAD", change.sha):
                    raise _Refused(
                        f"cannot fast-forward: {change.sha} ({change.ref}) does not descend "
                        "from the target tip; rebase it or use another strategy"
                    )
                await mirror.git("merge", "--ff-only", "--quiet", change.sha, cwd=wt)
            return change.sha
        else:  # pragma: no cover - exhaustive over LandStrategy
            raise _Refused(f"unknown strategy {strategy!r}")
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
    info = await mirror.git("show", "-s", "--format=%s%x00%an%x00%ae%x00%aI", change.sha)
    subject, name, email, date = info.stdout.rstrip("\n").split("\x00", 3)
    message = (
        f"{subject} ({step.step_id})\n\nSource-Ref: {change.ref}\n{trailer}\n"
    )
    await mirror.git(
        "commit", "--quiet", "--no-verify", "--cleanup=whitespace", "-m", message, cwd=wt,
        env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date},
    )
    return ""
