"""Secrets never reach a build log, end to end over HTTP on SQLite and PostgreSQL.

A real server process (``submitqueue serve``) holds secrets in its environment, its
``.env`` and its database URL; a change pushed to its real git sandbox queue replaces
the queue's test script with one that hunts for them. Its build log, served to anyone
by ``GET /api/v1/builds/{id}/log``, must show none of them. Known secret values a build
prints anyway (committed into the repository) are masked in the stored log. A queue
that runs builds unsandboxed is warned about at start-up and on ``/readyz``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.domain.queue_config import GitConfig
from app.extensions.factory import prepare_repository
from tests.conftest import BACKENDS
from tests.e2e.harness import TERMINAL, free_port, serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues
from tests.security.attack import ATTACK, needs_bwrap

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(120),
    needs_bwrap,
]

ROOT = Path(__file__).resolve().parents[2]

# The sandbox queue as a deployment would write it: no sandbox key (bwrap is the default).
QUEUES = queues_file(git_queue(
    "sandbox", repository="REPO", git_extra="create_sandbox: true",
    build_runner='{type: command, command: ["{python}", "sq_test.py"], timeout_s: 60EXTRA}'))


def queues_text(repo: Path, runner_extra: str = "") -> str:
    return QUEUES.replace("REPO", str(repo)).replace("EXTRA", runner_extra)


def sandbox_repo(root: Path) -> GitSandbox:
    """The queue's repository (made by the server's own code) and a clone of it."""
    repo = GitSandbox(root, SANDBOX_KEY, bare="sandbox.git")
    prepare_repository("sandbox", GitConfig(repository=str(repo.bare), repo_key=SANDBOX_KEY,
                                            create_sandbox=True), root / "prep")
    repo.clone()
    return repo


async def build_logs(client: httpx.AsyncClient, sqid: str) -> list[str]:
    """The logs of the request's builds, as anyone can fetch them."""
    queue, n = sqid.rsplit("/", 1)
    r = await client.get(f"/api/v1/queues/{queue}/requests/{n}/history")
    assert r.status_code == 200, r.text
    urls = list(dict.fromkeys(e["metadata"]["build_url"] for e in r.json()["events"]
                              if e.get("event") == "building"))
    assert urls, "the request was never built"
    logs = []
    for url in urls:
        r = await client.get(url)
        assert r.status_code == 200, r.text
        logs.append(r.text)
    return logs


async def wait_terminal(client: httpx.AsyncClient, sqid: str, timeout: float = 60) -> str:
    queue, n = sqid.rsplit("/", 1)
    deadline = time.monotonic() + timeout
    while True:
        status = (await client.get(f"/api/v1/queues/{queue}/requests/{n}")).json()["status"]
        if status in TERMINAL:
            return str(status)
        assert time.monotonic() < deadline, f"{sqid} still {status}"
        await asyncio.sleep(0.1)


async def wait_healthy(client: httpx.AsyncClient, proc: subprocess.Popen[bytes],
                       log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited {proc.returncode}:\n{log.read_text()}"
        try:
            if (await client.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("server did not become healthy")


@pytest.mark.slow
async def test_a_change_that_replaces_the_test_script_cannot_read_the_servers_secrets(
    database_url: str, tmp_path: Path,
) -> None:
    mark = uuid.uuid4().hex[:10]
    token, db_password = f"ops:admintoken-{mark}", f"dbpassword-{mark}"
    env_secret, file_secret = f"envsecret-{mark}", f"dotenvsecret-{mark}"
    if database_url.startswith("postgresql"):  # trust auth: any password connects
        database_url = database_url.replace("://postgres@", f"://postgres:{db_password}@")
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    (server_dir / ".env").write_text(f"# deploy key {file_secret}\nSQ_LOG_LEVEL=WARNING\n")
    repo = sandbox_repo(tmp_path)
    queues = write_queues(server_dir, queues_text(repo.bare))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env.update({"SQ_DATABASE_URL": database_url, "SQ_ADMIN_TOKEN": token,
                "SQ_WEBHOOK_SECRET_ELSEWHERE": env_secret, "SQ_PORT": str(port),
                "SQ_QUEUES_FILE": str(queues), "SQ_QUEUE_POLL_INTERVAL_MS": "200",
                "PYTHONPATH": str(ROOT)})
    log = tmp_path / "server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], cwd=server_dir,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            await wait_healthy(client, proc, log)
            sqlite_file = database_url.split(":///", 1)[1] if "sqlite" in database_url else ""
            targets = {"server_pid": proc.pid, "read": {
                "server_cmdline": f"/proc/{proc.pid}/cmdline", "dotenv": str(server_dir / ".env"),
                "queues": str(queues), "database": sqlite_file or "/nowhere",
                "repository": str(repo.bare / "config"),
            }, "list": {"server_dir": str(server_dir), "work_dir": str(server_dir / "var")}}
            uri = repo.branch("attack", {"sq_test.py": ATTACK, "targets.json": json.dumps(targets)},
                              "Replace the tests")
            r = await client.post("/api/v1/queues/sandbox/requests", json={"change_uris": [uri]})
            assert r.status_code == 202, r.text
            sqid = r.json()["sqid"]
            assert await wait_terminal(client, sqid) == "landed"
            [text] = await build_logs(client, sqid)
            ready = (await client.get("/readyz")).json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for secret in (token, "admintoken-" + mark, db_password, env_secret, file_secret):
        assert secret not in text, f"{secret} leaked into the build log:\n{text}"
    [line] = [x for x in text.splitlines() if x.startswith("REPORT ")]
    seen = json.loads(line[len("REPORT "):])
    assert seen[f"environ:{proc.pid}"] in ("FileNotFoundError", "PermissionError")
    for name in ("server_cmdline", "dotenv", "queues", "database", "repository"):
        assert seen[name] in ("FileNotFoundError", "PermissionError"), (name, seen[name])
    assert seen["server_dir"] == ["var"]  # only the parents of the build's tree, empty
    assert seen["work_dir"] == ["git"]
    assert not any(k.startswith("SQ_") and k not in (
        "SQ_QUEUE", "SQ_BUILD_ID", "SQ_BATCH_ID", "SQ_PATH_ID", "SQ_ATTEMPT", "SQ_BASE",
        "SQ_HEAD") for k in seen["env"])
    assert ready["checks"]["builds"]["queues"]["sandbox"] == {
        "ok": True, "sandbox": "bwrap", "network": False}, ready


BUILD_PY = """\
import os
for name in sorted(os.listdir(".")):
    if name.endswith(".txt"):
        print(name + ": " + open(name).read().strip())
"""


async def test_a_known_secret_a_build_prints_is_masked_in_its_stored_log(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = "ops:tok-" + uuid.uuid4().hex
    webhook = "whsec-" + uuid.uuid4().hex
    monkeypatch.setenv("SQ_WEBHOOK_SECRET_CI", webhook)
    repo = sandbox_repo(tmp_path)
    repo.commit({"build.py": BUILD_PY}, "Add build.py")
    repo.git("push", "--quiet", "origin", "HEAD:refs/heads/main")
    text = queues_text(repo.bare).replace('"sq_test.py"', '"build.py"') + (
        "  - name: ci\n    build_runner: {type: webhook, url: 'https://ci.invalid/hook', "
        "secret_env: SQ_WEBHOOK_SECRET_CI}\n")
    write_queues(tmp_path, text)
    uri = repo.branch("leak", {"leak.txt": f"token {token} and {webhook} and a plain word"},
                      "Commit the secrets by mistake")
    async with serve(database_url, tmp_path, admin_token=token) as server:
        sqid = await server.land(uri, queue="sandbox")
        assert await server.wait_terminal(sqid, timeout=60) == "landed"
        [log] = await build_logs(server.client, sqid)
    assert "leak.txt: token [redacted] and [redacted] and a plain word" in log, log
    assert token not in log and token.split(":", 1)[1] not in log and webhook not in log


async def test_an_unsandboxed_queue_is_warned_about_at_start_up_and_on_readyz(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    repo = sandbox_repo(tmp_path)
    write_queues(tmp_path, queues_text(repo.bare, ", sandbox: none"))
    caplog.set_level(logging.WARNING, logger="submitqueue.builds")
    async with serve(database_url, tmp_path) as server:
        r = await server.client.get("/readyz")
        body: dict[str, Any] = r.json()
    assert r.status_code == 200, body  # an explicit choice: ready, but said
    builds = body["checks"]["builds"]
    assert builds["ok"] is True
    assert builds["queues"]["sandbox"]["sandbox"] == "none"
    assert "builds of sandbox run unsandboxed" in builds["warning"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("queue sandbox runs its builds UNSANDBOXED" in w for w in warnings), warnings


@pytest.mark.slow
async def test_a_queue_whose_builds_cannot_be_sandboxed_is_not_ready_and_says_why(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    repo = sandbox_repo(tmp_path)
    write_queues(tmp_path, queues_text(repo.bare))
    # bwrap is gone from this host (git stays reachable: it is found by its full path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    git = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True,
                         check=True).stdout.strip()
    (bindir / "git").symlink_to(git)
    monkeypatch.setenv("PATH", str(bindir))
    caplog.set_level(logging.ERROR, logger="submitqueue.builds")
    async with serve(database_url, tmp_path) as server:
        r = await server.client.get("/readyz")
        uri = repo.branch("any", {"a.txt": "a\n"}, "A change")
        sqid = await server.land(uri, queue="sandbox")
        assert await server.wait_terminal(sqid, timeout=60) == "error"
        logs = await build_logs(server.client, sqid)
    assert r.status_code == 503
    check = r.json()["checks"]["builds"]
    assert check["ok"] is False
    assert "bwrap was not found on PATH" in check["queues"]["sandbox"]["error"]
    assert all("errored: sandbox unavailable: bwrap was not found" in t for t in logs)
    assert not any("checked:" in t for t in logs)  # the test script never ran
    assert any("builds cannot be sandboxed" in r.getMessage() for r in caplog.records)
