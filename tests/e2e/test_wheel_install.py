"""The wheel as a newcomer installs it: built from the sources, installed into a fresh
venv, then ``submitqueue init && submitqueue serve`` in an empty folder serves the
pages and lands a demo request, with nothing of the checkout in reach (the migrations
and pages come from the wheel's ``app/_bundle``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
URI = ("git://demo.example.com/demo/refs%2Fheads%2Ftry/"
       "1111111111111111111111111111111111111111?sq-files=src/a.py")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the fixture builds and installs


@dataclass
class Installed:
    sources: Path  # the copy the wheel was built from
    wheel: Path
    bin: Path  # the fresh venv's bin/


def run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def clean_env() -> dict[str, str]:
    """The caller's environment without what would point the install back at the
    checkout or this test run: no SQ_ settings, no PYTHONPATH, no venv, no coverage."""
    drop = ("SQ_", "COVERAGE", "PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    sources = base / "src"
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                 cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        path = ROOT / name
        if path.is_file():  # a tracked file deleted in the work tree is left out
            (sources / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, sources / name)
    env = clean_env()
    # with build isolation: the build backend (setuptools>=77) comes from the index
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "dist",
                sources, cwd=base, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (base / "dist").glob("submitqueue-*.whl")
    made = run(sys.executable, "-m", "venv", base / "venv", cwd=base, env=env)
    assert made.returncode == 0, made.stderr
    bin_dir = base / "venv" / "bin"
    done = run(bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
               wheel, cwd=base, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return Installed(sources=sources, wheel=wheel, bin=bin_dir)


def test_init_then_serve_from_an_empty_folder_serves_pages_and_lands_a_request(
    installed: Installed, tmp_path: Path,
) -> None:
    """One test, so that an xdist run builds and installs the wheel once."""
    assert_wheel_contents(installed)
    sq = installed.bin / "submitqueue"
    env = clean_env()
    work = tmp_path / "empty"
    work.mkdir()

    # the installed package reads its own copies, never a checkout
    where = run(installed.bin / "python", "-c",
                "from app.resources import resource; print(resource('alembic'))",
                cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).parts[-3:] == ("app", "_bundle", "alembic")
    assert installed.bin.parent in Path(where.stdout.strip()).parents

    missing = run(sq, "serve", cwd=work, env=env, timeout=60)
    assert (missing.returncode, missing.stderr.count("\n")) == (2, 1), missing.stderr
    assert "run `submitqueue init`" in missing.stderr

    init = run(sq, "init", cwd=work, env=env, timeout=60)
    assert init.returncode == 0, init.stderr
    assert sorted(p.name for p in work.iterdir()) == [".env", "queues.yaml"]
    again = run(sq, "init", cwd=work, env=env, timeout=60)
    assert (again.returncode, again.stderr.count("\n")) == (1, 1)

    upgrade = run(sq, "db", "upgrade", cwd=work, env=env, timeout=120)
    assert upgrade.returncode == 0, upgrade.stderr
    assert upgrade.stdout.strip() == "database at head: sqlite+aiosqlite:///./var/submitqueue.db"

    port = free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([str(sq), "serve", "--port", str(port)], cwd=work, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=10) as client:
            ready = wait_ready(client, proc, log_path)
            assert ready["checks"]["migrations"]["current"] == \
                ready["checks"]["migrations"]["head"]
            index = client.get("/")
            assert index.status_code == 200
            assert index.headers["content-type"].startswith("text/html")
            assert index.content == (installed.sources / "frontend-static/index.html").read_bytes()
            script = client.get("/static/js/index.js")
            assert script.status_code == 200
            assert script.content == (installed.sources / "frontend-static/js/index.js"
                                      ).read_bytes()

            r = client.post("/api/v1/queues/demo/requests", json={"change_uris": [URI]})
            assert r.status_code == 202, r.text
            sqid = r.json()["sqid"]
            assert wait_terminal(client, sqid) == "landed"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (work / "var" / "submitqueue.db").is_file()


def wait_ready(client: httpx.Client, proc: subprocess.Popen[bytes], log: Path,
               timeout: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}:\n"
                                 f"{log.read_text()[-3000:]}")
        try:
            r = client.get("/readyz", timeout=2)
            if r.status_code == 200 and r.json()["ready"] is True:
                return r.json()  # type: ignore[no-any-return]
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not ready after {timeout}s:\n{log.read_text()[-3000:]}")


def wait_terminal(client: httpx.Client, sqid: str, timeout: float = 60) -> str:
    queue, n = sqid.rsplit("/", 1)
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = client.get(f"/api/v1/queues/{queue}/requests/{n}").json()["status"]
        if status in ("landed", "error", "cancelled"):
            return str(status)
        time.sleep(0.1)
    raise AssertionError(f"{sqid} is {status!r} after {timeout}s")


def assert_wheel_contents(installed: Installed) -> None:
    """The wheel carries the migrations, the pages, the examples and the license."""
    with zipfile.ZipFile(installed.wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read("submitqueue-0.1.0.dist-info/METADATA").decode()
    expected = {f"app/_bundle/{path.relative_to(installed.sources)}"
                for top in ("alembic", "frontend-static")
                for path in (installed.sources / top).rglob("*") if path.is_file()}
    expected |= {"app/_bundle/queues.yaml", "app/_bundle/.env.example",
                 "submitqueue-0.1.0.dist-info/licenses/LICENSE"}
    assert expected - names == set()
    assert "app/_bundle/alembic/versions/0001_queue_tables.py" in names
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
