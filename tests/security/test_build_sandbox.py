"""The command runner's sandbox (bubblewrap) on real git repositories and real builds:
what a hostile build can see and touch, that timeouts and cancels still kill every
process it started, the network switch, and what happens when bwrap cannot be used.

Every build here runs a script committed in the change itself, as an attacker's would."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from app.db.repos.build_runs import SqlBuildStore
from app.domain.errors import ValidationError
from app.domain.queue_config import parse_queues
from app.domain.states import BuildStatus
from app.extensions.base import BuildReport
from app.extensions.builds.command import CommandBuildRunner
from app.extensions.builds.sandbox import Bwrap, SandboxUnavailable, find_bwrap
from app.extensions.factory import build_extensions
from app.speculation.scoring import build_scorer
from tests.gitfixtures import GitSandbox, change_uri
from tests.security.attack import ATTACK, needs_bwrap
from tests.support.builds import BeatingRunner, build_request

pytestmark = [
    pytest.mark.timeout(90),
    needs_bwrap,
]

KEY = "example.com/team/repo"



request = build_request


@pytest.fixture
def remote(tmp_path: Path) -> GitSandbox:
    return GitSandbox.seeded(tmp_path, KEY, files={"a.txt": "one\n", "attack.py": ATTACK})


def attack(remote: GitSandbox, branch: str, targets: dict[str, Any]) -> str:
    """A change whose targets.json tells attack.py what to try; its change URI."""
    remote.git("fetch", "--quiet", "origin")
    remote.git("checkout", "--quiet", "-B", branch, "origin/main")
    sha = remote.commit({"targets.json": json.dumps(targets)}, f"attack {branch}")
    remote.push(branch, sha)
    return change_uri(KEY, branch, sha)


RunnerFactory = Callable[..., BeatingRunner]


@pytest.fixture
async def make_runner(tmp_path: Path, remote: GitSandbox,
                      store: SqlBuildStore) -> AsyncIterator[RunnerFactory]:
    made: list[BeatingRunner] = []

    def make(**kw: Any) -> BeatingRunner:
        args: dict[str, Any] = {
            "queue": "q", "command": ["{python}", "attack.py"], "repos": {KEY: str(remote.bare)},
            "target_branch": "main", "work_dir": tmp_path / "builds", "store": store,
            "timeout_s": 30, "max_parallel": 2, "kill_grace_s": 1.0, "sandbox": Bwrap(),
            "heartbeat_ms": 200, **kw}
        runner = BeatingRunner(**args)  # its heartbeat runs, as in a server
        made.append(runner)
        return runner

    yield make
    for runner in made:
        await runner.stop()


async def wait_until(runner: CommandBuildRunner, build_id: str,
                     done: Callable[[BuildReport], bool], timeout: float = 40) -> BuildReport:
    deadline = time.monotonic() + timeout
    while True:
        report = await runner.status(build_id)
        if done(report):
            return report
        assert time.monotonic() < deadline, f"{build_id} still {report}"
        await asyncio.sleep(0.05)


async def finished(runner: CommandBuildRunner, build_id: str) -> BuildReport:
    return await wait_until(runner, build_id, lambda r: r.status.terminal)


async def log_of(store: SqlBuildStore, build_id: str, until: str = "",
                 timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = await store.get_log(build_id) or ""
        if until in text:
            return text
        assert time.monotonic() < deadline, f"{until!r} never reached the log:\n{text}"
        await asyncio.sleep(0.05)


def report_of(text: str) -> dict[str, Any]:
    [line] = [x for x in text.splitlines() if x.startswith("REPORT ")]
    return json.loads(line[len("REPORT "):])  # type: ignore[no-any-return]


def processes_of(build_id: str) -> set[int]:
    """Host pids of every process whose environment says it belongs to the build."""
    marker = f"SQ_BUILD_ID={build_id}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[-1].split()[0] != "Z":
                    found.add(int(entry.name))
        except OSError:
            continue
    return found


async def wait_processes(build_id: str, at_least: int, timeout: float = 20) -> set[int]:
    deadline = time.monotonic() + timeout
    while len(found := processes_of(build_id)) < at_least:
        assert time.monotonic() < deadline, f"only {found} of the build are running"
        await asyncio.sleep(0.05)
    return found


async def wait_no_processes(build_id: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while found := processes_of(build_id):
        assert time.monotonic() < deadline, f"processes {found} outlived the build"
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------- what a build can reach


async def test_a_hostile_build_sees_only_its_tree_the_system_and_its_own_env(
    tmp_path: Path, remote: GitSandbox, make_runner: RunnerFactory, store: SqlBuildStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SQ_ADMIN_TOKEN", "admin-token-of-the-server")
    (tmp_path / ".env").write_text("SQ_ADMIN_TOKEN=envfile-secret-of-the-server\n")
    (tmp_path / "queues.yaml").write_text("# queues-file-of-the-server\n")
    runner = make_runner(max_parallel=2)
    await runner.start()  # its heartbeat stores the logs as they grow
    # another build, running meanwhile: its tree must stay out of reach
    other = await runner.trigger(request(attack(remote, "other", {"sleep": 20})))
    await log_of(store, other, until="REPORT ")
    other_tree = runner.trees / other
    assert (other_tree / "targets.json").exists()

    outside = runner.root / "written-from-the-build.txt"
    in_tmp = Path(f"/tmp/sq-build-{uuid.uuid4().hex}.txt")
    uri = attack(remote, "evil", {
        "server_pid": os.getpid(),
        "read": {"database": str(tmp_path / "sq.db"), "dotenv": str(tmp_path / ".env"),
                 "queues": str(tmp_path / "queues.yaml"),
                 "other_tree": str(other_tree / "targets.json"),
                 "repository": str(remote.bare / "HEAD"),
                 "shadow": "/etc/shadow", "etc_pip": "/etc/pip.conf",
                 "python_stdlib": os.__file__},
        "list": {"trees": str(runner.trees), "mirrors": str(runner.root / "mirrors"),
                 "root_home": "/root", "slash": "/"},
        "write": {"outside": str(outside), "repository": str(remote.bare / "pwned"),
                  "usr": "/usr/pwned", "tree": "mine.txt", "tmp": str(in_tmp)},
    })
    build_id = await runner.trigger(request(uri))
    report = await finished(runner, build_id)
    text = await log_of(store, build_id, until="[sq] succeeded")
    assert report.status is BuildStatus.SUCCEEDED, text
    seen = report_of(text)

    # a PID namespace and a /proc of its own: the server is not there, pid 1 is the
    # sandbox's init and its environment is the build's
    assert seen["environ:self"] == "read" and seen["environ:1"] == "read"
    assert seen[f"environ:{os.getpid()}"] in ("FileNotFoundError", "PermissionError")
    assert max(seen["pids"]) < 100, seen["pids"]
    # nothing of the server's data, configuration or other builds
    for name in ("database", "dotenv", "queues", "other_tree", "repository", "shadow",
                 "etc_pip"):
        assert seen[name] in ("FileNotFoundError", "PermissionError"), (name, seen[name])
    assert seen["python_stdlib"] == "read"  # {python} works
    assert seen["trees"] == sorted([build_id, f"{build_id}.home"])
    assert seen["mirrors"] == "FileNotFoundError"
    # / holds the system, the binds and their (empty) parents, nothing else of the host
    assert not {"home", "run", "sys", "srv", "opt", "mnt", "boot"} & set(seen["slash"])
    root_home = seen["root_home"]  # at most the parents of a Python installed there
    assert root_home == "FileNotFoundError" or set(root_home) <= {".pyenv", ".local"}
    # only its tree and scratch are writable; the system is read-only; a write anywhere
    # else (here: /tmp, a private tmpfs, holds the tree's parents) never reaches the host
    assert seen["tree"] == "written" and seen["tmp"] == "written"
    assert seen["usr"] == "OSError"  # EROFS: a read-only file system
    assert seen["repository"] == "FileNotFoundError"
    assert not outside.exists() and not (remote.bare / "pwned").exists()
    assert not in_tmp.exists()  # its /tmp was its own
    # the build's own environment: the documented variables only
    assert set(seen["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL",
                                "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "SQ_QUEUE",
                                "SQ_BUILD_ID", "SQ_BATCH_ID", "SQ_PATH_ID", "SQ_ATTEMPT",
                                "SQ_BASE", "SQ_HEAD", "PWD"}  # bwrap sets PWD
    assert seen["env"]["SQ_BUILD_ID"] == build_id
    assert len(seen["fds"]) == 4 and seen["fds"][:3] == [0, 1, 2]  # nothing of the server's
    for secret in ("admin-token-of-the-server", "envfile-secret-of-the-server",
                   "queues-file-of-the-server"):
        assert secret not in text
    assert "sandboxed" in text  # the log says how it ran
    await runner.cancel(other)
    await finished(runner, other)


@pytest.mark.parametrize("network", [False, True])
async def test_the_network_is_the_builds_own_unless_the_queue_allows_the_hosts(
    remote: GitSandbox, make_runner: RunnerFactory, store: SqlBuildStore, network: bool,
) -> None:
    async def hello(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    server = await asyncio.start_server(hello, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        runner = make_runner(sandbox=Bwrap(network=network))
        build_id = await runner.trigger(request(attack(remote, "net", {"port": port})))
        assert (await finished(runner, build_id)).status is BuildStatus.SUCCEEDED
        seen = report_of(await log_of(store, build_id, until="REPORT "))
    finally:
        server.close()
        await server.wait_closed()
    assert seen["connect"] == ("ok" if network else "ConnectionRefusedError")


# ---------------------------------------------------------------- killing it all


@pytest.mark.parametrize("end", ["timeout", "cancel"])
async def test_a_timeout_or_cancel_kills_every_process_of_the_sandboxed_build(
    remote: GitSandbox, make_runner: RunnerFactory, store: SqlBuildStore, end: str,
) -> None:
    runner = make_runner(timeout_s=4 if end == "timeout" else 60)
    await runner.start()
    build_id = await runner.trigger(request(attack(remote, "slow", {"spawn": True,
                                                                   "sleep": 60})))
    await log_of(store, build_id, until="SPAWNED")
    # (sandboxed also bwrap and its init) the command, its child and the grandchild that left
    # the process group with setsid()
    before = await wait_processes(build_id, at_least=3)
    if end == "cancel":
        await runner.cancel(build_id)
    report = await finished(runner, build_id)
    expected = (BuildStatus.FAILED, "timed out after 4s") if end == "timeout" else (
        BuildStatus.CANCELLED, "cancelled while running")
    assert (report.status, report.detail) == expected
    await wait_no_processes(build_id)
    assert not any(Path(f"/proc/{pid}").exists() and pid in processes_of(build_id)
                   for pid in before)


SERVER = """\
import asyncio, sys
from pathlib import Path
from app.extensions.base import BuildRequest
from app.extensions.builds.command import CommandBuildRunner
from app.extensions.builds.memory import MemoryBuildStore

async def main():
    key, remote, work, head = sys.argv[1:5]
    runner = CommandBuildRunner(queue="q", command=["{python}", "attack.py"],
                                repos={key: remote}, target_branch="main",
                                work_dir=Path(work), store=MemoryBuildStore())
    await runner.start()
    print(await runner.trigger(BuildRequest(queue="q", batch_id="q/batch/1", path_id="p",
                                            attempt=1, base_changes=(), head_changes=(head,))),
          flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


async def test_a_sandboxed_build_dies_with_its_server(
    tmp_path: Path, remote: GitSandbox,
) -> None:
    uri = attack(remote, "orphan", {"spawn": True, "sleep": 60})
    (tmp_path / "server.py").write_text(SERVER)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "server.py"), KEY, str(remote.bare),
         str(tmp_path / "builds"), uri], cwd=root, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert proc.stdout is not None
        build_id = (await asyncio.to_thread(proc.stdout.readline)).strip()
        assert build_id.startswith("cmd-"), build_id
        await wait_processes(build_id, at_least=5)  # bwrap, init, command, child, escapee
        proc.kill()  # the server dies without stopping anything
        proc.wait(timeout=10)
        await wait_no_processes(build_id)  # --die-with-parent: nothing of it is left
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def test_a_command_killed_by_a_signal_is_reported_as_killed(
    remote: GitSandbox, make_runner: RunnerFactory,
) -> None:
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    runner = make_runner(command=["{python}", "-c", script])
    build_id = await runner.trigger(request(attack(remote, "killed", {})))
    report = await finished(runner, build_id)
    assert report.status is BuildStatus.FAILED
    assert report.detail.startswith("command killed by SIGKILL (exit 137 in the sandbox)")


# ---------------------------------------------------------------- bwrap unusable


async def test_without_a_usable_bwrap_builds_end_errored_and_never_run_unsandboxed(
    tmp_path: Path, remote: GitSandbox, make_runner: RunnerFactory, store: SqlBuildStore,
) -> None:
    ran = tmp_path / "ran.txt"
    command = ["{python}", "-c", f"open({str(ran)!r}, 'w').write('unsandboxed')"]
    missing = make_runner(command=command, sandbox=Bwrap(binary=str(tmp_path / "no-bwrap")),
                          work_dir=tmp_path / "b1")
    await missing.start()
    ready = missing.readiness()
    assert ready["ok"] is False and "bwrap cannot be started" in ready["error"]
    build_id = await missing.trigger(request(attack(remote, "x", {})))
    report = await finished(missing, build_id)
    assert report.status is BuildStatus.ERRORED
    assert report.detail.startswith("sandbox unavailable: bwrap cannot be started")
    assert "sandbox: none" in report.detail  # the way out is named
    assert f"errored: {report.detail}" in (await store.get_log(build_id) or "")

    # a bwrap that cannot create namespaces (as in a locked-down container)
    fake = tmp_path / "fake-bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not "
                    "permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    denied = make_runner(command=command, sandbox=Bwrap(binary=str(fake)),
                         work_dir=tmp_path / "b2")
    build_id = await denied.trigger(request(attack(remote, "y", {})))
    report = await finished(denied, build_id)
    assert report.status is BuildStatus.ERRORED
    assert "Creating new namespace failed: Operation not permitted" in report.detail
    assert denied.readiness()["ok"] is False
    assert not ran.exists()  # nothing ran outside a sandbox


async def test_a_sandbox_that_fails_only_when_the_build_runs_is_errored_not_failed(
    tmp_path: Path, remote: GitSandbox, make_runner: RunnerFactory,
) -> None:
    """The trial run passes, the build's own bwrap does not start its command: no
    verdict on the change (the path gets a new attempt) and /readyz learns of it."""
    real = find_bwrap()
    assert real is not None
    flaky = tmp_path / "flaky-bwrap"
    flaky.write_text(f'#!/bin/sh\ncase "$*" in *attack.py*) echo "bwrap: execvp: denied" >&2; '
                     f'exit 1;; esac\nexec {real} "$@"\n')
    flaky.chmod(0o755)
    runner = make_runner(sandbox=Bwrap(binary=str(flaky)))
    await runner.start()
    assert runner.readiness()["ok"] is True
    build_id = await runner.trigger(request(attack(remote, "z", {})))
    report = await finished(runner, build_id)
    assert (report.status, report.detail) == (
        BuildStatus.ERRORED, "sandbox unavailable: bwrap could not set up the sandbox: "
                             "bwrap: execvp: denied")
    assert runner.readiness()["ok"] is False


# ---------------------------------------------------------------- configuration


def queue_with(runner: dict[str, Any]) -> str:
    return json.dumps({"queues": [{"name": "q", "build_runner": runner, "git": {
        "repository": "/nowhere.git", "repo_key": "h/r"}}]})


@pytest.mark.parametrize(("runner", "message"), [
    ({"type": "command", "command": ["x"], "sandbox": "firejail"},
     "build_runner.sandbox: Input should be 'bwrap' or 'none'"),
    ({"type": "command", "command": ["x"], "sandbox": "none", "network": True},
     "network applies to sandbox: bwrap only"),
    ({"type": "fake", "sandbox": "bwrap"}, "build_runner type fake takes no sandbox"),
    ({"type": "webhook", "url": "https://ci", "secret_env": "S", "network": True},
     "build_runner type webhook takes no network"),
])
def test_bad_sandbox_config_says_what_to_change(runner: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_queues(queue_with(runner), source="q.yaml")
    assert message in str(info.value), str(info.value)


def test_the_factory_sandboxes_command_builds_unless_told_not_to(tmp_path: Path) -> None:
    GitSandbox.seeded(tmp_path, "h/r")
    runners = {}
    for name, extra in {"default": {}, "net": {"network": True},
                        "bare": {"sandbox": "none"}}.items():
        text = json.dumps({"queues": [{"name": name, "git": {
            "repository": "./remote.git", "repo_key": "h/r"}, "build_runner": {
            "type": "command", "command": ["make"], **extra}}]})
        runner = build_extensions(parse_queues(text, base_dir=tmp_path)[name],
                                  build_scorer).runner
        assert isinstance(runner, CommandBuildRunner)
        runners[name] = runner.sandbox.sandbox
    assert runners == {"default": Bwrap(network=False), "net": Bwrap(network=True),
                       "bare": None}


def test_the_sandbox_argv_binds_only_what_a_build_needs(tmp_path: Path) -> None:
    argv = Bwrap(binary="/usr/bin/bwrap").argv(
        ["make"], tree=tmp_path / "t", home=tmp_path / "h", status_fd=9, python=False)
    text = " ".join(argv)
    assert argv[:2] == ["/usr/bin/bwrap", "--die-with-parent"]
    assert "--unshare-all" in argv and "--share-net" not in argv
    assert "--cap-drop ALL" in text and "--json-status-fd 9" in text
    assert argv[-2:] == ["--", "make"]
    binds = re.findall(r"--(?:ro-)?bind \S+ (\S+)", text)
    assert f"{tmp_path}/t" in binds and f"{tmp_path}/h" in binds
    assert not any(b in ("/", "/etc", "/root", "/home", "/var", "/run", "/sys") for b in binds)
    assert "/etc/shadow" not in text and "/etc/ssl/private" not in text
    assert sys.prefix not in binds  # the server's Python only for {python}
    with_python = Bwrap(binary="b").argv(["{python}"], tree=tmp_path, home=tmp_path,
                                         status_fd=3, python=True)
    assert sys.base_prefix in with_python or sys.base_prefix.startswith("/usr")


def test_a_build_directory_inside_a_read_only_bind_refuses_the_sandbox(tmp_path: Path) -> None:
    """A venv that also holds the data directory (``/srv/sq`` with ``/srv/sq/var``) would
    show every build the mirrors and other trees: no sandbox then, and the reason."""
    inside = Path(sys.prefix) / "var" / "git" / "q" / "builds"
    with pytest.raises(SandboxUnavailable, match="contains the build directory"):
        Bwrap(binary="bwrap").argv(["{python}"], tree=tmp_path, home=tmp_path, status_fd=3,
                                   python=True, hidden=inside)
    Bwrap(binary="bwrap").argv(["make"], tree=tmp_path, home=tmp_path, status_fd=3,
                               python=False, hidden=inside)  # no {python}: nothing bound
