"""A build runner that builds the speculative tree and runs the queue's command in it.

Per build: wait for one of ``max_parallel`` slots (the build is ``accepted`` meanwhile),
go ``running``, make the tree (``tree.py``: target tip, then the base changes, then
the head's, in the shape their strategies land them, in a worktree under
``<work_dir>/builds/trees/<build id>``), record what it tests (the tip, the changes,
``HEAD`` and ``HEAD^{tree}``: ``BuildReport.tested``), run the
configured argv there (``process.py``: no shell, a fixed environment, a timeout, the
whole process group killed at the end) inside the queue's sandbox (``sandbox.py``:
bubblewrap, unless ``build_runner.sandbox: none``), store the verdict, remove the tree.

The command sees ``SQ_QUEUE``, ``SQ_BUILD_ID``, ``SQ_BATCH_ID``, ``SQ_PATH_ID``,
``SQ_ATTEMPT``, ``SQ_BASE`` (the target tip the tree started from) and ``SQ_HEAD``
(the tree's HEAD), plus ``PATH``, ``HOME``/``TMPDIR`` (a scratch directory),
``LANG=C.UTF-8``; nothing else of the server's environment. Sandboxed, it sees none of
the server's files either: only the system, its tree and scratch home (writable), and
``{python}`` (the tree's git metadata points into the runner's mirror, which it cannot
see: ``SQ_BASE``/``SQ_HEAD`` name the commits).

| What happened | Status | Detail / log |
|---|---|---|
| exit 0 | ``succeeded`` | ``command exited 0 ...`` |
| exit != 0, killed, or could not start | ``failed`` | exit code or reason |
| exit in ``infra_exit_codes`` (default 75) | stays ``running`` ("waiting for the build system") | ``status()`` raises ``BuildSystemUnavailable`` and runs the command again (so the outage guard paces the retries); the heartbeat also reruns it after ``infra_retry_ms`` |
| ``timeout_s`` passed | ``failed`` | ``timed out after Ns`` (group SIGTERM, then SIGKILL) |
| the changes conflict with each other or the target, a URI is unusable, a commit is stale | ``failed`` | the reason, naming the change and the conflicting paths |
| git failed otherwise (network, disk) | ``errored`` | ``could not prepare the tree: ...`` |
| ``sandbox: bwrap`` but bwrap is missing or cannot set up the sandbox | ``errored`` | ``sandbox unavailable: ...`` (nothing runs unsandboxed; ``/readyz`` says why) |
| ``cancel()`` | ``cancelled`` | while waiting or running (group SIGTERM, then SIGKILL) |
| the server stopped while it ran | ``errored`` | ``interrupted: ...`` (at ``stop()``) |
| its runner process died | ``errored`` | ``lost: ...`` (see below) |

State is kept in a ``BuildStore`` so that any process can answer ``status()``: the
runner writes each transition and, every ``heartbeat_ms`` (its ``periodic_jobs()``, run
by the runtime's scheduler), a heartbeat for its unfinished runs and their logs so far
(the last MiB). ``status()`` of a run this instance does not hold in memory reads the
store, and an unfinished run whose owner's heartbeat is older than ``lost_after_ms``
is marked ``errored`` (lost) there and then. At ``start()`` the runner takes an
exclusive ``flock`` on ``<builds>/.lock``: holding it proves every earlier instance on
this host and build directory is dead, so their unfinished runs are marked lost at
once (a command they left running is killed, if ``/proc`` shows it is still that
build) and their leftover trees removed. An instance that cannot take the lock runs
its builds in ``trees-<owner>`` (``git.apply.new_owner``: host, pid, process start) and
relies on the heartbeat rule alone. Every instance, at ``start()``, removes the
``trees-<owner>`` directories of provably dead owners and prunes git's records of
their worktrees under each mirror's host-wide lock. ``cancel()`` of a run held by
another process is recorded in the store; its owner stops it at its next heartbeat.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.domain.build_run import BuildRun
from app.domain.errors import NotFound
from app.domain.states import BuildStatus
from app.extensions.base import (
    BuildReport,
    BuildRequest,
    BuildStore,
    BuildSystemUnavailable,
    PeriodicJob,
    TestedTree,
)
from app.extensions.builds.process import (
    PYTHON_PLACEHOLDER,
    LogBuffer,
    Outcome,
    build_env,
    command_argv,
    kill_group,
    kill_orphan,
    run_command,
)
from app.extensions.builds.sandbox import Bwrap, SandboxGuard, SandboxUnavailable, run_sandboxed
from app.extensions.git.apply import new_owner, sweep_scratch
from app.extensions.git.cli import DEFAULT_TIMEOUT, GitMirror, mirror_name, repo_url
from app.extensions.git.locking import mirror_lock
from app.extensions.git.tree import TreeRefused, speculative_tree

log = logging.getLogger("submitqueue.builds")

HEARTBEAT_MS = 2000
LOST_AFTER_HEARTBEATS = 5
KILL_GRACE_S = 5.0
LOST_DETAIL = "lost: the process running it stopped"
INFRA_DETAIL = "waiting for the build system: "


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def log_url(build_id: str) -> str:
    return f"/api/v1/builds/{build_id}/log"


@dataclass
class _Live:
    request: BuildRequest
    log: LogBuffer
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    pid: int | None = None
    phase: str = "waiting for a build slot"
    stopping: str = ""  # why the runner stops it ("" = not stopping)
    infra: str = ""  # the last run exited with an infrastructure code: why ("" = no)
    infra_at_ms: int = 0


class CommandBuildRunner:
    def __init__(
        self,
        *,
        queue: str,
        command: Sequence[str],
        repos: Mapping[str, str],
        target_branch: str,
        work_dir: Path,
        store: BuildStore,
        timeout_s: float = 600.0,
        max_parallel: int = 2,
        heartbeat_ms: int = HEARTBEAT_MS,
        lost_after_ms: int | None = None,
        kill_grace_s: float = KILL_GRACE_S,
        git_timeout: float = DEFAULT_TIMEOUT,
        sandbox: Bwrap | None = Bwrap(),  # noqa: B008 - frozen; None = unsandboxed
        infra_exit_codes: Sequence[int] = (75,),
        infra_retry_ms: int = 30_000,
    ) -> None:
        if not command:
            raise ValueError("the build command must name a program")
        if max_parallel < 1 or timeout_s <= 0 or heartbeat_ms <= 0:
            raise ValueError("max_parallel >= 1, timeout_s > 0 and heartbeat_ms > 0 needed")
        self.queue = queue
        self.command = tuple(command)
        self.repos = dict(repos)
        self.target_branch = target_branch
        self.root = Path(work_dir)
        self.store = store
        self.timeout_s = timeout_s
        self.max_parallel = max_parallel
        self.heartbeat_ms = heartbeat_ms
        self.lost_after_ms = lost_after_ms or heartbeat_ms * LOST_AFTER_HEARTBEATS
        self.kill_grace_s = kill_grace_s
        self.git_timeout = git_timeout
        self.infra_exit_codes = frozenset(infra_exit_codes)
        self.infra_retry_ms = infra_retry_ms
        self.down = ""  # why the build system is down (a build's infrastructure exit)
        self.clock = wall_clock_ms
        host = socket.gethostname()
        self.owner = f"{host}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.owner_group = f"{host}:{self.root.resolve()}"
        self.trees = self.root / "trees"
        self._slots = asyncio.Semaphore(max_parallel)
        self._live: dict[str, _Live] = {}
        self._lock_fd: int | None = None
        self._running = False
        self.sandbox = SandboxGuard(queue, sandbox, self.root / f".probe-{uuid.uuid4().hex[:12]}",
                                    python=PYTHON_PLACEHOLDER in self.command, hidden=self.root)

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        """Take the directory lock (sweeping what dead instances left). Its heartbeat is
        ``periodic_jobs()``, run by the runtime's scheduler."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _try_lock(self.root / ".lock")
        if self._lock_fd is None:
            private = uuid.uuid4().hex[:12]
            self.owner_group = f"{self.owner_group}#{private}"
            self.trees = self.root / f"trees-{new_owner()}"
            log.warning("another process uses build directory %s; this one builds in %s and "
                        "relies on heartbeats to detect lost builds", self.root, self.trees)
        await self._sweep()
        await self.sandbox.start()  # a loud warning (none) or error (bwrap unusable)
        self._running = True

    async def stop(self) -> None:
        """Stop every build of this instance (``errored``: interrupted)."""
        self._running = False
        tasks = []
        for live in self._live.values():
            live.stopping = "interrupted: the server stopped while it ran"
            if live.task is not None:
                live.task.cancel()
                tasks.append(live.task)
        if tasks:
            await asyncio.wait(tasks, timeout=self.kill_grace_s + 10)
        for build_id, live in list(self._live.items()):
            if live.infra and live.task is None:  # waiting for the build system
                await self._end(build_id, live, Outcome(BuildStatus.ERRORED, live.stopping))
        if self.trees.name != "trees":  # our own directory: gone if nothing is left in it
            with contextlib.suppress(OSError):
                self.trees.rmdir()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _sweep(self) -> None:
        """What dead instances left: with the directory lock, this group's runs (mark lost,
        kill leftovers) and ``trees/``; always, dead owners' ``trees-<owner>``; then
        git's records of the worktrees that were in them."""
        if self._lock_fd is not None:
            await self._sweep_group()
        sweep_scratch(self.root, prefix="trees-", keep=self.trees.name)
        mirrors = self.root / "mirrors"
        if mirrors.is_dir():
            for path in sorted(mirrors.iterdir()):
                if (path / "HEAD").exists():
                    async with mirror_lock(path):
                        await self._mirror_at(path).git("worktree", "prune", check=False)

    async def _sweep_group(self) -> None:
        for run in await self.store.unfinished(self.owner_group):
            if run.owner == self.owner:
                continue
            killed = kill_orphan(run.pid, run.id)
            detail = f"{LOST_DETAIL} (found when the runner restarted" + (
                f"; its command, pid {killed}, was still running and was killed)"
                if killed is not None else ")")
            text = (await self.store.get_log(run.id) or "") + f"[sq] errored: {detail}\n"
            await self.store.set_log(run.id, text)
            await self.store.update(run.id, now_ms=self.clock(), status=BuildStatus.ERRORED,
                                    detail=detail)
            log.warning("build %s was lost by a previous instance: %s", run.id, detail)
        shutil.rmtree(self.trees, ignore_errors=True)  # trees and scratch homes

    def periodic_jobs(self) -> list[PeriodicJob]:
        return [PeriodicJob(f"build-heartbeat:{self.queue}", self.heartbeat_ms, self.beat)]

    async def beat(self) -> None:
        """One heartbeat: the store learns this instance's unfinished runs are alive and
        gets their logs so far; runs cancelled from another process are stopped, and a
        run parked by an infrastructure failure is re-run once its retry time passed.
        A failure is logged and the next beat tries again."""
        if not self._running or not self._live:
            return
        try:
            to_stop = await self.store.heartbeat(self.owner, self.clock(), list(self._live))
            for build_id in to_stop:
                live = self._live.get(build_id)
                if live is not None:
                    live.cancelled.set()
            for build_id, live in list(self._live.items()):
                await self._flush(build_id, live)
                if live.infra and self.clock() - live.infra_at_ms > self.infra_retry_ms:
                    self._rerun(build_id, live)
        except Exception:
            log.warning("build heartbeat failed; retrying", exc_info=True)

    def readiness(self) -> dict[str, Any]:
        """This queue's entry of the ``builds`` readiness check (``SandboxGuard``)."""
        return self.sandbox.readiness()

    # -- the BuildRunner protocol ----------------------------------------------
    async def trigger(self, request: BuildRequest) -> str:
        """Start the build of (queue, path, attempt) once: its id derives from the
        request's ``idempotency_key``, so a retried trigger (the build controller's
        link write failed, or its delivery was redelivered) finds the run it started
        and returns it instead of running the command a second time. The first
        create of an id wins; an instance that lost that race starts nothing."""
        build_id = request.build_id("cmd")
        if build_id in self._live or await self.store.get(build_id) is not None:
            return build_id  # started before (here or by another process): it reports
        if self.down:  # the build system is known down: start nothing until it answers
            raise BuildSystemUnavailable(f"the build system of queue {self.queue} is down "
                                         f"({self.down}); no new build starts until it answers")
        now = self.clock()
        await self.store.create(BuildRun(
            id=build_id, queue=request.queue, runner="command", batch_id=request.batch_id,
            path_id=request.path_id, attempt=request.attempt, status=BuildStatus.ACCEPTED,
            owner=self.owner, owner_group=self.owner_group, log_url=log_url(build_id),
            heartbeat_ms=now, created_at_ms=now, updated_at_ms=now))
        stored = await self.store.get(build_id)
        if stored is None or stored.owner != self.owner or build_id in self._live:
            return build_id  # another trigger of the same build created it first
        live = _Live(request=request, log=LogBuffer())
        live.log.line(f"build {build_id}: batch {request.batch_id}, path {request.path_id}, "
                      f"attempt {request.attempt}; waiting for a build slot "
                      f"({self.max_parallel} at a time)")
        self._live[build_id] = live
        live.task = asyncio.create_task(self._run(build_id, live), name=f"sq-build-{build_id}")
        return build_id

    async def status(self, build_id: str) -> BuildReport:
        live = self._live.get(build_id)
        if live is not None and live.infra:
            why = live.infra
            self._rerun(build_id, live)
            raise BuildSystemUnavailable(
                f"build {build_id} of queue {self.queue}: {why}; running it again")
        run = await self.store.get(build_id)
        if run is not None and not run.status.terminal and build_id not in self._live and \
                run.detail.startswith(INFRA_DETAIL) and run.owner != self.owner and \
                self.clock() - run.heartbeat_ms <= self.lost_after_ms:
            # another live instance's build waits for its build system (ours, no longer
            # live -- its final write failed -- or a silent owner's is lost: below)
            raise BuildSystemUnavailable(f"build {build_id} of queue {self.queue}: "
                                         f"{run.detail.removeprefix(INFRA_DETAIL)}")
        if run is None:
            raise NotFound(f"build {build_id!r} is unknown to the command runner of queue "
                           f"{self.queue!r}")
        if not run.status.terminal and build_id not in self._live and (
            run.owner == self.owner or self.clock() - run.heartbeat_ms > self.lost_after_ms
        ):
            silent = (self.clock() - run.heartbeat_ms) / 1000
            detail = f"{LOST_DETAIL} (no heartbeat for {silent:.0f}s)"
            run = await self.store.update(build_id, now_ms=self.clock(),
                                          status=BuildStatus.ERRORED, detail=detail) or run
        return BuildReport(run.status, log_url=run.log_url, detail=run.detail,
                           tested=run.tested)

    async def cancel(self, build_id: str) -> None:
        live = self._live.get(build_id)
        if live is not None and live.infra and live.task is None:
            await self._end(build_id, live, Outcome(
                BuildStatus.CANCELLED, "cancelled while waiting for the build system"))
            return
        if live is not None:
            live.cancelled.set()
            return
        await self.store.request_cancel(build_id)

    # -- one build -------------------------------------------------------------
    def waiting(self, build_id: str) -> bool:
        """The build's last run exited with an infrastructure code and it has not run
        again since (this instance's builds only)."""
        live = self._live.get(build_id)
        return live is not None and bool(live.infra)

    def _rerun(self, build_id: str, live: _Live) -> None:
        """Run a build again whose last run exited with an infrastructure code."""
        if not live.infra or live.task is not None:
            return
        live.log.line(f"running it again ({live.infra})")
        live.infra = ""
        live.phase = "waiting for a build slot"
        live.task = asyncio.create_task(self._run(build_id, live), name=f"sq-build-{build_id}")

    async def _park(self, build_id: str, live: _Live, outcome: Outcome) -> None:
        """The command exited with an infrastructure code: no verdict; keep the build
        live (``running``) until the build system answers and it runs again."""
        why = f"the build command {outcome.detail} (an infrastructure exit code)"
        live.pid = None
        live.log.line(f"{INFRA_DETAIL}{why}")
        await self._flush(build_id, live)
        await self.store.update(build_id, now_ms=self.clock(), detail=INFRA_DETAIL + why)
        live.infra, live.infra_at_ms, self.down = why, self.clock(), why
        live.task = None

    async def _end(self, build_id: str, live: _Live, outcome: Outcome) -> None:
        if outcome.status in (BuildStatus.SUCCEEDED, BuildStatus.FAILED):
            self.down = ""  # a verdict: the build system answers again
        try:
            await self._finish(build_id, live, outcome)
        finally:
            self._live.pop(build_id, None)
            shutil.rmtree(self._home(build_id), ignore_errors=True)

    async def _run(self, build_id: str, live: _Live) -> None:
        outcome = Outcome(BuildStatus.ERRORED, "the build ended without a verdict")
        parked = False
        try:
            outcome = await self._build(build_id, live)
            infra = outcome.exit_code in self.infra_exit_codes
            parked = infra and not live.cancelled.is_set()
            if infra and not parked:
                outcome = Outcome(BuildStatus.CANCELLED, "cancelled while it waited for the "
                                                         "build system", outcome.exit_code)
        except asyncio.CancelledError:
            if live.pid is not None:
                kill_group(live.pid)
            outcome = Outcome(BuildStatus.ERRORED, live.stopping or "interrupted")
        except TreeRefused as exc:
            outcome = Outcome(BuildStatus.FAILED, str(exc))
        except SandboxUnavailable as exc:
            self.sandbox.failed(str(exc))
            outcome = Outcome(BuildStatus.ERRORED, f"sandbox unavailable: {exc}")
            log.error("build %s of queue %s: %s", build_id, self.queue, outcome.detail)
        except Exception as exc:
            outcome = Outcome(BuildStatus.ERRORED, f"infrastructure failure while {live.phase}: "
                                                   f"{type(exc).__name__}: {exc}")
            log.warning("build %s errored", build_id, exc_info=True)
        if parked:
            try:
                shutil.rmtree(self._home(build_id), ignore_errors=True)
                await self._park(build_id, live, outcome)
                return
            except Exception as exc:
                live.infra = ""
                outcome = Outcome(BuildStatus.ERRORED, f"could not wait for the build system: "
                                                       f"{type(exc).__name__}: {exc}")
        await self._end(build_id, live, outcome)

    async def _build(self, build_id: str, live: _Live) -> Outcome:
        waiting = asyncio.create_task(self._slots.acquire())
        cancelled = asyncio.create_task(live.cancelled.wait())
        try:
            await asyncio.wait({waiting, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
            if not waiting.done():
                waiting.cancel()
        if not waiting.done() or waiting.cancelled():
            return Outcome(BuildStatus.CANCELLED, "cancelled while waiting for a build slot")
        try:
            if live.cancelled.is_set():
                return Outcome(BuildStatus.CANCELLED, "cancelled while waiting for a build slot")
            problem = await self.sandbox.check()
            if problem is not None:
                raise SandboxUnavailable(problem)
            await self.store.update(build_id, now_ms=self.clock(), status=BuildStatus.RUNNING)
            request = live.request
            live.phase = "preparing the tree"
            async with speculative_tree(
                path=self.trees / build_id, mirror_for=self._mirror, repos=self.repos,
                target_branch=self.target_branch, base_changes=request.base_changes,
                head_changes=request.head_changes, say=live.log.line, steps=request.steps,
            ) as tree:
                await self.store.update(build_id, now_ms=self.clock(), tested=TestedTree(
                    base=tree.base, commit=tree.head, tree=tree.tree, changes=tree.changes))
                if live.cancelled.is_set():
                    return Outcome(BuildStatus.CANCELLED, "cancelled before the command ran")
                live.phase = "running the command"
                home = self._home(build_id)
                home.mkdir(parents=True, exist_ok=True)
                env = build_env(home, {
                    "SQ_QUEUE": request.queue, "SQ_BUILD_ID": build_id,
                    "SQ_BATCH_ID": request.batch_id, "SQ_PATH_ID": request.path_id,
                    "SQ_ATTEMPT": str(request.attempt), "SQ_BASE": tree.base,
                    "SQ_HEAD": tree.head,
                })
                argv = command_argv(self.command)
                where = "in the tree" if self.sandbox.sandbox is None else "in the tree, sandboxed"
                live.log.line(f"running {argv!r} {where} (timeout {self.timeout_s:g}s)")
                await self._flush(build_id, live)

                async def started(pid: int) -> None:
                    live.pid = pid
                    await self.store.update(build_id, now_ms=self.clock(), pid=pid)

                if self.sandbox.sandbox is None:
                    return await run_command(
                        argv, cwd=tree.path, env=env, log=live.log, timeout_s=self.timeout_s,
                        cancelled=live.cancelled, grace_s=self.kill_grace_s, on_start=started)
                return await run_sandboxed(
                    self.sandbox.sandbox, argv, tree=tree.path, home=home, env=env,
                    log=live.log, timeout_s=self.timeout_s, cancelled=live.cancelled,
                    grace_s=self.kill_grace_s, on_start=started, hidden=self.sandbox.hidden,
                    python=self.sandbox.python)
        finally:
            self._slots.release()

    async def _finish(self, build_id: str, live: _Live, outcome: Outcome) -> None:
        live.log.line(f"{outcome.status.value}: {outcome.detail}")
        await self._flush(build_id, live)
        await self.store.update(build_id, now_ms=self.clock(), status=outcome.status,
                                detail=outcome.detail, exit_code=outcome.exit_code)

    async def _flush(self, build_id: str, live: _Live) -> None:
        if live.log.dirty:
            live.log.dirty = False
            await self.store.set_log(build_id, live.log.text())

    def _home(self, build_id: str) -> Path:
        """The command's scratch HOME and TMPDIR, next to its tree."""
        return self.trees / f"{build_id}.home"

    def _mirror(self, key: str) -> GitMirror:
        return self._mirror_at(self.root / "mirrors" / mirror_name(key), self.repos[key])

    def _mirror_at(self, path: Path, url: str = "") -> GitMirror:
        return GitMirror(path, repo_url(url) if url else "", self.root / ".home",
                         self.git_timeout)


def _try_lock(path: Path) -> int | None:
    """An exclusive ``flock`` on ``path`` held by the returned descriptor (None if taken)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
