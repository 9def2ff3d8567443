"""The real server as a user runs it: `submitqueue serve`, health checks, Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import BACKENDS
from tests.support.procs import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
def test_serve_answers_health_checks_and_stops_cleanly_on_ctrl_c(
    database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "SQ_DATABASE_URL": database_url,
        "SQ_PORT": str(port),
        "SQ_QUEUES_FILE": str(ROOT / "queues.yaml"),
    }
    log_path = tmp_path / "server.log"
    log_file = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"],
        cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 200
        body = ready.json()
        assert body["ready"] is True
        assert body["checks"]["migrations"]["current"] == body["checks"]["migrations"]["head"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert "Application shutdown complete" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log_file.close()


def test_default_database_is_a_new_sqlite_file_under_var(tmp_path: Path) -> None:
    shutil.copyfile(ROOT / "queues.yaml", tmp_path / "queues.yaml")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env.update({"SQ_PORT": str(port), "PYTHONPATH": str(ROOT)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        assert (tmp_path / "var" / "submitqueue.db").is_file()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("role", "consumers"), [("gateway", 2), ("worker", 32), ("all", 34)])
def test_serve_role_flag_picks_the_consumers(tmp_path: Path, role: str, consumers: int) -> None:
    """--role gateway runs only the request-log consumers (log + log_dlq); worker only
    the orchestrator's (15 topics + 15 reconcilers, and the two taps on the log topic: the
    notify relay and the GitHub check-run relay); all runs both."""
    port = free_port()
    env = {**os.environ, "SQ_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'r.db'}",
           "SQ_PORT": str(port), "SQ_QUEUES_FILE": str(tmp_path / "queues.yaml")}
    env.pop("SQ_ROLE", None)
    shutil.copyfile(ROOT / "queues.yaml", tmp_path / "queues.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--role", role],
                            cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        checks = httpx.get(f"http://127.0.0.1:{port}/readyz").json()["checks"]
        assert checks["consumers"]["running"] == consumers
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("SQ_LOG_LEVEL", "LOUD", "SQ_LOG_LEVEL='LOUD': 'LOUD' is not a log level; use one of "
                             "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("SQ_PORT", "99999", "SQ_PORT='99999': Input should be less than or equal to 65535"),
])
@pytest.mark.parametrize("command", [["serve"], ["db", "upgrade"]])
def test_an_invalid_setting_is_one_line_and_exit_2_not_a_traceback(
    tmp_path: Path, command: list[str], setting: str, value: str, says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env.update({setting: value, "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-m", "app.cli", *command], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"submitqueue: invalid setting {says}"
    assert not (tmp_path / "var").exists()  # nothing was started or created


@pytest.mark.parametrize(("queues", "says"), [
    (None, "submitqueue: queues file 'queues.yaml' does not exist; run `submitqueue init` "
           "to write one (and a .env) here, or set SQ_QUEUES_FILE to the path of one"),
    ("queues:\n  - name: 3\n", "submitqueue: queues.yaml: queues.0.name: Input should be a "
                               "valid string"),
])
def test_serve_without_a_valid_queues_file_says_so_in_one_line(
    tmp_path: Path, queues: str | None, says: str
) -> None:
    if queues is not None:
        (tmp_path / "queues.yaml").write_text(queues)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip()) == (2, says)
    assert not (tmp_path / "var").exists()  # nothing was started or created


def test_an_invalid_setting_never_prints_a_password_it_holds(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env.update({"SQ_PUBLIC_URL": "ftp://bot:hunter2@ci.example", "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("submitqueue: invalid setting SQ_PUBLIC_URL=")
    assert "hunter2" not in done.stderr


@pytest.mark.slow
def test_serve_on_an_unmigrated_database_with_auto_migrate_off_says_run_db_upgrade(
    tmp_path: Path,
) -> None:
    shutil.copyfile(ROOT / "queues.yaml", tmp_path / "queues.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env.update({"PYTHONPATH": str(ROOT), "SQ_AUTO_MIGRATE": "false"})
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip()) == (2, (
        "submitqueue: the database sqlite+aiosqlite:///./var/submitqueue.db is at migration "
        "none; this version needs 0014: run `submitqueue db upgrade` (SQ_AUTO_MIGRATE is off)"))
    assert not (tmp_path / "var").exists()  # the check created no empty database
    assert subprocess.run([sys.executable, "-m", "app.cli", "db", "upgrade"], cwd=tmp_path,
                          env=env, capture_output=True, timeout=60).returncode == 0
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:  # migrated: the same command serves
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
