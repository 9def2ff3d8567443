"""``submitqueue demo``: push real changes to a git queue's repository, land them through
the REST API as each is created, follow them live, and check the outcome.

Run against a server started from the same checkout (``make run``). The demo reads the
queues file the server uses (``--queues-file``, default ``SQ_QUEUES_FILE`` or
``./queues.yaml``) to find the queue's repository, ``repo_key`` and target branch; it
creates the sandbox repository if missing with the server's own code
(``factory.prepare_repository``). See ``app/cli/demo_git.py`` for what the changes contain.

Exit status: 0 when every change expected to land landed (its files are on the target
branch) and every broken change ended ``error`` (its files are not); 1 when an outcome
differs, the requests did not settle within ``--timeout``, or the server refused a call;
2 when the demo cannot start (queue not a git queue, bad queues file, server unreachable).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TextIO

import typer

from app.cli.client import DEFAULT_URL, ClientError, GatewayClient
from app.cli.commands import Url, run_exit_async
from app.cli.demo_git import TEST_SCRIPT, PlannedChange, ScratchClone, change_uri, plan
from app.cli.table import LiveTable, Row, Watcher
from app.domain.errors import ValidationError
from app.domain.queue_config import GitConfig, QueueConfig
from app.domain.states import LandStrategy
from app.extensions.factory import load_queues_file, prepare_repository
from app.extensions.git.cli import GitError
from app.settings import get_settings


def absolute_links(text: str, base_url: str) -> str:
    """The error whole, its server paths (``/api/v1/builds/<id>/log``) as full URLs a
    person can open from the terminal."""
    return re.sub(r"(?<![\w/:])(/api/v1/\S+?)(?=[),\s]|$)",
                  lambda m: base_url.rstrip("/") + m.group(1), text)

class DemoAbort(Exception):
    """The demo cannot run; ``str()`` says why and what to do."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class DemoOptions:
    url: str
    token: str | None = None
    queue: str = "sandbox"
    count: int = 8
    folders: int = 3
    fail: int = 0
    stacked: bool = False
    seed: int | None = None
    timeout_s: float = 300.0
    queues_file: Path | None = None
    strategy: str | None = None
    files_per_change: int = 2
    poll_s: float = 0.5


@dataclass(frozen=True, slots=True)
class Submitted:
    """One land request of the demo and the planned changes it carries."""

    sqid: str
    changes: tuple[PlannedChange, ...]

    @property
    def expect(self) -> str:
        return "error" if any(c.broken for c in self.changes) else "landed"

    @property
    def label(self) -> str:
        broken = sum(c.broken for c in self.changes)
        if len(self.changes) == 1:
            c = self.changes[0]
            return f"#{c.index} {c.folder}" + (" broken" if broken else "")
        first, last = self.changes[0].index, self.changes[-1].index
        return f"#{first}-#{last} stack" + (f" ({broken} broken)" if broken else "")


def git_queue(opts: DemoOptions) -> tuple[QueueConfig, GitConfig, Path]:
    """The queue's configuration from the queues file; ``DemoAbort`` when unusable."""
    path = opts.queues_file or get_settings().queues_file
    try:
        configs = load_queues_file(path)
    except ValidationError as exc:
        raise DemoAbort(str(exc)) from None
    config = configs.get(opts.queue)
    if config is None:
        raise DemoAbort(f"queue {opts.queue!r} is not in {str(path)!r} (it has: "
                        f"{', '.join(configs)}); pass --queue or --queues-file")
    if config.git is None or config.change_provider.type != "git":
        raise DemoAbort(
            f"queue {opts.queue!r} is not a git queue (change_provider: "
            f"{config.change_provider.type}); the demo pushes real branches, so it needs a "
            "queue with change_provider: {type: git} and a git block, such as 'sandbox'")
    work_dir = Path(config.git.work_dir or f"./var/git/{config.name}")
    return config, config.git, work_dir


async def _check_server(client: GatewayClient, queue: str) -> None:
    try:
        served = [q.name for q in await client.queues()]
    except ClientError as exc:
        raise DemoAbort(str(exc)) from None
    if queue not in served:
        raise DemoAbort(f"the server at {client.base_url} does not serve queue {queue!r} (it "
                        f"serves: {', '.join(served) or 'none'}); start it with the same "
                        "queues file (SQ_QUEUES_FILE) the demo reads")


class Demo:
    def __init__(self, opts: DemoOptions, out: TextIO, *, tty: bool | None = None) -> None:
        self.opts = opts
        self.out = out
        self.table = LiveTable(out, tty=tty)
        self.tag = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)
        self.seed = opts.seed if opts.seed is not None else secrets.randbelow(1_000_000)
        self.submitted: list[Submitted] = []

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    async def run(self) -> int:
        opts = self.opts
        config, git, work_dir = git_queue(opts)
        try:
            changes = plan(self.tag, count=opts.count, folders=opts.folders, fail=opts.fail,
                           seed=self.seed, files_per_change=opts.files_per_change)
        except ValueError as exc:
            raise DemoAbort(str(exc)) from None
        async with GatewayClient(opts.url, token=opts.token) as client:
            await _check_server(client, config.name)
            try:
                await asyncio.to_thread(prepare_repository, config.name, git, work_dir)
            except ValidationError as exc:
                raise DemoAbort(str(exc)) from None
            return await self._run(client, config, git, changes)

    async def _run(self, client: GatewayClient, config: QueueConfig, git: GitConfig,
                   changes: list[PlannedChange]) -> int:
        opts = self.opts
        broken = [c.index for c in changes if c.broken]
        mode = "one stacked request" if opts.stacked else "one request each"
        self.say(f"demo run {self.tag} on queue {config.name!r}: {opts.count} changes in "
                 f"{opts.folders} folders, {mode}; seed {self.seed} (--seed {self.seed} "
                 "repeats the choice of broken changes)")
        self.say(f"repository {git.repository} (target {git.target_branch}); broken changes: "
                 f"{', '.join(f'#{i}' for i in broken) or 'none'}")
        if broken and config.build_runner.type == "fake":
            self.say(f"warning: queue {config.name!r} builds with the fake runner, which does "
                     f"not run {TEST_SCRIPT}: the broken changes will land and the demo will fail")
        async with ScratchClone(git.repository, git.target_branch) as clone:
            argv = getattr(config.build_runner, "command", ()) or ()
            if any(TEST_SCRIPT in arg for arg in argv) and not await clone.has(TEST_SCRIPT):
                self.say(f"warning: {git.target_branch} has no {TEST_SCRIPT}, which the "
                         f"queue's build command runs: every build will fail (a sandbox "
                         "created by an older SubmitQueue lacks it; delete it to re-create)")
            watcher = Watcher(client, self.table, poll_s=opts.poll_s)
            settled = await self._land_and_watch(client, clone, watcher, changes, git)
            await clone.refresh_target()
            files = await clone.target_files("demo")
            log = await clone.target_log(opts.count + 1)
        return self._report(watcher, settled, files, log, git)

    async def _land_and_watch(self, client: GatewayClient, clone: ScratchClone,
                              watcher: Watcher, changes: list[PlannedChange],
                              git: GitConfig) -> bool:
        opts = self.opts
        adding_done = asyncio.Event()
        deadline = time.monotonic() + opts.timeout_s

        def title(pushed: int) -> str:
            return f"demo {self.tag}: {pushed}/{len(changes)} changes pushed"

        async def land(group: tuple[PlannedChange, ...], uris: list[str]) -> None:
            sqid = await client.land(opts.queue, uris, opts.strategy)
            item = Submitted(sqid=sqid, changes=group)
            self.submitted.append(item)
            watcher.add(Row(sqid=sqid, changes=item.label))

        async def create() -> None:
            try:
                uris: list[str] = []
                for n, change in enumerate(changes, 1):
                    sha = await clone.make(change, on_previous=opts.stacked and n > 1)
                    uri = change_uri(git.repo_key, change.branch, sha)
                    watcher.title = title(n)
                    if opts.stacked:
                        uris.append(uri)
                    else:
                        await land((change,), [uri])
                if opts.stacked:
                    await land(tuple(changes), uris)
            finally:
                adding_done.set()

        watcher.title = title(0)
        creator = asyncio.create_task(create())
        follower = asyncio.create_task(watcher.run(deadline=deadline, adding_done=adding_done))
        try:
            await asyncio.wait({creator, follower}, return_when=asyncio.FIRST_EXCEPTION)
            failure = creator.exception() if creator.done() else None
            if isinstance(failure, GitError | OSError | TimeoutError):
                raise DemoAbort(f"pushing a demo change failed: {failure}") from failure
            if failure is not None:
                raise failure
            return await follower
        finally:
            for task in (creator, follower):
                task.cancel()
            await asyncio.gather(creator, follower, return_exceptions=True)

    def _report(self, watcher: Watcher, settled: bool, files: set[str], log: str,
                git: GitConfig) -> int:
        rows = watcher.rows
        self.table.final(list(rows.values()))
        self.say()
        if not settled:
            waiting = [f"{r.sqid} ({r.status})" for r in watcher.unsettled]
            self.say(f"timed out after {self.opts.timeout_s:g} s; not settled: "
                     f"{', '.join(waiting)}")
        counts = {s: sum(1 for r in rows.values() if r.status == s)
                  for s in ("landed", "error", "cancelled")}
        expected = {s: sum(1 for x in self.submitted if x.expect == s) for s in ("landed", "error")}
        self.say(f"requests: {counts['landed']} landed, {counts['error']} error, "
                 f"{counts['cancelled']} cancelled (expected {expected['landed']} landed, "
                 f"{expected['error']} error)")
        problems: list[str] = []
        for item in self.submitted:
            row = rows[item.sqid]
            if row.settled and row.status != item.expect:
                why = f": {row.last_error}" if row.last_error else ""
                problems.append(f"{item.sqid} {item.label}: expected {item.expect}, "
                                f"got {row.status}{why}")
            for change in item.changes:
                on_target = {p for p, _ in change.files} & files
                if row.status == "landed" and len(on_target) != len(change.files):
                    problems.append(f"{item.sqid} #{change.index} is landed but its files are "
                                    f"not all on {git.target_branch}")
                if row.status != "landed" and on_target:
                    problems.append(f"{item.sqid} #{change.index} is {row.status} but "
                                    f"{sorted(on_target)[0]} is on {git.target_branch}")
        for item in self.submitted:
            row = rows[item.sqid]
            if row.status == "error" and item.expect == "error":
                self.say(f"  {item.sqid} {item.label} ended error as expected: "
                         f"{absolute_links(row.last_error, self.opts.url)}")
        self.say()
        self.say(f"git log --oneline -n {self.opts.count + 1} {git.target_branch} "
                 f"({git.repository}):")
        for line in log.splitlines():
            self.say(f"  {line}")
        self.say()
        if problems:
            self.say("demo FAILED:")
            for p in problems:
                self.say(f"  {p}")
        if problems or not settled:
            return 1
        self.say("demo passed: every change landed or failed as expected")
        return 0


async def run_demo(opts: DemoOptions, out: TextIO, *, tty: bool | None = None) -> int:
    """Run the demo, writing to ``out``; the exit status (messages for 2 go to ``out``)."""
    try:
        return await Demo(opts, out, tty=tty).run()
    except DemoAbort as exc:
        out.write(f"demo: {exc}\n")
        out.flush()
        return exc.exit_code
    except ClientError as exc:
        out.write(f"demo: {exc}\n")
        out.flush()
        return exc.exit_code
    except GitError as exc:
        out.write(f"demo: git failed: {exc}\n")
        out.flush()
        return 2


def demo_command(
    count: Annotated[int, typer.Option(min=1, max=500, help="How many changes.")] = 8,
    folders: Annotated[int, typer.Option(min=1, max=99,
                                         help="Spread over demo/01 .. demo/<F>.")] = 3,
    fail: Annotated[int, typer.Option(min=0, help="How many changes break the test.")] = 0,
    stacked: Annotated[bool, typer.Option(
        help="Chain the changes and land them as one request.")] = False,
    seed: Annotated[int | None, typer.Option(
        help="Chooses the broken changes (default: random, printed).")] = None,
    files: Annotated[int, typer.Option(min=1, max=20, help="New files per change.")] = 2,
    queue: Annotated[str, typer.Option("--queue", "-q", help="A git queue.")] = "sandbox",
    queues_file: Annotated[Path | None, typer.Option(
        help="The queues file the server uses (default: SQ_QUEUES_FILE).")] = None,
    strategy: Annotated[LandStrategy | None, typer.Option(
        help="How to land (default: the queue's).")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds until all settle.")] = 300,
    url: Url = DEFAULT_URL,
    github: Annotated[bool, typer.Option(
        "--github", help="Run everything here against a fake GitHub: pull requests, "
        "labels, checks, landing (docs/github.md); starts its own server.")] = False,
) -> None:
    """Push changes to a git queue's sandbox repository, land them, and watch them live.

    Exit 0 only if every good change landed and every broken one ended `error`."""
    if fail > count:
        raise typer.BadParameter(f"--fail {fail} is more than --count {count}",
                                 param_hint="--fail")
    if github:  # self-contained: a fake GitHub and a server of its own
        from app.cli.demo_github import run_github_demo

        run_exit_async(lambda: run_github_demo(sys.stdout, count=count, fail=fail,
                                               timeout_s=timeout))
        return
    opts = DemoOptions(
        url=url, token=os.environ.get("SQ_TOKEN") or None, queue=queue, count=count,
        folders=folders, fail=fail, stacked=stacked, seed=seed, timeout_s=timeout,
        queues_file=queues_file, strategy=strategy.value if strategy else None,
        files_per_change=files)
    run_exit_async(lambda: run_demo(opts, sys.stdout))
