"""A merger that lands changes into a git repository's target branch.

``check`` and ``merge`` share one procedure, under the mirror's lock: fetch the target
and every change's ref into our own bare mirror, then apply the steps in order onto the
target tip in a scratch worktree. ``check`` stops there; ``merge`` pushes the result as
ONE update of ``refs/heads/<target>`` with a lease on the tip it built on. If the tip
moved meanwhile, it re-fetches, re-applies and retries (at most ``max_push_attempts``),
and the exact-trees guard below then refuses a result no build tested.

The steps are applied by ``app.extensions.git.land`` (strategies, skips, deterministic
commits), the procedure the command runner builds its trees with.

**Exact trees.** A merge whose spec carries ``tested`` (the trees of the batch's passed
builds) pushes only a new tip that IS a tested commit (the usual case: the build made
the same commits on the same tip, so the target fast-forwards to exactly what was
tested) or whose tree equals a tested tree. Anything else is refused, nothing pushed:
a failed outcome with ``code="untested_tree"``, the tip found, and ``moved`` when that
tip is no tested build's base (the target moved outside the queue). A merge that
finds everything already landed pushes nothing and needs no guard.

**Gate.** Right before the push (after the fetch, the apply and the exact-trees guard:
the last moment before the ref update), a merge asks the spec's ``gate`` (the queue's
freeze, ``app/controllers/freeze.py``); a non-empty answer pushes nothing and returns
``code="held"`` with it as the reason, which the merge stage holds, not fails.

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
from pathlib import Path

from app.extensions.base import (
    HELD,
    ChangeRejected,
    MergeOutcome,
    MergeSpec,
    MergeStep,
    TestedTree,
)
from app.extensions.git.apply import (
    Conflict,
    new_owner,
    sweep_scratch,
    tree_of,
    worktree,
)
from app.extensions.git.cli import (
    DEFAULT_TIMEOUT,
    GitChange,
    GitError,
    GitMirror,
    mirror_name,
    repo_url,
    resolve_change,
)
from app.extensions.git.land import Applied, Refused, apply_steps
from app.extensions.git.locking import mirror_lock

MAX_PUSH_ATTEMPTS = 5


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
                except Refused as exc:
                    return MergeOutcome(succeeded=False, reason=str(exc))
                done = MergeOutcome(succeeded=True, outputs=applied.outputs,
                                    commits=applied.commits)
                if not push:
                    return done
                refused = await self._refused(spec, mirror, tip, applied.tip)
                if refused is not None:
                    return refused
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

    async def _refused(self, spec: MergeSpec, mirror: GitMirror, tip: str,
                       new: str) -> MergeOutcome | None:
        """Why ``new`` must not replace ``tip`` now: untested, or the gate (a freeze),
        asked last, right before the ref update; None to push."""
        if new == tip:
            return None  # everything already landed: nothing to update
        if spec.tested is not None:
            refused = await self._untested(mirror, tip, new, spec.tested)
            if refused is not None:
                return refused
        why = await spec.gate() if spec.gate is not None else ""
        return MergeOutcome(succeeded=False, code=HELD, reason=why) if why else None

    async def _untested(self, mirror: GitMirror, tip: str, new: str,
                        tested: tuple[TestedTree, ...]) -> MergeOutcome | None:
        """``None`` when ``new`` is a tested commit or has a tested tree; else the
        ``untested_tree`` refusal (``moved`` when the tip is no tested tree's base:
        the target moved outside the queue, or landed otherwise than assumed)."""
        if any(t.commit == new for t in tested):
            return None
        tree = await tree_of(mirror, new)
        if any(t.tree == tree for t in tested):
            return None
        moved = bool(tested) and all(t.base != tip for t in tested)
        builds = ", ".join(f"{t.build_id or t.commit} (tree {t.tree[:12]})" for t in tested)
        why = (f"{self.target_branch} is at {tip}, which no passed build started from"
               if moved else f"the strategy's result on {tip} differs from what was built")
        return MergeOutcome(
            succeeded=False, code="untested_tree", tip=tip, moved=moved,
            reason=f"untested_tree: landing would make tree {tree} on {self.target_branch}, "
                   f"which no passed build tested ({why}; passed: {builds or 'none'}); "
                   "nothing was pushed",
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
                          applied: Applied) -> None:
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
    ) -> Applied:
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
            return await apply_steps(mirror, wt, steps)
