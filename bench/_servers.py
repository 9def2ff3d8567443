"""Real ``submitqueue serve`` processes for the benchmarks: start, wait until ready,
SIGKILL, restart, stop; fresh PostgreSQL databases; percentiles.

Only 127.0.0.1. Each process gets its own environment (database URL, queues file,
port) and runs in the bench's temporary directory, so no ``.env`` of the checkout
leaks in; its output is appended to ``server-<i>.log`` there across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
TERMINAL = frozenset({"landed", "error", "cancelled"})


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command() -> list[str]:
    """The installed ``submitqueue`` next to this interpreter, else ``python -m app.cli``."""
    exe = Path(sys.executable).parent / "submitqueue"
    return [str(exe), "serve"] if exe.is_file() else [sys.executable, "-m", "app.cli", "serve"]


def server_env(overrides: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without any ``SQ_*`` setting, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(overrides)
    return env


class ServerDied(RuntimeError):
    """A server process exited (or never became ready) when it should be serving."""


@dataclass
class ServerProcess:
    """One ``submitqueue serve --role all`` process on a fixed port (kept across restarts)."""

    index: int
    workdir: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    ready: bool = False
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def member_id(self) -> str:
        """Its queue member id (``SQ_MEMBER_ID``), the same across restarts: a restarted
        server takes back the messages it was handling when it died."""
        return self.env.get("SQ_MEMBER_ID") or f"bench-{self.index}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self.index}.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"server {self.index} is already running")
        if self._log is None:
            self._log = self.log_path.open("ab")
        self.starts += 1
        self._log.write(f"--- start {self.starts} ---\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            [*serve_command(), "--role", "all"], cwd=self.workdir,
            env={**self.env, "SQ_PORT": str(self.port), "SQ_MEMBER_ID": self.member_id},
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )

    async def wait_ready(self, timeout: float = 60) -> None:
        """Until ``/readyz`` answers 200; ``ServerDied`` (with the log's tail) otherwise."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5) as client:
            while time.monotonic() < deadline:
                if not self.alive:
                    raise ServerDied(f"server {self.index} exited with "
                                     f"{self.proc.returncode if self.proc else None}:\n"
                                     f"{self.log_tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        self.ready = True
                        return
                await asyncio.sleep(0.1)
        raise ServerDied(f"server {self.index} not ready after {timeout:g} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, leases stay taken until they time out."""
        self.ready = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def interrupt(self) -> None:
        """SIGINT: a clean stop begins (running handlers get their grace period)."""
        self.ready = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def wait_stopped(self, timeout: float = 30) -> int | None:
        """The exit code after ``interrupt()``; SIGKILL if it takes over ``timeout``."""
        code: int | None = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def stop(self, timeout: float = 30) -> int | None:
        self.interrupt()
        return self.wait_stopped(timeout)

    def log_tail(self, chars: int = 3000) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Cluster:
    """``count`` server processes sharing one database; ``per_server(i)`` adds to the
    environment of process ``i`` (e.g. its own queues file)."""

    def __init__(self, workdir: Path, count: int, env: Mapping[str, str],
                 per_server: Callable[[int], Mapping[str, str]] | None = None) -> None:
        self.servers = [
            ServerProcess(i, workdir, server_env({**env, **(per_server(i) if per_server else {})}))
            for i in range(count)
        ]

    async def start(self, timeout: float = 60) -> None:
        """The first alone (it migrates and may create the sandbox), then the others."""
        first, *rest = self.servers
        first.start()
        await first.wait_ready(timeout)
        for s in rest:
            s.start()
        await asyncio.gather(*(s.wait_ready(timeout) for s in rest))

    def ready(self) -> list[ServerProcess]:
        return [s for s in self.servers if s.ready and s.alive]

    async def pick(self, rng: random.Random, timeout: float = 90) -> ServerProcess:
        """A random ready server, waiting for one to come back if all are down."""
        deadline = time.monotonic() + timeout
        while True:
            live = self.ready()
            if live:
                return rng.choice(live)
            if time.monotonic() > deadline:
                raise ServerDied(f"no server ready for {timeout:g} s")
            await asyncio.sleep(0.05)

    def stop(self) -> list[int | None]:
        """Stop every process (SIGINT to all first, so they shut down side by side)."""
        for s in self.servers:
            s.interrupt()
        return [s.wait_stopped() for s in self.servers]


async def request_any(cluster: Cluster, rng: random.Random, method: str, path: str,
                      client: httpx.AsyncClient, attempts: int = 200,
                      **kw: Any) -> httpx.Response:
    """An idempotent call to any ready server, retried on transport errors and 503s."""
    last: Exception | None = None
    for _ in range(attempts):
        server = await cluster.pick(rng)
        try:
            r = await client.request(method, f"{server.url}{path}", **kw)
        except httpx.TransportError as exc:
            last = exc
            await asyncio.sleep(0.1)
            continue
        if r.status_code != 503:
            return r
        await asyncio.sleep(0.1)
    raise ServerDied(f"{method} {path}: no answer after {attempts} attempts ({last!r})")


async def create_pg_database(admin_dsn: str = PG_ADMIN_DSN, prefix: str = "sq_bench") -> str:
    """CREATE a fresh, empty database; returns its SQLAlchemy URL (asyncpg driver).
    ``admin_dsn`` may be a plain ``postgresql://`` DSN or a SQLAlchemy URL."""
    admin_dsn = pg_dsn(admin_dsn)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    base = admin_dsn.rsplit("/", 1)[0].split("://", 1)[1]
    return f"postgresql+asyncpg://{base}/{name}"


async def drop_pg_database(url: str, admin_dsn: str = PG_ADMIN_DSN) -> None:
    name = url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(pg_dsn(admin_dsn))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def pg_dsn(url: str) -> str:
    """A SQLAlchemy ``postgresql+asyncpg://`` URL as a plain asyncpg DSN."""
    return "postgresql://" + url.split("://", 1)[1]


async def queue_rows(database_url: str, sql: str) -> list[dict[str, Any]]:
    """Read-only SQL on the server's database (stdlib sqlite3 or asyncpg)."""
    if database_url.startswith("sqlite"):
        import sqlite3

        path = database_url.split(":///", 1)[1]

        def read() -> list[dict[str, Any]]:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
            conn.row_factory = sqlite3.Row
            try:
                return [dict(r) for r in conn.execute(sql).fetchall()]
            finally:
                conn.close()

        return await asyncio.to_thread(read)
    conn = await asyncpg.connect(pg_dsn(database_url))
    try:
        return [dict(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()
