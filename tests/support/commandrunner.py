"""The command build runner's test rig: a seeded git remote, the SQL build store, a
factory of heartbeating runners whose command is a probe that records what it saw, and
pollers on a build's status (each waits on a condition, with a deadline)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.db.engine import Database
from app.db.repos.build_runs import SqlBuildStore
from app.extensions.base import BuildReport
from app.extensions.builds.command import CommandBuildRunner
from tests.gitfixtures import GitSandbox, change_uri
from tests.support.builds import BeatingRunner, build_request

KEY = "example.com/team/repo"
ROOT = Path(__file__).resolve().parents[2]

PROBE = """\
import json, os, subprocess, sys, time
out = sys.argv[1]
files = []
for folder, dirs, names in os.walk("."):
    dirs[:] = [d for d in dirs if d != ".git"]
    files += [os.path.relpath(os.path.join(folder, n), ".") for n in names]
files = sorted(f for f in files if f != ".git")
record = {"env": dict(os.environ), "files": files, "cwd": os.getcwd(), "pid": os.getpid()}
if os.path.exists("spawn.txt"):
    record["child"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid
with open(os.path.join(out, os.environ["SQ_BUILD_ID"] + ".json"), "w") as fh:
    json.dump(record, fh)
print("probe saw: " + " ".join(files), flush=True)
if os.path.exists("sleep.txt"):
    time.sleep(float(open("sleep.txt").read()))
if os.path.exists("fail.txt"):
    print("failing on purpose", flush=True)
    sys.exit(3)
"""


class Remote(GitSandbox):
    def change(self, branch: str, files: Mapping[str, str], message: str = "change",
               base: str = "origin/main") -> str:
        """Commit on ``branch`` (from ``base``), push it, return its change URI."""
        return self.branch(branch, files, message, base)


def uri(branch: str, sha: str) -> str:
    return change_uri(KEY, branch, sha)


request = build_request


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote.seeded(tmp_path, KEY)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlBuildStore]:
    db = Database(database_url)
    try:
        yield SqlBuildStore(db)
    finally:
        await db.dispose()


RunnerFactory = Callable[..., BeatingRunner]


@pytest.fixture
async def make_runner(
    tmp_path: Path, remote: Remote, store: SqlBuildStore
) -> AsyncIterator[RunnerFactory]:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "seen").mkdir()
    made: list[BeatingRunner] = []

    def make(**kw: Any) -> BeatingRunner:
        args: dict[str, Any] = {
            "queue": "q", "command": ["{python}", str(tmp_path / "probe.py"),
                                      str(tmp_path / "seen")],
            "repos": {KEY: str(remote.bare)}, "target_branch": "main",
            "work_dir": tmp_path / "builds", "store": store, "timeout_s": 30,
            "max_parallel": 2, "kill_grace_s": 1.0,
            "sandbox": None,  # the probe writes outside its tree (tests/security: sandboxed)
            **kw}
        runner = BeatingRunner(**args)  # its heartbeat runs, as in a server
        made.append(runner)
        return runner

    yield make
    for runner in made:
        await runner.stop()


def seen(tmp_path: Path, build_id: str) -> dict[str, Any]:
    return json.loads((tmp_path / "seen" / f"{build_id}.json").read_text())  # type: ignore[no-any-return]


async def wait_until(runner: CommandBuildRunner, build_id: str,
                     done: Callable[[BuildReport], bool], timeout: float = 30) -> BuildReport:
    deadline = time.monotonic() + timeout
    while True:
        report = await runner.status(build_id)
        if done(report):
            return report
        assert time.monotonic() < deadline, f"{build_id} still {report}"
        await asyncio.sleep(0.05)


async def finished(runner: CommandBuildRunner, build_id: str) -> BuildReport:
    return await wait_until(runner, build_id, lambda r: r.status.terminal)
