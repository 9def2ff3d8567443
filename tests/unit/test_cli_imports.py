"""A client command (``submitqueue status ...``) loads nothing of the server.

Each command runs as the installed script would (``app.cli.main`` in a fresh
interpreter) against a port nobody listens on, then the test reads which modules that
process had loaded. The server's stack (SQLAlchemy, alembic, FastAPI, uvicorn, the app's
server layers) would triple the start-up; pydantic comes in through typer 0.29's
parameter adapters (pyproject pins typer below it); asyncio only ``watch`` needs.
The start-up time itself is measured by hand (docs/cli.md, "Start-up time").
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

SERVER_SIDE = ("sqlalchemy", "sqlmodel", "alembic", "fastapi", "starlette", "uvicorn",
               "pydantic", "pydantic_core", "structlog", "app.db", "app.controllers",
               "app.api", "app.main", "app.settings", "app.queue", "app.extensions",
               "app.gateway", "app.views", "app.cli.root", "app.cli.demo")

PROBE = """
import json, os, sys
sys.argv = ["submitqueue", *json.loads(os.environ["PROBE_ARGS"])]
from app.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loaded(tmp_path: Path, *args: str) -> tuple[int, set[str], str]:
    out = tmp_path / "probe.json"
    env = {**os.environ, "PROBE_ARGS": json.dumps(args), "PROBE_OUT": str(out)}
    env.pop("SQ_TOKEN", None)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=25, check=False)
    assert out.exists(), proc.stderr
    probe = json.loads(out.read_text())
    return probe["code"], set(probe["modules"]), proc.stderr


def _server_side(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".")
                                            for p in SERVER_SIDE))


@pytest.mark.parametrize("args", [
    ("status", "demo/1"),
    ("cancel", "demo/1", "--reason", "obsolete"),
    ("list", "--queue", "demo", "--since", "2h"),
    ("land", "--queue", "demo", "git://demo.example.com/demo/refs%2Fheads%2Ffix/"
     + "a" * 40),
], ids=lambda a: a[0])
def test_a_one_shot_client_command_loads_no_server_module_nor_an_event_loop(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    code, modules, stderr = _loaded(tmp_path, *args, "--url", url)
    assert code == 2 and "cannot reach the SubmitQueue server" in stderr, stderr
    assert {"httpx", "httpcore", "typer"} <= modules  # it did parse and call out
    assert _server_side(modules) == []
    assert "asyncio" not in modules


def test_watch_loads_an_event_loop_but_no_server_module(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    code, modules, stderr = _loaded(tmp_path, "watch", "demo/1", "--url", url)
    assert code == 2 and "cannot reach the SubmitQueue server" in stderr, stderr
    assert {"asyncio", "app.cli.table"} <= modules
    assert _server_side(modules) == []


def test_the_server_commands_still_load_the_server(tmp_path: Path) -> None:
    """The probe can see a server import: ``db --help`` goes through app.cli.root."""
    code, modules, _ = _loaded(tmp_path, "db", "--help")
    assert code == 0
    assert {"app.cli.root", "app.db", "uvicorn"} <= modules
