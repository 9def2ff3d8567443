"""``submitqueue demo --github``: the whole GitHub flow on this machine, in one command.

In a scratch directory: a fake GitHub (``app/extensions/github/fake.py``) over a real
bare repository, with a simulated CI that reports the check ``test`` on every pushed
``sq/`` branch (failing on a line ``BROKEN``); a SubmitQueue server (this process, a
free loopback port, SQLite) whose queue ``github-demo`` takes pull requests
(``github`` provider, ``github_checks`` runner, ``github`` merger). Then ``count`` pull
requests are opened (``fail`` of them break the test), each labelled ``merge-queue``
by a signed webhook delivery, and watched until every one ended. The server signs in
as a GitHub App (a key pair made for the run), so each pull request carries its
``SubmitQueue`` check-run, printed at the end. Exit 0 when every good pull request
landed on ``main`` and every broken one ended ``error``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import httpx

QUEUE = "github-demo"
TERMINAL = {"landed", "error", "cancelled"}
QUEUES_YAML = """\
queues:
  - name: {queue}
    change_provider: {{type: github}}
    build_runner: {{type: github_checks, checks: [test], checks_start_timeout_s: 60}}
    merger: {{type: github}}
    default_strategy: merge
    build_budget: 4
    git: {{repository: {repo}, repo_key: github.com/acme/widgets, target_branch: main}}
    github:
      repository: acme/widgets
      api_url: {api}
      app_id: {app_id}
      private_key_env: SQ_DEMO_GITHUB_APP_KEY
      webhook_secret_env: SQ_DEMO_GITHUB_WEBHOOK_SECRET
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_github_demo(out: TextIO, *, count: int = 6, fail: int = 2,
                          timeout_s: float = 180) -> int:
    """Run the demo (module docstring); the exit status."""
    import uvicorn

    from app.extensions.github.fake import app_key_pair
    from app.extensions.github.fake_serve import serve_in_thread
    from app.settings import get_settings

    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()

    if not 0 <= fail <= count:
        say(f"demo: --fail {fail} must be between 0 and --count {count}")
        return 2
    secret = secrets.token_hex(16)
    private_key, public_key = app_key_pair()
    with tempfile.TemporaryDirectory(prefix="sq-github-demo-") as tmp, \
            serve_in_thread(Path(tmp) / "widgets.git") as fake:
        fake.simulate_ci("test")
        fake.app_public_key = public_key
        (Path(tmp) / "queues.yaml").write_text(QUEUES_YAML.format(
            queue=QUEUE, repo=fake.repo.path, api=fake.base_url, app_id=fake.app_id))
        saved = {k: os.environ.get(k) for k in _ENV}
        os.environ.update({
            "SQ_DEMO_GITHUB_APP_KEY": private_key, "SQ_DEMO_GITHUB_WEBHOOK_SECRET": secret,
            "SQ_QUEUES_FILE": str(Path(tmp) / "queues.yaml"),
            "SQ_DATABASE_URL": f"sqlite+aiosqlite:///{tmp}/sq.db",
            "SQ_LOG_LEVEL": "WARNING", "SQ_QUEUE_POLL_INTERVAL_MS": "200",
        })
        get_settings.cache_clear()
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(
            "app.main:app_factory", factory=True, host="127.0.0.1", port=port,
            log_config=None, access_log=False, lifespan="on", log_level="warning"))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                if task.done():
                    task.result()
                    say("demo: the server did not start")
                    return 2
                await asyncio.sleep(0.05)
            base = f"http://127.0.0.1:{port}"
            say(f"fake GitHub at {fake.base_url}, SubmitQueue at {base} (queue {QUEUE})")
            return await _drive(fake, base, secret.encode(), count, fail, timeout_s, say)
        finally:
            server.should_exit = True
            await task
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            get_settings.cache_clear()


_ENV = ("SQ_DEMO_GITHUB_APP_KEY", "SQ_DEMO_GITHUB_WEBHOOK_SECRET", "SQ_QUEUES_FILE",
        "SQ_DATABASE_URL", "SQ_LOG_LEVEL", "SQ_QUEUE_POLL_INTERVAL_MS")


async def _drive(fake: Any, base: str, secret: bytes, count: int, fail: int,
                 timeout_s: float, say: Any) -> int:
    broken = set(range(count - fail + 1, count + 1))
    sqids: dict[int, str] = {}
    for i in range(1, count + 1):
        text = "BROKEN\n" if i in broken else f"change {i}\n"
        pull = fake.open_pull({f"demo/{i:02d}/file.txt": text},
                              title=f"Demo change {i}" + (" (breaks the test)" if i in broken
                                                          else ""),
                              author="octocat")
        r = await fake.deliver(f"{base}/api/v1/github/webhook", "pull_request",
                               fake.pull_request_event(pull.number, "labeled",
                                                       label="merge-queue"), secret=secret)
        outcome = r.json()["outcomes"][0] if r.status_code == 200 else {}
        if not outcome.get("sqids"):
            say(f"demo: the webhook did not queue pull request #{pull.number}: {r.text}")
            return 1
        sqids[pull.number] = outcome["sqids"][0]
        say(f"pull request #{pull.number} {pull.title!r} labelled merge-queue -> "
            f"{sqids[pull.number]}")
    ends = await _watch(base, sqids, timeout_s, say)
    if ends is None:
        return 1
    landed = [n for n, (status, _) in ends.items() if status == "landed"]
    say()
    for n, (status, error) in sorted(ends.items()):
        merged = fake.pull_json(n)["merged"]
        say(f"#{n} {sqids[n]}: {status}" + (f" ({error})" if error else "")
            + (" - merged on GitHub" if merged else ""))
    say()
    say("SubmitQueue check-runs on the pull requests:")
    for n, run in sorted((await _check_runs(fake, sqids)).items()):
        say(f"#{n} {run.get('conclusion') or run['status']}: {run['title']}")
    say()
    say("main on the fake GitHub:")
    say(fake.repo.out("log", "--oneline", "--first-parent", "main"))
    ok = sorted(landed) == sorted(set(sqids) - broken) and all(
        ends[n][0] == "error" for n in broken)
    say()
    say(f"{len(landed)} landed, {count - len(landed)} removed: "
        + ("as expected" if ok else "NOT as expected"))
    return 0 if ok else 1


async def _check_runs(fake: Any, sqids: dict[int, str], timeout_s: float = 15
                      ) -> dict[int, dict[str, Any]]:
    """Each pull request's newest ``SubmitQueue`` check-run once all are completed (or
    as they are after ``timeout_s``: written a moment after the request ends)."""
    heads = {n: fake.pull_json(n)["head"]["sha"] for n in sqids}
    deadline = time.monotonic() + timeout_s
    while True:
        runs = {r["head_sha"]: r for r in fake.check_runs if r["name"] == "SubmitQueue"}
        mine = {n: runs[sha] for n, sha in heads.items() if sha in runs}
        done = len(mine) == len(heads) and all(r["status"] == "completed"
                                                for r in mine.values())
        if done or time.monotonic() > deadline:
            return mine
        await asyncio.sleep(0.2)


async def _watch(base: str, sqids: dict[int, str], timeout_s: float,
                 say: Any) -> dict[int, tuple[str, str]] | None:
    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        while True:
            ends: dict[int, tuple[str, str]] = {}
            for n, sqid in sqids.items():
                body = (await client.get(f"/api/v1/queues/{QUEUE}/requests/"
                                         f"{sqid.rsplit('/', 1)[1]}")).json()
                if seen.get(n) != body["status"]:
                    seen[n] = body["status"]
                    say(f"  {sqid} (#{n}): {body['status']}")
                if body["status"] in TERMINAL:
                    ends[n] = (body["status"], body.get("last_error") or "")
            if len(ends) == len(sqids):
                return ends
            if time.monotonic() > deadline:
                say(f"demo: not every request ended within {timeout_s:g} s")
                return None
            await asyncio.sleep(0.3)
