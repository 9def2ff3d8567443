"""The ``github_checks`` build runner: GitHub's required checks are the builds.

- **Trigger**: the speculative tree is made locally by the code the webhook runner uses
  (``TreePublisher``: the strategies' shape, as the merger lands it) and pushed as the
  branch ``sq/<queue>/<path id>-<attempt>``; CI runs on that push. The run is recorded
  before the push and the tree once pushed, so a redelivered trigger pushes nothing new.
- **Status**: the build stage asks ``status`` every few hundred milliseconds; GitHub is
  asked at most every ``poll_s`` (default 15 s: two calls a build, well inside an
  installation's 5,000 calls an hour) — at once after the push, and at once again when
  a ``check_run``, ``check_suite`` or ``status`` webhook names the build's branch
  (``nudge``: the run's ``heartbeat_ms``, here "when GitHub was last asked", is zeroed
  in the shared store, so whichever process polls it next asks). The check-runs and
  commit statuses GitHub has for the pushed commit are read against the queue's required
  checks by ``checks.verdict`` (a failed check fails the build; a cancelled or timed-out
  one errors it; no required check within ``checks_start_timeout_s`` errors it with
  ``no_ci_started`` naming the checks and the fix; ``timeout_s`` after the trigger, an
  unfinished build errors). A webhook that arrives while a poll is reading GitHub may be
  absorbed by that poll's write: the next poll, ``poll_s`` later, sees its check.
- **Cancel**: records ``cancelled``, cancels the unfinished workflow runs of the pushed
  commit on its branch (GitHub Actions: CI nobody waits for is not paid for) and
  deletes the branch. A build that ended failed or errored (a failed check while
  others still run) has its runs cancelled too; every finished build's branch is
  deleted (each best effort: a leftover costs CI minutes or a branch, nothing else).

- **No CI paid twice**: when the path is one pull request alone on the target (no
  batch assumed ahead of it) and its head already passed every required check, the
  tree is made as always; if it is exactly the head's tree (the pull request is up to
  date with its base), the commit is pushed to ``refs/sq/builds/<build id>`` (no CI
  runs on it: it is not a branch) and the build succeeds at once with it as the tested
  commit: the checks that passed on that very tree count.

- **Required checks**: the names in ``checks``, or, with none configured, what GitHub
  requires on the target branch: the rulesets that apply to it and its classic branch
  protection (``GitHubClient.required_checks``), read again at most every
  ``REQUIRED_TTL_S``. A branch that requires no check (or an unreadable one) is
  ``GitHubUnavailable`` naming the fix: the work waits for an operator, no change is
  blamed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence

from app.domain.build_run import BuildRun
from app.domain.checkrun import pull_heads
from app.domain.errors import NotFound
from app.domain.states import BuildStatus
from app.extensions.base import BuildReport, BuildRequest, BuildStore
from app.extensions.builds import runlog
from app.extensions.git.publish import TreePublisher, build_ref
from app.extensions.git.tree import TreeRefused
from app.extensions.github.checks import verdict
from app.extensions.github.client import GitHubClient, GitHubUnavailable

log = logging.getLogger("submitqueue.github")
RUNNER = "github_checks"
REQUIRED_TTL_S = 60.0


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class GitHubChecksRunner:
    def __init__(self, *, queue: str, publisher: TreePublisher, client: GitHubClient,
                 store: BuildStore, checks: Sequence[str], start_timeout_s: float,
                 timeout_s: float, poll_s: float = 15.0, target_branch: str = "main") -> None:
        self.queue = queue
        self.publisher = publisher
        self.client = client
        self.store = store
        self.configured = tuple(checks)
        self.target_branch = target_branch
        self._required: tuple[tuple[str, ...], float] | None = None  # names, read at
        self.start_timeout_s = start_timeout_s
        self.timeout_s = timeout_s
        self.poll_ms = int(poll_s * 1000)
        self.clock = _wall_clock_ms
        self._branch = re.compile(rf"^sq/{re.escape(queue)}/(?P<path>[0-9A-Za-z]+)-"
                                  r"(?P<attempt>[1-9][0-9]{0,8})$")

    def branch(self, request_or_run: BuildRequest | BuildRun) -> str:
        r = request_or_run
        return f"sq/{self.queue}/{r.path_id}-{r.attempt}"

    async def trigger(self, request: BuildRequest) -> str:
        build_id = request.build_id("gh")
        run = await self.store.get(build_id)
        if run is None:
            now = self.clock()
            await self.store.create(BuildRun(
                id=build_id, queue=request.queue, runner=RUNNER, batch_id=request.batch_id,
                path_id=request.path_id, attempt=request.attempt, status=BuildStatus.ACCEPTED,
                heartbeat_ms=0, created_at_ms=now, updated_at_ms=now))
            run = await self.store.get(build_id)
        if run is None or run.tested is not None or run.status.terminal:
            return build_id  # pushed already (a redelivered trigger), or ended
        branch = self.branch(request)
        checks = await self.required()
        head = await self._passed_head(request, checks)
        try:
            tested, reused = await self.publisher.publish_unless_same(
                request, build_id, ref=f"refs/heads/{branch}", same_as=head,
                same_ref=build_ref(build_id))
        except TreeRefused as exc:
            await self._end(build_id, BuildStatus.FAILED, str(exc))
            return build_id
        await self.store.update(build_id, now_ms=self.clock(), tested=tested)
        if reused:
            await self._say(build_id, f"tree {tested.commit} pushed to {build_ref(build_id)} "
                            f"(on {tested.base}), not to a queue branch")
            await self._end(build_id, BuildStatus.SUCCEEDED, (
                f"no CI paid twice: this tree is exactly pull request head {head}'s, whose "
                f"required checks passed ({', '.join(checks)}); nothing was built again"))
            return build_id
        await self._say(build_id, f"tree {tested.commit} pushed to {branch} (on "
                        f"{tested.base}); waiting for {', '.join(checks)}")
        return build_id

    async def required(self) -> tuple[str, ...]:
        """The required check names: configured, or read from GitHub (module docstring)."""
        if self.configured:
            return self.configured
        now = time.monotonic()
        if self._required is not None and now - self._required[1] < REQUIRED_TTL_S:
            return self._required[0]
        names, note = await self.client.required_checks(self.target_branch)
        if not names:
            raise GitHubUnavailable(
                f"queue {self.queue!r}: {self.target_branch} requires no status check (no "
                "ruleset or branch protection of it names one"
                + (f"; {note}" if note else "") + ") and build_runner.checks names none: "
                "require the CI's checks on the branch, or list them in build_runner.checks")
        if note:
            log.warning("required checks read from rulesets only: %s", note,
                        extra={"queue": self.queue})
        self._required = (names, now)
        return names

    async def _passed_head(self, request: BuildRequest, checks: tuple[str, ...]) -> str:
        """The head commit of the path's one pull request when the path is that pull
        request alone on the target (first in its lane) and every required check already
        passed on it ("" otherwise): if the tree made is exactly that commit's tree, its
        checks count and nothing is built again. A failure to read them only costs a
        build."""
        heads = pull_heads(request.head_changes, self.client.config.host,
                           self.client.config.repository)
        if request.base_changes or len(request.head_changes) != 1 or len(heads) != 1:
            return ""
        sha = heads[0][1]
        try:
            seen = await self.client.checks(sha)
        except Exception as exc:
            log.warning("could not read a pull request's checks; building it",
                        exc_info=exc, extra={"queue": self.queue, "sha": sha})
            return ""
        status, _ = verdict(checks, seen, waited_s=0, start_timeout_s=1,
                            branch="the pull request")
        return sha if status is BuildStatus.SUCCEEDED else ""

    async def status(self, build_id: str) -> BuildReport:
        run = await self.store.get(build_id)
        if run is None:
            raise NotFound(f"build {build_id!r} is unknown to the github_checks runner of "
                           f"queue {self.queue!r}")
        if not run.status.terminal and run.tested is not None:
            if run.heartbeat_ms == 0 or self.clock() - run.heartbeat_ms >= self.poll_ms:
                run = await self._poll(run)
        elif not run.status.terminal and self._waited_s(run) > self.timeout_s:
            run = await self._end(build_id, BuildStatus.ERRORED,
                                  "the tree was never pushed") or run
        return BuildReport(run.status, log_url=run.log_url, detail=run.detail,
                           tested=run.tested)

    def _waited_s(self, run: BuildRun) -> float:
        return (self.clock() - run.created_at_ms) / 1000

    async def _poll(self, run: BuildRun) -> BuildRun:
        assert run.tested is not None
        checks = await self.required()
        seen = await self.client.checks(run.tested.commit)
        status, detail = verdict(checks, seen, waited_s=self._waited_s(run),
                                 start_timeout_s=self.start_timeout_s, branch=self.branch(run))
        if not status.terminal and self._waited_s(run) > self.timeout_s:
            status, detail = BuildStatus.ERRORED, (
                f"the required checks did not finish within {self.timeout_s:g} s ({detail})")
        if status.terminal:
            ended = await self._end(run.id, status, detail) or run
            await self._forget_branch(run, stop_ci=status is not BuildStatus.SUCCEEDED)
            return ended
        now = self.clock()
        if status is BuildStatus.RUNNING and run.status is not BuildStatus.RUNNING:
            await self._say(run.id, detail)
            return await self.store.update(run.id, now_ms=now, status=status, detail=detail,
                                           heartbeat_ms=now) or run
        return await self.store.update(run.id, now_ms=now, heartbeat_ms=now) or run

    async def nudge(self, branches: Sequence[str]) -> int:
        """A check webhook named ``branches``: the builds on this queue's branches among
        them ask GitHub at their next status; returns how many builds it woke."""
        woken = 0
        for branch in branches:
            m = self._branch.match(branch)
            if m is not None:
                woken += await self.store.nudge(self.queue, m["path"], int(m["attempt"]))
        return woken

    async def cancel(self, build_id: str) -> None:
        run = await self._end(build_id, BuildStatus.CANCELLED, "cancelled by SubmitQueue")
        if run is not None:
            await self._forget_branch(run, stop_ci=True)

    async def _forget_branch(self, run: BuildRun, *, stop_ci: bool = False) -> None:
        branch = self.branch(run)
        if stop_ci and run.tested is not None:
            try:
                stopped = await self.client.cancel_workflow_runs(branch, run.tested.commit)
            except Exception as exc:  # best effort: CI minutes, not correctness
                log.warning("could not cancel a queue branch's workflow runs", exc_info=exc,
                            extra={"queue": self.queue, "build_id": run.id})
            else:
                if stopped:
                    await self._say(run.id, f"cancelled {stopped} workflow run(s) on {branch}")
        try:
            await self.client.delete_branch(branch)
        except Exception as exc:  # best effort: a leftover branch harms nothing
            log.warning("could not delete a queue branch", exc_info=exc,
                        extra={"queue": self.queue, "build_id": run.id})

    async def _say(self, build_id: str, line: str) -> None:
        await runlog.say(self.store, build_id, line)

    async def _end(self, build_id: str, status: BuildStatus, detail: str) -> BuildRun | None:
        return await runlog.end(self.store, build_id, status, detail, now_ms=self.clock())
