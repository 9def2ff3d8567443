"""Real builds on a real git repository, through HTTP: the command runner builds each
speculative tree and runs the sandbox's ``sq_test.py`` in it.

The queue's repository is a sandbox created in tmp_path (README.md + sq_test.py on
main); the test adds ``build.py`` to main, the queue's command, which can be slowed
(``slow.txt``: seconds) or held (``hold.json``: wait while a file outside exists,
recording its pid) by files in the tree, then runs ``sq_test.main()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.domain.queue_config import GitConfig
from app.extensions.factory import prepare_repository
from tests.conftest import BACKENDS
from tests.e2e.harness import TERMINAL, Server, free_port, serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues
from tests.support.polls import wait_for
from tests.support.procs import alive
from tests.support.procs import await_healthy as wait_healthy

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(120),
]

ROOT = Path(__file__).resolve().parents[2]

BUILD_PY = """\
import json, os, sys, time
import sq_test
if os.path.exists("hold.json"):
    spec = json.load(open("hold.json"))
    tmp = spec["pids"] + "." + os.environ["SQ_BUILD_ID"]  # written whole, then renamed
    with open(tmp, "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(tmp, os.path.join(spec["pids"], os.environ["SQ_BUILD_ID"]))
    deadline = time.time() + 60
    while os.path.exists(spec["hold"]) and time.time() < deadline:
        time.sleep(0.1)
if os.path.exists("slow.txt"):
    time.sleep(float(open("slow.txt").read()))
sys.exit(sq_test.main())
"""


QUEUES = queues_file(git_queue(
    repository="./sandbox.git", git_extra="create_sandbox: true",
    build_runner='{type: command, command: ["{python}", "build.py"], timeout_s: 90, '
                 'max_parallel: 2}'))


class Sandbox(GitSandbox):
    """A clone of the queue's sandbox repository (created by the server's own code)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, SANDBOX_KEY, bare="sandbox.git")
        prepare_repository("gitq", GitConfig(repository=str(self.bare),
                                             repo_key=SANDBOX_KEY,
                                             create_sandbox=True), root / "prep")
        self.clone()
        self.commit({"build.py": BUILD_PY}, "Add build.py")
        self.git("push", "--quiet", "origin", "HEAD:refs/heads/main")

    def main_files(self) -> list[str]:
        return self.main("ls-tree", "-r", "--name-only", "main").splitlines()

    def main_moves(self) -> int:
        return len(self.main("reflog", "show", "main").splitlines())


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    write_queues(tmp_path, QUEUES)
    return Sandbox(tmp_path)


async def builds_of(server: Server, sqid: str) -> dict[str, dict[str, Any]]:
    """Each build named by the request's history (``building`` events), by id: its log
    (fetched from the event's ``build_url``) and the verdict the log ends with."""
    out: dict[str, dict[str, Any]] = {}
    for e in await server.history(sqid):
        if e.get("event") == "building":
            out[e["metadata"]["build_id"]] = {"url": e["metadata"]["build_url"]}
    for build in out.values():
        r = await server.client.get(build["url"])
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        build["log"] = r.text
        last = [line for line in r.text.splitlines() if line.startswith("[sq] ")][-1]
        build["status"] = last[len("[sq] "):].split(":", 1)[0]
    return out


async def test_a_broken_change_fails_with_its_log_and_the_next_one_lands_built_without_it(
    database_url: str, tmp_path: Path, sandbox: Sandbox
) -> None:
    broken = sandbox.branch("broken", {"lib/broken.txt": "BROKEN\n", "slow.txt": "1.5"},
                            "Break the tests")
    good = sandbox.branch("good", {"lib/good.txt": "fine\n"}, "A good change")
    before = sandbox.main("rev-parse", "main")
    async with serve(database_url, tmp_path) as server:
        first = await server.land(broken, queue="gitq")
        second = await server.land(good, queue="gitq")
        assert await server.wait_terminal(first, timeout=60) == "error"
        assert await server.wait_terminal(second, timeout=60) == "landed"

        # the failing build's log is reachable from the request's history
        failed = await builds_of(server, first)
        [red] = [b for b in failed.values() if b["status"] == "failed"]
        assert red["url"].startswith("/api/v1/builds/cmd-")
        assert "FAILED: a line that is exactly BROKEN in: lib/broken.txt" in red["log"]
        # a command build takes no status reports: only webhook builds do
        r = await server.client.post(red["url"].replace("/log", "/status"),
                                     json={"status": "succeeded"})
        assert r.status_code == 404 and "not a webhook build" in r.json()["error"]["message"]

        # the second was first built assuming the first lands (its tree had the first's
        # change), and landed on a build of a tree without it
        second_builds = await builds_of(server, second)
        assert any(f"base change {broken}" in b["log"] for b in second_builds.values())
        [green] = [b for b in second_builds.values() if b["status"] == "succeeded"]
        assert "checked: lib/good.txt" in green["log"]
        assert "lib/broken.txt" not in green["log"] and broken not in green["log"]
        assert "ok: 4 files" in green["log"]  # README.md, build.py, lib/good.txt, sq_test.py
    files = sandbox.main_files()
    assert "lib/broken.txt" not in files and "lib/good.txt" in files
    assert sandbox.main("rev-list", "--count", f"{before}..main") == "1"


async def test_a_stack_of_three_is_built_together_and_lands_in_one_ref_update(
    database_url: str, tmp_path: Path, sandbox: Sandbox
) -> None:
    sandbox.git("fetch", "--quiet", "origin")
    sandbox.git("checkout", "--quiet", "-B", "stack", "origin/main")
    uris = [sandbox.push(f"stack-{i}", sandbox.commit({f"pkg/part{i}.txt": f"{i}\n"},
                                                      f"Part {i}"))
            for i in (1, 2, 3)]
    moves = sandbox.main_moves()
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(*uris, queue="gitq")
        assert await server.wait_terminal(sqid, timeout=60) == "landed"
        [green] = [b for b in (await builds_of(server, sqid)).values()
                   if b["status"] == "succeeded"]
        for i in (1, 2, 3):
            assert f"checked: pkg/part{i}.txt" in green["log"]
    assert sandbox.main_moves() == moves + 1  # one reflog entry for the whole stack
    subjects = sandbox.main("log", "--format=%s", "-3", "main").splitlines()
    assert subjects == [f"Part {i} ({sqid})" for i in (3, 2, 1)]


# ---------------------------------------------------------------- kill and restart


def start_server(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)


async def test_killing_the_server_mid_build_and_restarting_still_lands_once(
    database_url: str, tmp_path: Path, sandbox: Sandbox
) -> None:
    hold, pids = tmp_path / "hold", tmp_path / "pids"
    hold.write_text("held")
    pids.mkdir()
    # unsandboxed: the build reads and writes files outside its tree, and must outlive its
    # server (a sandboxed build dies with it: tests/security)
    write_queues(tmp_path, QUEUES.replace("max_parallel: 2}", "max_parallel: 2, sandbox: none}"))
    change = sandbox.branch("held", {"app/held.txt": "held\n", "hold.json": json.dumps(
        {"hold": str(hold), "pids": str(pids)})}, "A change built while the server dies")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SQ_DATABASE_URL": database_url, "SQ_PORT": str(port),
           "SQ_QUEUES_FILE": str(tmp_path / "queues.yaml"), "SQ_LOG_LEVEL": "WARNING",
           "SQ_QUEUE_POLL_INTERVAL_MS": "200", "SQ_QUEUE_VISIBILITY_TIMEOUT_MS": "3000",
           "PYTHONPATH": str(ROOT)}
    log = tmp_path / "server.log"
    proc = start_server(env, log)
    try:
        await wait_healthy(base, proc)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            r = await client.post("/api/v1/queues/gitq/requests", json={"change_uris": [change]})
            assert r.status_code == 202, r.text
            sqid = r.json()["sqid"]
        await wait_for(lambda: any(pids.iterdir()), "the build to start")
        [pid_file] = list(pids.iterdir())
        lost_build, orphan = pid_file.name, int(pid_file.read_text())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert alive(orphan)  # the build's command outlived its server

        proc = start_server(env, log)
        await wait_healthy(base, proc)
        await wait_for(lambda: not alive(orphan), "the restarted server to kill the orphan")
        hold.unlink()  # from now on builds pass
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            server = Server(base, None)
            server.client = client
            assert await server.wait_terminal(sqid, timeout=60) == "landed"
            builds = await builds_of(server, sqid)
            assert builds[lost_build]["status"] == "errored"
            assert "errored: lost: the process running it stopped" in builds[lost_build]["log"]
            assert [b["status"] for k, b in builds.items() if k != lost_build] == ["succeeded"]
            statuses = [e["status"] for e in await server.history(sqid) if e["type"] == "status"]
            assert [s for s in statuses if s in TERMINAL] == ["landed"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    subjects = sandbox.main("log", "--format=%s", "main").splitlines()
    assert subjects.count(f"A change built while the server dies ({sqid})") == 1
