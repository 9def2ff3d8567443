"""The client commands (`submitqueue land/status/cancel/list/watch`) against the real app.

The server runs in the test's event loop (harness.serve); each command runs through
typer's CliRunner in a worker thread, where it starts its own event loop, exactly as
the installed `submitqueue` script would.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from app.cli.root import cli
from tests.conftest import BACKENDS
from tests.e2e.harness import change, free_port, serve

pytestmark = pytest.mark.timeout(90)


async def run_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), env=env)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_land_watch_status_and_list(database_url: str, tmp_path: Path) -> None:
    async with serve(database_url, tmp_path) as server:
        url = ("--url", server.base_url)
        good = change("cli-good", files="src/a.py", build_ms=600)
        r = await run_cli("land", "--queue", "demo", good, *url)
        assert r.exit_code == 0, r.output
        first = r.stdout.strip()
        assert first == "demo/1"

        r = await run_cli("watch", first, "--poll", "0.2", *url)
        assert r.exit_code == 0, r.output
        assert "1 of 1 landed" in r.stdout
        assert "cli-good" in r.stdout  # the change column names the branch

        r = await run_cli("status", first, *url)
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith("demo/1  landed")
        for line in ("status accepted", "event  building", "status landed"):
            assert line in r.stdout, r.stdout

        r = await run_cli("status", "--json", first, *url)
        body = json.loads(r.stdout)
        assert body["summary"]["status"] == "landed"
        statuses = [e["name"] for e in body["history"] if e["type"] == "status"]
        assert statuses[0] == "accepted" and statuses[-1] == "landed"

        bad = change("cli-bad", files="lib/b.py", fake="build-fail")
        r = await run_cli("land", "--json", "-q", "demo", bad, *url)
        assert json.loads(r.stdout) == {"sqid": "demo/2", "queue": "demo"}
        r = await run_cli("watch", "demo/2", "--poll", "0.2", *url)
        assert r.exit_code == 1, r.output
        assert "0 of 1 landed" in r.stdout and "demo/2 error" in r.stdout

        r = await run_cli("list", "-q", "demo", *url)
        assert r.exit_code == 0, r.output
        rows = [line.split()[:2] for line in r.stdout.splitlines()[1:]]
        assert rows == [["demo/2", "error"], ["demo/1", "landed"]]  # newest first

        r = await run_cli("list", "-q", "demo", "--status", "error", *url)
        assert "demo/2" in r.stdout and "demo/1 " not in r.stdout
        r = await run_cli("list", "-q", "demo", "--since", "1h", "--limit", "1", *url)
        assert "demo/2" in r.stdout and "demo/1 " not in r.stdout
        assert "only the newest 1 shown" in r.stdout
        r = await run_cli("list", "-q", "demo", "--since", "2999-01-01", *url)
        assert r.exit_code == 0 and "(no requests on demo match)" in r.stdout


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_cancel_a_request_in_flight_and_one_already_ended(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        url = ("--url", server.base_url)
        slow = change("cli-slow", files="src/slow.py", build_ms=30_000)
        sqid = await server.land(slow)
        r = await run_cli("cancel", sqid, "--reason", "wrong branch", *url)
        assert r.exit_code == 0, r.output
        assert r.stdout.strip() == f"{sqid}  cancelling"
        final = await server.wait_all_terminal([sqid], timeout=30)
        assert final == {sqid: "cancelled"}
        r = await run_cli("status", "--json", sqid, *url)
        history = json.loads(r.stdout)["history"]
        assert any("wrong branch" in json.dumps(e) for e in history), history

        r = await run_cli("cancel", "--json", sqid, *url)  # ended: left as it is
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout) == {"sqid": sqid, "status": "cancelled"}
        r = await run_cli("cancel", "demo/999", *url)
        assert r.exit_code == 1 and "not_found" in r.stderr, r.output
        r = await run_cli("cancel", "not-a-sqid", *url)
        assert r.exit_code == 2, r.output


async def test_watch_without_ids_follows_what_is_in_flight(tmp_path: Path) -> None:
    async with serve(f"sqlite+aiosqlite:///{tmp_path}/db.sqlite", tmp_path) as server:
        url = ("--url", server.base_url)
        r = await run_cli("watch", "-q", "demo", *url)
        assert r.exit_code == 0 and "nothing in flight on demo" in r.stdout
        slow = [await server.land(change(f"slow-{i}", files=f"d{i}/x.py", build_ms=1500))
                for i in range(2)]
        r = await run_cli("watch", "-q", "demo", "--poll", "0.2", *url)
        assert r.exit_code == 0, r.output
        assert "2 of 2 landed" in r.stdout
        for sqid in slow:
            assert sqid in r.stdout
            assert (await server.summary(sqid))["status"] == "landed"


async def test_errors_are_plain_messages_with_exit_codes(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    r = await run_cli("status", "demo/1", "--url", dead)
    assert r.exit_code == 2
    assert f"cannot reach the SubmitQueue server at {dead}" in r.stderr
    assert "Traceback" not in r.output

    r = await run_cli("status", "demo/x", "--url", dead)  # checked before any call
    assert r.exit_code == 2 and "<queue>/<n>" in r.output

    async with serve(f"sqlite+aiosqlite:///{tmp_path}/db.sqlite", tmp_path) as server:
        url = ("--url", server.base_url)
        uri = change("x", files="a.py")
        r = await run_cli("land", "-q", "nope", uri, *url)
        assert r.exit_code == 1
        assert "queue 'nope' is not configured" in r.stderr
        r = await run_cli("land", "-q", "demo", "http://nope", *url)
        assert r.exit_code == 1 and "unknown scheme" in r.stderr
        r = await run_cli("status", "demo/999", *url)
        assert r.exit_code == 1 and "does not exist" in r.stderr
        r = await run_cli("land", uri, *url)  # two queues configured: which one?
        assert r.exit_code == 2 and "--queue" in r.output
        r = await run_cli("land", uri, *url, env={"SQ_QUEUE": "demo"})
        assert r.exit_code == 0 and r.stdout.strip() == "demo/1"
        r = await run_cli("list", "-q", "demo", "--since", "yesterday", *url)
        assert r.exit_code == 2 and "duration" in r.output


class _Recorder(BaseHTTPRequestHandler):
    """A server that is not a healthy gateway: 503 with an error body, or HTML."""

    seen: list[str | None] = []  # noqa: RUF012 - shared by the handler instances

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        if self.path.startswith("/api/v1/queues/demo/requests/1"):
            body, status, kind = (b'{"error":{"code":"unavailable","message":"database '
                                  b'is busy; try again"}}', 503, "application/json")
        else:
            body, status, kind = b"<html>hello</html>", 200, "text/html"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def odd_server() -> Iterator[str]:
    _Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_token_is_sent_and_5xx_or_foreign_answers_exit_2(odd_server: str) -> None:
    r = await run_cli("status", "demo/1", "--url", odd_server, env={"SQ_TOKEN": "s3cret"})
    assert r.exit_code == 2
    assert "database is busy; try again" in r.stderr
    assert _Recorder.seen == ["Bearer s3cret"]

    r = await run_cli("list", "-q", "demo", "--url", odd_server, env={"SQ_TOKEN": ""})
    assert r.exit_code == 2 and "is --url the SubmitQueue server?" in r.stderr
    assert _Recorder.seen[-1] is None  # an empty SQ_TOKEN sends no header
