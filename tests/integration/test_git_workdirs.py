"""Several processes sharing one git ``work_dir`` (as several ``submitqueue serve``
processes on one host with the same ``git.work_dir`` do): merges, merge checks, change
look-ups and builds run at once in two OS processes without breaking each other, and
what a crashed process left behind is still cleaned up, while a live one's is not.

Each child process is a real Python interpreter with its own event loop, its own
extension instances and its own in-process locks; only the directory is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.domain.states import BuildStatus, LandStrategy
from app.extensions.base import BuildRequest, MergeSpec, MergeStep
from app.extensions.builds.command import CommandBuildRunner
from app.extensions.builds.memory import MemoryBuildStore
from app.extensions.git import cli as gitutil
from app.extensions.git.apply import new_owner, owner_is_dead
from app.extensions.git.cli import GitError, GitMirror, git_env, mirror_name
from app.extensions.git.locking import host_flock, mirror_lock
from app.extensions.git.merger import GitMerger
from tests.gitfixtures import GitSandbox

pytestmark = pytest.mark.timeout(90)

KEY = "example.com/team/repo"
ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import asyncio, json, os, sys, time
from pathlib import Path
from app.domain.states import LandStrategy
from app.extensions.base import BuildRequest, MergeSpec, MergeStep
from app.extensions.builds.command import CommandBuildRunner
from app.extensions.builds.memory import MemoryBuildStore
from app.extensions.git.provider import GitChangeProvider
from app.extensions.git import land as gitland
from app.extensions.git.apply import new_owner
from app.extensions.git.locking import mirror_lock
from app.extensions.git.merger import GitMerger

KEY = "example.com/team/repo"
mode, work, remote, arg = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
BUILD = [sys.executable, "-c",
         "import os, sys, time; time.sleep(0.3); sys.exit(0 if os.path.exists('a.txt') else 7)"]


def spec(uri, step_id, strategy=LandStrategy.SQUASH_REBASE):
    return MergeSpec(queue="q", id=step_id, steps=(MergeStep(step_id, (uri,), strategy),))


def runner(command=BUILD):
    return CommandBuildRunner(queue="q", command=command, repos={KEY: remote},
                              target_branch="main", work_dir=work / "builds",
                              store=MemoryBuildStore(), timeout_s=60, kill_grace_s=1.0,
                              sandbox=None)  # the test finds its commands from the host


async def build(r, uri):
    build_id = await r.trigger(BuildRequest(queue="q", batch_id="b", path_id="p", attempt=1,
                                            base_changes=(), head_changes=(uri,)))
    while not (report := await r.status(build_id)).status.terminal:
        await asyncio.sleep(0.05)
    return f"{report.status.value}: {report.detail}"


async def work_mode(plan):
    merger = GitMerger({KEY: remote}, "main", work / "merger")
    provider = GitChangeProvider({KEY: remote}, "main", work / "provider")
    r = runner()
    await r.start()
    print("ready", flush=True)
    go = Path(plan["go"])
    while not go.exists():  # both processes start together
        await asyncio.sleep(0.01)
    result = {"errors": [], "checks": [], "merges": [], "builds": [], "gets": []}

    async def guard(kind, coro):
        try:
            out = await coro
            if kind is not None:
                result[kind].append(out)
        except Exception as exc:
            result["errors"].append(f"{kind}: {type(exc).__name__}: {exc}")

    async def checks():
        for round_ in range(plan["rounds"]):
            for i, uri in enumerate(plan["checks"]):
                out = await merger.check(spec(uri, f"C{round_}{i}"))
                result["checks"].append(out.succeeded or out.reason)

    jobs = [guard(None, checks())]
    jobs += [guard("merges", merger.merge(spec(u, sid))) for sid, u in plan["merges"]]
    jobs += [guard("builds", build(r, u)) for u in plan["builds"]]
    jobs += [guard("gets", provider.get("q", [u])) for u in plan["checks"]]
    await asyncio.gather(*jobs)
    await r.stop()
    result["merges"] = [m.succeeded or m.reason for m in result["merges"]]
    result["gets"] = [len(g) for g in result["gets"]]
    print(json.dumps(result), flush=True)


async def crash_in_merge(uri):
    merger = GitMerger({KEY: remote}, "main", work / "merger")

    async def hang(*args):
        print("inside", flush=True)
        await asyncio.sleep(600)

    gitland.apply_change = hang  # stops inside the scratch worktree, holding the lock
    await merger.check(spec(uri, "SQX"))


async def hold_worktree(_):
    merger = GitMerger({KEY: remote}, "main", work / "merger")
    mirror = merger.mirror(KEY)
    async with mirror_lock(mirror.path):
        tip, _ = await mirror.fetch("main", [])
        path = work / "merger" / "worktrees" / mirror.path.name / new_owner() / "held"
        path.parent.mkdir(parents=True)
        await mirror.git("worktree", "add", "--detach", "--quiet", str(path), tip)
    print(path, flush=True)
    await asyncio.sleep(600)


async def build_and_wait(uri):
    r = runner([sys.executable, "-c", "import time; time.sleep(600)"])
    await r.start()
    build_id = await r.trigger(BuildRequest(queue="q", batch_id="b", path_id="p", attempt=1,
                                            base_changes=(), head_changes=(uri,)))
    while r._live[build_id].pid is None:  # its command runs in its tree
        await asyncio.sleep(0.05)
    print(r.trees, flush=True)
    await asyncio.sleep(600)


modes = {"work": lambda: work_mode(json.loads(arg)), "crash": lambda: crash_in_merge(arg),
         "hold": lambda: hold_worktree(arg), "build": lambda: build_and_wait(arg)}
asyncio.run(modes[mode]())
'''


class Remote(GitSandbox):
    """A bare ``remote.git`` with ``main`` and a working clone that pushes branches."""

    def move_main(self, text: str) -> str:
        sha = self.commit({"main.txt": text}, f"main: {text}")
        self.git("push", "--quiet", "origin", "main")
        return sha

    def change(self, branch: str, files: Mapping[str, str]) -> str:
        self.git("checkout", "--quiet", "-B", branch, "main")
        uri = self.push(branch, self.commit(files, f"add {branch}"))
        self.git("checkout", "--quiet", "main")
        return uri


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote.seeded(tmp_path, KEY, files={"a.txt": "one\n"}, work="clone")


class Children:
    def __init__(self, tmp_path: Path, remote: Remote) -> None:
        self.script = tmp_path / "child.py"
        self.script.write_text(CHILD)
        self.work = tmp_path / "work"
        self.remote = remote
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, mode: str, arg: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(self.script), mode, str(self.work), str(self.remote.bare), arg],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    async def line(self, proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        text = (await asyncio.to_thread(proc.stdout.readline)).strip()
        if not text:
            assert proc.stderr is not None
            pytest.fail(f"child exited {proc.wait()}: {proc.stderr.read()[-3000:]}")
        return text

    def kill(self, proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        for pid in _running_in(self.work):  # build commands the children left running
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def children(tmp_path: Path, remote: Remote) -> Iterator[Children]:
    kids = Children(tmp_path, remote)
    yield kids
    kids.close()


def worktrees(mirror: Path) -> list[str]:
    """The worktrees git knows of in ``mirror`` (the bare repository itself left out)."""
    out = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=mirror,
                         env=git_env(mirror.parent / "h"), capture_output=True, text=True,
                         check=True).stdout
    paths = [line[len("worktree "):] for line in out.splitlines() if line.startswith("worktree ")]
    return [p for p in paths if Path(p) != mirror]


def mirror_of(work: Path, part: str) -> Path:
    return work / part / "mirrors" / mirror_name(KEY)


# ---------------------------------------------------------------- two processes at once


async def test_two_processes_merge_check_and_build_on_one_work_dir(
    tmp_path: Path, remote: Remote, children: Children,
) -> None:
    uris = [remote.change(f"c{i}", {f"c{i}.txt": f"change {i}\n"}) for i in range(6)]
    go = tmp_path / "go"
    plans = [{"go": str(go), "rounds": 3, "checks": uris[:4],
              "merges": [[f"SQ{p}", uris[4 + p]]],
              "builds": uris[p * 2:p * 2 + 3]} for p in range(2)]
    procs = [children.start("work", json.dumps(plan)) for plan in plans]
    assert [await children.line(p) for p in procs] == ["ready", "ready"]
    go.touch()  # both are set up and waiting: they start together
    results: list[dict[str, Any]] = [json.loads(await children.line(p)) for p in procs]

    for proc, result in zip(procs, results, strict=True):
        assert proc.wait(timeout=30) == 0
        assert result["errors"] == []
        assert result["checks"] == [True] * 12
        assert result["merges"] == [True]
        assert result["gets"] == [1] * 4
        assert [b.startswith("succeeded: command exited 0") for b in result["builds"]] == [
            True] * 3, result["builds"]
    landed = set(remote.git("ls-tree", "--name-only", "main", cwd=remote.bare).split())
    assert {"c4.txt", "c5.txt"} <= landed
    work = children.work
    # nothing left behind: no worktree git still knows of, no scratch worktree on disk
    for part in ("merger", "builds"):
        assert worktrees(mirror_of(work, part)) == []
    assert list((work / "merger" / "worktrees").rglob(".git")) == []
    assert list((work / "builds").glob("trees*/*")) == []


# ---------------------------------------------------------------- crashed and live owners


async def test_a_crashed_mergers_worktree_is_cleaned_and_a_live_ones_is_kept(
    tmp_path: Path, remote: Remote, children: Children,
) -> None:
    change = remote.change("c", {"c.txt": "c\n"})
    live = children.start("hold", "-")
    held = Path(await children.line(live))
    crasher = children.start("crash", change)
    assert await children.line(crasher) == "inside"  # inside its worktree, holding the lock
    mirror = mirror_of(children.work, "merger")
    scratch = children.work / "merger" / "worktrees" / mirror.name
    crashed = [p for p in worktrees(mirror) if Path(p) != held]
    assert len(crashed) == 1 and Path(crashed[0]).is_dir()
    children.kill(crasher)  # the kernel drops its lock; its worktree stays behind

    merger = GitMerger({KEY: str(remote.bare)}, "main", children.work / "merger")
    outcome = await merger.merge(MergeSpec(queue="q", id="SQ1", steps=(
        MergeStep("SQ1", (change,), LandStrategy.SQUASH_REBASE),)))

    assert outcome.succeeded, outcome.reason
    assert not Path(crashed[0]).exists()
    assert not Path(crashed[0]).parent.exists()  # the dead owner's directory is gone
    assert worktrees(mirror) == [str(held)]  # git forgot the dead one, not the live one
    assert (held / "a.txt").read_text() == "one\n"
    assert live.poll() is None
    assert sorted(p.name for p in scratch.iterdir()) == sorted([held.parent.name, merger.owner])
    assert list((scratch / merger.owner).iterdir()) == []


async def test_a_crashed_runners_trees_are_cleaned_and_a_live_ones_are_kept(
    tmp_path: Path, remote: Remote, children: Children,
) -> None:
    change = remote.change("c", {"c.txt": "c\n"})
    first = runner(remote, children.work)
    await first.start()  # holds the directory lock: the children build in their own dirs
    try:
        live = children.start("build", change)
        dead = children.start("build", change)
        live_trees, dead_trees = Path(await children.line(live)), Path(await children.line(dead))
        assert live_trees.name.startswith("trees-") and dead_trees.name.startswith("trees-")
        mirror = mirror_of(children.work, "builds")
        assert len(worktrees(mirror)) == 2
        (dead_tree,) = [p for p in dead_trees.iterdir() if not p.name.endswith(".home")]
        command = _running_in(dead_tree)
        assert command
        children.kill(dead)
        for pid in command:  # its build's command outlives it: end it ourselves
            os.kill(pid, signal.SIGKILL)

        second = runner(remote, children.work)
        await second.start()
        await second.stop()

        assert not dead_trees.exists()
        assert [Path(p).parent for p in worktrees(mirror)] == [live_trees]
        assert list(live_trees.glob("cmd-*/a.txt"))  # the live build's tree is untouched
        assert live.poll() is None
        assert not second.trees.exists()  # it removed its own empty directory at stop
        build_id = await first.trigger(BuildRequest(  # the lock holder still builds
            queue="q", batch_id="b", path_id="p", attempt=1, base_changes=(),
            head_changes=(change,)))
        deadline = time.monotonic() + 30
        while not (report := await first.status(build_id)).status.terminal:
            assert time.monotonic() < deadline, report
            await asyncio.sleep(0.05)
        assert report.status is BuildStatus.SUCCEEDED, report
    finally:
        await first.stop()


def runner(remote: Remote, work: Path) -> CommandBuildRunner:
    return CommandBuildRunner(queue="q", command=["{python}", "-c", "pass"],
                              repos={KEY: str(remote.bare)}, target_branch="main",
                              work_dir=work / "builds", store=MemoryBuildStore())


def _running_in(path: Path) -> list[int]:
    """The processes whose working directory is ``path`` or below it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(os.readlink(entry / "cwd")).is_relative_to(path):
                    found.append(int(entry.name))
    return found


# ---------------------------------------------------------------- owners and the host lock


def test_an_owner_is_dead_only_when_provably_so() -> None:
    me = new_owner()
    host, pid, start, _ = me.split("~")
    assert int(pid) == os.getpid()
    assert not owner_is_dead(me)
    assert new_owner() != me  # a fresh random part per instance
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert owner_is_dead(f"{host}~{gone.pid}~{start}~x")  # no such process any more
    assert owner_is_dead(f"{host}~{pid}~{int(start) + 1}~x")  # the pid was reused
    assert not owner_is_dead(f"elsewhere~{gone.pid}~{start}~x")  # another host: unknown
    assert not owner_is_dead("a-name-of-another-form")


async def test_the_mirror_lock_excludes_another_process_and_survives_cancel(
    tmp_path: Path,
) -> None:
    mirror = tmp_path / "m.git"
    other = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(1.0)",
         str(tmp_path / "m.git.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None
        assert (await asyncio.to_thread(other.stdout.readline)).strip() == "held"
        waiter = asyncio.create_task(host_flock(tmp_path / "m.git.lock"))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        waiter.cancel()  # a cancelled wait must not keep the lock when it comes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        started = time.monotonic()
        async with mirror_lock(mirror):  # blocks until the other process lets go
            waited = time.monotonic() - started
            assert other.wait(timeout=10) == 0
        assert waited > 0.3
    finally:
        if other.poll() is None:
            other.kill()
        other.wait()
        if other.stdout is not None:
            other.stdout.close()
    fd = await asyncio.wait_for(host_flock(tmp_path / "m.git.lock"), 5)  # free again
    os.close(fd)


async def test_a_fetch_waits_out_a_ref_lock_and_clears_a_stale_one(
    tmp_path: Path, remote: Remote, monkeypatch: pytest.MonkeyPatch,
) -> None:
    mirror = GitMirror(tmp_path / "m.git", str(remote.bare), tmp_path / "h")
    lock = mirror.path / "refs" / "heads" / "main.lock"
    async with mirror_lock(mirror.path):
        await mirror.fetch("main", [])
        # a git process of a dead server still updates main: wait until it is done
        lock.write_text("")
        new = remote.move_main("one")

        async def let_go() -> None:
            await asyncio.sleep(0.3)
            lock.unlink()

        releasing = asyncio.create_task(let_go())
        assert (await mirror.fetch("main", []))[0] == new
        await releasing
        # a lock file left by a git process killed long ago: removed, then fetched
        lock.write_text("")
        old = time.time() - gitutil.STALE_LOCK_S - 60
        os.utime(lock, (old, old))
        new = remote.move_main("two")
        assert (await mirror.fetch("main", []))[0] == new
        assert not lock.exists()
        # a fresh lock that is never released: an error once the retries are spent
        monkeypatch.setattr(gitutil, "REF_LOCK_RETRIES", (0.01, 0.01))
        lock.write_text("")
        remote.move_main("three")
        with pytest.raises(GitError, match="cannot lock ref 'refs/heads/main'"):
            await mirror.fetch("main", [])
