"""The command build runner on real git repositories in tmp_path and the SQL build store
(SQLite): the speculative tree, what the command sees, verdicts, timeout, cancel, the
concurrency cap, lost builds (heartbeat rule and the restart sweep) and the log."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.db.repos.build_runs import SqlBuildStore
from app.domain.errors import ValidationError
from app.domain.queue_config import GitConfig, parse_queues
from app.domain.states import BuildStatus
from app.extensions.builds.command import CommandBuildRunner
from app.extensions.builds.process import LogBuffer, kill_orphan
from app.extensions.factory import (
    SANDBOX_README,
    _git_sync,
    build_extensions,
    prepare_repository,
    sandbox_test_script,
)
from app.speculation.scoring import build_scorer
from tests.support.commandrunner import (
    KEY,
    ROOT,
    Remote,
    RunnerFactory,
    finished,
    request,
    seen,
    uri,
    wait_until,
)
from tests.support.procs import alive

pytestmark = pytest.mark.timeout(60)

async def wait_for_file(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.05)


async def wait_dead(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still alive"
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------- the tree and the env


async def test_builds_base_then_head_on_the_tip_and_tells_the_command(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SQ_SECRET_OF_THE_SERVER", "do-not-leak")
    base = remote.change("dep", {"lib/dep.txt": "dep\n"}, "the dependency")
    head = remote.change("head", {"lib/head.txt": "head\n"}, "the head")
    remote.change("main", {"main.txt": "newer main\n"}, "main moved", base="origin/main")
    remote.git("push", "--quiet", "origin", "HEAD:refs/heads/main")
    tip = remote.tip()
    runner = make_runner()

    build = request(head, base=(base,))
    build_id = await runner.trigger(build)
    report = await finished(runner, build_id)

    assert report.status is BuildStatus.SUCCEEDED, report
    assert report.log_url == f"/api/v1/builds/{build_id}/log"
    probe = seen(tmp_path, build_id)
    assert probe["files"] == ["a.txt", "lib/dep.txt", "lib/head.txt", "main.txt"]
    env = probe["env"]
    assert env["SQ_BASE"] == tip
    assert env["SQ_HEAD"] != tip and len(env["SQ_HEAD"]) == 40
    assert (env["SQ_QUEUE"], env["SQ_BUILD_ID"], env["SQ_BATCH_ID"], env["SQ_ATTEMPT"]) == (
        "q", build_id, "q/batch/1", "1")
    assert env["SQ_PATH_ID"] == build.path_id
    assert "SQ_SECRET_OF_THE_SERVER" not in env
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONUNBUFFERED",
                        "PYTHONDONTWRITEBYTECODE", "SQ_QUEUE", "SQ_BUILD_ID", "SQ_BATCH_ID",
                        "SQ_PATH_ID", "SQ_ATTEMPT", "SQ_BASE", "SQ_HEAD"}
    assert Path(probe["cwd"]) == tmp_path / "builds" / "trees" / build_id
    # the tree and the scratch home are gone; the log tells the story
    assert list((tmp_path / "builds" / "trees").iterdir()) == []
    text = await store.get_log(build_id)
    assert text is not None
    assert f"tree: main at {tip}" in text
    assert f"base change {base}: 1 commit(s) applied" in text
    assert "probe saw: a.txt lib/dep.txt lib/head.txt main.txt" in text
    assert "succeeded: command exited 0" in text
    assert sys.executable in text  # {python} was replaced


async def test_a_failing_command_fails_with_its_output(
    remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore
) -> None:
    head = remote.change("bad", {"fail.txt": "x\n"})
    runner = make_runner()
    build_id = await runner.trigger(request(head))
    report = await finished(runner, build_id)
    assert report.status is BuildStatus.FAILED
    assert report.detail.startswith("command exited 3")
    run = await store.get(build_id)
    assert run is not None and run.exit_code == 3
    assert "failing on purpose" in (await store.get_log(build_id) or "")


async def test_the_sandbox_test_script_fails_on_a_broken_line(
    remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore
) -> None:
    script = (ROOT / "app" / "extensions" / "builds" / "sq_test.py").read_text()
    remote.change("main", {"sq_test.py": script}, "add the test", base="origin/main")
    remote.git("push", "--quiet", "origin", "HEAD:refs/heads/main")
    good = remote.change("good", {"docs/ok.txt": "fine\nBROKEN here is fine\n"})
    bad = remote.change("bad", {"docs/bad.txt": "text\nBROKEN\n"})
    runner = make_runner(command=["{python}", "sq_test.py"])
    ok_id = await runner.trigger(request(good))
    bad_id = await runner.trigger(request(bad))
    assert (await finished(runner, ok_id)).status is BuildStatus.SUCCEEDED
    assert (await finished(runner, bad_id)).status is BuildStatus.FAILED
    ok_log = await store.get_log(ok_id) or ""
    assert "checked: a.txt\nchecked: docs/ok.txt\nchecked: sq_test.py\nok: 3 files" in ok_log
    bad_log = await store.get_log(bad_id) or ""
    assert "FAILED: a line that is exactly BROKEN in: docs/bad.txt" in bad_log


async def test_a_conflict_between_the_changes_fails_naming_the_paths(
    remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore
) -> None:
    first = remote.change("one", {"a.txt": "one\nTWO (first)\nthree\n"})
    second = remote.change("two", {"a.txt": "one\nTWO (second)\nthree\n"})
    runner = make_runner()
    build_id = await runner.trigger(request(second, base=(first,)))
    report = await finished(runner, build_id)
    assert report.status is BuildStatus.FAILED
    assert "merge conflict in a.txt while applying head change" in report.detail
    assert f"on top of {first}" in report.detail
    assert "merge conflict in a.txt" in (await store.get_log(build_id) or "")
    assert list((runner.trees).iterdir()) == []


async def test_a_landed_base_is_skipped_and_a_stale_change_fails(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore
) -> None:
    landed = remote.change("landed", {"l.txt": "l\n"})
    remote.git("push", "--quiet", "origin", "HEAD:refs/heads/main")  # fast-forwarded: landed
    head = remote.change("head", {"h.txt": "h\n"})
    runner = make_runner()
    build_id = await runner.trigger(request(head, base=(landed,)))
    assert (await finished(runner, build_id)).status is BuildStatus.SUCCEEDED
    assert "already on main, skipped" in (await store.get_log(build_id) or "")
    assert seen(tmp_path, build_id)["files"] == ["a.txt", "h.txt", "l.txt"]

    gone = uri("nowhere", "f" * 40)
    stale_id = await runner.trigger(request(gone))
    report = await finished(runner, stale_id)
    assert report.status is BuildStatus.FAILED and report.detail.startswith("stale:")


async def test_git_failing_for_another_reason_is_errored(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory
) -> None:
    head = remote.change("head", {"h.txt": "h\n"})
    runner = make_runner(repos={KEY: str(tmp_path / "no-such-repo.git")})
    build_id = await runner.trigger(request(head))
    report = await finished(runner, build_id)
    assert report.status is BuildStatus.ERRORED
    assert report.detail.startswith(
        "infrastructure failure while preparing the tree: Unreachable: git ls-remote")


async def test_nothing_from_a_uri_or_a_commit_message_reaches_a_shell(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore
) -> None:
    nasty = "x$(touch${IFS}pwned-ref);touch${IFS}pwned-semi`touch${IFS}pwned-tick`"
    head = remote.change(nasty, {"$(touch pwned-file).txt": "$(touch pwned-content)\n"},
                         message="$(touch pwned-msg) `touch pwned-msg2`; touch pwned-msg3")
    runner = make_runner()
    build_id = await runner.trigger(request(head))
    assert (await finished(runner, build_id)).status is BuildStatus.SUCCEEDED
    assert head in (await store.get_log(build_id) or "")
    assert not list(tmp_path.rglob("pwned*")), "a shell ran something"
    assert "$(touch pwned-file).txt" in seen(tmp_path, build_id)["files"]


# ---------------------------------------------------------------- timeout, cancel, cap


async def test_a_timeout_kills_the_whole_process_group(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore
) -> None:
    head = remote.change("slow", {"sleep.txt": "30", "spawn.txt": "1"})
    runner = make_runner(timeout_s=1.5)
    build_id = await runner.trigger(request(head))
    report = await finished(runner, build_id)
    assert report.status is BuildStatus.FAILED
    assert report.detail == "timed out after 1.5s"
    assert "timed out after 1.5s" in (await store.get_log(build_id) or "")
    probe = seen(tmp_path, build_id)
    await wait_dead(probe["pid"])
    await wait_dead(probe["child"])  # the command's own child, in its group


async def test_cancel_while_running_and_while_waiting_for_a_slot(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory
) -> None:
    slow = remote.change("slow", {"sleep.txt": "30", "spawn.txt": "1"})
    quick = remote.change("quick", {"q.txt": "q\n"})
    runner = make_runner(max_parallel=1)
    first = await runner.trigger(request(slow))
    second = await runner.trigger(request(quick))
    await wait_for_file(tmp_path / "seen" / f"{first}.json")
    assert (await runner.status(first)).status is BuildStatus.RUNNING
    assert (await runner.status(second)).status is BuildStatus.ACCEPTED  # the cap holds it

    await runner.cancel(second)
    waiting = await finished(runner, second)
    assert (waiting.status, waiting.detail) == (
        BuildStatus.CANCELLED, "cancelled while waiting for a build slot")
    assert not (tmp_path / "seen" / f"{second}.json").exists()

    await runner.cancel(first)
    running = await finished(runner, first)
    assert (running.status, running.detail) == (BuildStatus.CANCELLED, "cancelled while running")
    probe = seen(tmp_path, first)
    await wait_dead(probe["pid"])
    await wait_dead(probe["child"])

    third = await runner.trigger(request(quick, attempt=2))  # the slot was given back
    assert (await finished(runner, third)).status is BuildStatus.SUCCEEDED


async def test_stop_interrupts_running_builds_as_errored(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory
) -> None:
    slow = remote.change("slow", {"sleep.txt": "30"})
    runner = make_runner()
    await runner.start()
    build_id = await runner.trigger(request(slow))
    await wait_for_file(tmp_path / "seen" / f"{build_id}.json")
    await runner.stop()
    other = make_runner()
    report = await other.status(build_id)
    assert report.status is BuildStatus.ERRORED
    assert report.detail.startswith("interrupted: the server stopped")
    await wait_dead(seen(tmp_path, build_id)["pid"])


# ---------------------------------------------------------------- lost builds


async def test_a_silent_owner_is_lost_and_a_cancel_reaches_a_live_owner(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory
) -> None:
    slow = remote.change("slow", {"sleep.txt": "30"})
    # the owner beats every 100 ms; another instance reads its builds from the store
    owner = make_runner(heartbeat_ms=100, lost_after_ms=1500)
    other = make_runner(heartbeat_ms=100, lost_after_ms=1500,
                        work_dir=tmp_path / "elsewhere")
    await owner.start()
    first = await owner.trigger(request(slow))
    await wait_for_file(tmp_path / "seen" / f"{first}.json")
    await asyncio.sleep(2.0)  # longer than lost_after: the heartbeat keeps it alive
    assert (await other.status(first)).status is BuildStatus.RUNNING
    await other.cancel(first)  # recorded in the store; the owner acts on its next beat
    report = await wait_until(other, first, lambda r: r.status.terminal, timeout=10)
    assert (report.status, report.detail) == (BuildStatus.CANCELLED, "cancelled while running")

    # an owner that stops beating (hung, or its host died) loses its builds
    second = await owner.trigger(request(slow, attempt=2))
    await wait_for_file(tmp_path / "seen" / f"{second}.json")
    assert owner.beating is not None
    await owner.beating.stop()
    report = await wait_until(other, second, lambda r: r.status.terminal, timeout=10)
    assert report.status is BuildStatus.ERRORED
    assert report.detail.startswith("lost: the process running it stopped (no heartbeat for")


CHILD = """\
import asyncio, sys
from pathlib import Path
from app.db.engine import Database
from app.db.repos.build_runs import SqlBuildStore
from app.extensions.base import BuildRequest
from app.extensions.builds.command import CommandBuildRunner

async def main():
    url, remote, work, probe, seen, head = sys.argv[1:7]
    runner = CommandBuildRunner(
        queue="q", command=["{python}", probe, seen], repos={"KEY": remote},
        target_branch="main", work_dir=Path(work), store=SqlBuildStore(Database(url)),
        sandbox=None)
    await runner.start()
    build_id = await runner.trigger(BuildRequest(
        queue="q", batch_id="q/batch/1", path_id="p", attempt=1, base_changes=(),
        head_changes=(head,)))
    print(build_id, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
""".replace('"KEY"', repr(KEY))


async def test_a_restart_marks_the_dead_instances_builds_lost_and_kills_their_commands(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory, database_url: str,
    store: SqlBuildStore,
) -> None:
    slow = remote.change("slow", {"sleep.txt": "60", "spawn.txt": "1"})
    (tmp_path / "child.py").write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "child.py"), database_url, str(remote.bare),
         str(tmp_path / "builds"), str(tmp_path / "probe.py"), str(tmp_path / "seen"), slow],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        text=True)
    try:
        assert proc.stdout is not None
        build_id = (await asyncio.to_thread(proc.stdout.readline)).strip()
        assert build_id.startswith("cmd-"), build_id
        await wait_for_file(tmp_path / "seen" / f"{build_id}.json")
        probe = seen(tmp_path, build_id)
        proc.send_signal(signal.SIGKILL)  # the server dies; its build's command lives on
        proc.wait(timeout=10)
        assert alive(probe["pid"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert list((tmp_path / "builds" / "trees").iterdir())  # left behind

    runner = make_runner()  # the same host and build directory: the next instance
    await runner.start()
    run = await store.get(build_id)
    assert run is not None and run.status is BuildStatus.ERRORED
    assert run.detail.startswith("lost: the process running it stopped (found when the runner "
                                 f"restarted; its command, pid {probe['pid']}, was still "
                                 "running and was killed)")
    await wait_dead(probe["pid"])
    await wait_dead(probe["child"])
    assert not (tmp_path / "builds" / "trees").exists()
    assert "errored: lost" in (await store.get_log(build_id) or "")


def test_an_orphan_whose_pid_was_never_recorded_is_found_by_its_build_id_and_killed() -> None:
    """The instance may die between starting a command and recording its pid, and a
    process may leave the command's group: each is found by ``SQ_BUILD_ID`` and killed."""
    build_id = f"cmd-orphan-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "SQ_BUILD_ID": build_id}
    script = ("import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); "
              "print(os.getpid(), flush=True); time.sleep(60)']); time.sleep(60)")
    leader = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    escaped = 0
    try:
        assert leader.stdout is not None
        escaped = int(leader.stdout.readline())  # in a session of its own
        assert os.getpgid(escaped) != leader.pid
        assert kill_orphan(None, build_id) == leader.pid
        leader.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(escaped):
            assert time.monotonic() < deadline, "the escaped process is still alive"
            time.sleep(0.05)
        assert other.poll() is None  # no build id: untouched
        assert kill_orphan(other.pid, build_id) is None  # a reused pid is spared
        assert other.poll() is None
    finally:
        for proc in (leader, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if leader.stdout is not None:
            leader.stdout.close()
        if escaped and alive(escaped):
            os.kill(escaped, signal.SIGKILL)


# ---------------------------------------------------------------- the log


def test_the_log_keeps_the_last_bytes_and_says_how_many_were_dropped() -> None:
    log = LogBuffer(limit=1023)
    log.write(b"a" * 1000)
    log.line("hello")  # on a line of its own: "\n[sq] hello\n"
    log.write("é".encode() * 600)
    # 1000 + 1 + 11 + 1200 bytes, the last 1023 kept (cut inside a two-byte character)
    assert log.dropped == 1189
    assert log.text() == ("[sq] ... 1189 earlier bytes of output dropped ...\n"
                          + "\ufffd" + "é" * 511)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(("runner", "message"), [
    ({"type": "command"}, "build_runner type command needs command: an argv list"),
    ({"type": "command", "command": ["x"], "delay_ms": 5},
     "build_runner type command takes no delay_ms"),
    ({"type": "command", "command": ["x", ""]}, "every argument of the command"),
    ({"type": "command", "command": ["x"], "max_parallel": 0}, "max_parallel"),
    ({"type": "command", "command": ["x"], "timeout_s": 0}, "timeout_s"),
    ({"type": "webhook", "url": "ftp://ci", "secret_env": "S"}, "needs url"),
    ({"type": "webhook", "url": "https://ci", "secret_env": "not a name"}, "needs secret_env"),
    ({"type": "fake", "url": "https://ci"}, "build_runner type fake takes no url"),
    ({"type": "jenkins"}, "build_runner.type"),
])
def test_bad_build_runner_config_names_the_key(runner: dict[str, Any], message: str) -> None:
    text = json.dumps({"queues": [{"name": "q", "build_runner": runner, "git": {
        "repository": "/nowhere.git", "repo_key": "h/r"}}]})
    with pytest.raises(ValidationError) as info:
        parse_queues(text, source="q.yaml")
    assert message in str(info.value) and str(info.value).startswith("q.yaml: ")


def test_a_command_runner_needs_the_git_block() -> None:
    text = json.dumps({"queues": [{"name": "q", "build_runner": {
        "type": "command", "command": ["make", "test"]}}]})
    with pytest.raises(ValidationError, match=r"build_runner\.type command needs a 'git' block"):
        parse_queues(text)


def test_the_factory_builds_a_command_runner_and_upgrades_an_old_sandbox(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    old = tmp_path / "sandbox.git"
    # a sandbox made before sq_test.py existed: README.md only
    _git_sync(["init", "--bare", "--quiet", "--initial-branch=main", str(old)], home)
    blob = _git_sync(["hash-object", "-w", "--stdin"], home, old, SANDBOX_README)
    tree = _git_sync(["mktree"], home, old, f"100644 blob {blob}\tREADME.md\n")
    first = _git_sync(["commit-tree", tree, "-m", "Initial commit of the sandbox"], home, old)
    _git_sync(["update-ref", "refs/heads/main", first, ""], home, old)
    text = json.dumps({"queues": [{
        "name": "sandbox", "change_provider": {"type": "git"}, "merger": {"type": "git"},
        "git": {"repository": "./sandbox.git", "repo_key": "sandbox.local/sandbox",
                "create_sandbox": True},
        "build_runner": {"type": "command", "command": ["{python}", "sq_test.py"],
                         "timeout_s": 120, "max_parallel": 3}}]})
    config = parse_queues(text, base_dir=tmp_path)["sandbox"]
    for _ in range(2):  # twice: the second start adds nothing
        runner = build_extensions(config, build_scorer).runner
    assert isinstance(runner, CommandBuildRunner)
    assert (runner.command, runner.timeout_s, runner.max_parallel) == (
        ("{python}", "sq_test.py"), 120, 3)
    assert runner.root == tmp_path / "var" / "git" / "sandbox" / "builds"
    log = _git_sync(["log", "--format=%s", "main"], home, old).splitlines()
    assert log == ["Add sq_test.py, the sandbox's build command", "Initial commit of the sandbox"]
    script = _git_sync(["show", "main:sq_test.py"], home, old)
    assert script == sandbox_test_script().strip()
    # a repository that is not a sandbox of ours is left alone
    other = tmp_path / "other.git"
    _git_sync(["init", "--bare", "--quiet", "--initial-branch=main", str(other)], home)
    blob = _git_sync(["hash-object", "-w", "--stdin"], home, other, "# mine\n")
    tree = _git_sync(["mktree"], home, other, f"100644 blob {blob}\tREADME.md\n")
    mine = _git_sync(["commit-tree", tree, "-m", "mine"], home, other)
    _git_sync(["update-ref", "refs/heads/main", mine, ""], home, other)
    prepare_repository("x", GitConfig(repository=str(other), repo_key="h/r",
                                      create_sandbox=True), tmp_path / "w")
    assert _git_sync(["rev-parse", "main"], home, other) == mine


async def test_a_retried_trigger_returns_the_running_build_and_runs_the_command_once(
    tmp_path: Path, remote: Remote, make_runner: RunnerFactory, store: SqlBuildStore
) -> None:
    """The build controller retries a trigger whose link write failed: the same (queue,
    path, attempt) must give the same build, not a second run of the command, also from
    another instance sharing the store; a new attempt is a new build."""
    head = remote.change("once", {"sleep.txt": "1"})
    runner = make_runner()
    first = await runner.trigger(request(head))
    again = await runner.trigger(request(head))
    elsewhere = await make_runner(work_dir=tmp_path / "elsewhere").trigger(request(head))
    assert first == again == elsewhere
    assert (await finished(runner, first)).status is BuildStatus.SUCCEEDED
    assert await runner.trigger(request(head)) == first  # finished: still not run again
    assert sorted(p.name for p in (tmp_path / "seen").iterdir()) == [f"{first}.json"]
    retry = await runner.trigger(request(head, attempt=2))
    assert retry != first
    assert (await finished(runner, retry)).status is BuildStatus.SUCCEEDED
