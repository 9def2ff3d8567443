"""Running a build command: a bounded log, a fixed environment, a timeout, a cancel,
and killing what is left of it (its whole process group).

The command is an argv list started with ``create_subprocess_exec`` (never a shell) in
a new session, so its process group id is its pid: killing the group reaches every
process it started that stayed in the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.domain.states import BuildStatus

LOG_LIMIT_BYTES = 1024 * 1024
PYTHON_PLACEHOLDER = "{python}"
DRAIN_S = 5.0  # after the command ended: how long its output may still take to arrive


class LogBuffer:
    """The last ``limit`` bytes of a build's output, plus the runner's own ``[sq]`` lines."""

    def __init__(self, limit: int = LOG_LIMIT_BYTES) -> None:
        self.limit = limit
        self._buf = bytearray()
        self.dropped = 0
        self.dirty = True

    def write(self, data: bytes) -> None:
        self._buf += data
        excess = len(self._buf) - self.limit
        if excess > 0:
            del self._buf[:excess]
            self.dropped += excess
        self.dirty = True

    def line(self, text: str) -> None:
        """A line from the runner itself (not from the command)."""
        if self._buf and not self._buf.endswith(b"\n"):
            self.write(b"\n")
        self.write(f"[sq] {text}\n".encode())

    def text(self) -> str:
        body = self._buf.decode("utf-8", "replace")
        if self.dropped:
            return f"[sq] ... {self.dropped} earlier bytes of output dropped ...\n{body}"
        return body


def command_argv(command: Sequence[str]) -> list[str]:
    """The configured argv with ``{python}`` replaced by this interpreter."""
    return [sys.executable if arg == PYTHON_PLACEHOLDER else arg for arg in command]


def build_env(home: Path, facts: Mapping[str, str]) -> dict[str, str]:
    """The fixed environment of a build: nothing inherited but ``PATH``."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",  # so a Python test's output reaches the log as it runs
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(facts)
    return env


@dataclass(frozen=True, slots=True)
class Outcome:
    status: BuildStatus
    detail: str
    exit_code: int | None = None


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM to the group, up to ``grace_s`` for it to exit, then SIGKILL to the group."""
    kill_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), grace_s)
    kill_group(proc.pid, signal.SIGKILL)


def _carries(pid: int, build_id: str) -> bool:
    """Whether process ``pid`` runs with ``SQ_BUILD_ID=<build_id>`` (``/proc``, Linux)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"SQ_BUILD_ID={build_id}".encode() in environ.split(b"\0")


def build_processes(build_id: str) -> list[int]:
    """The live processes of a build: every pid whose environment carries its id."""
    try:
        pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    except OSError:
        return []
    return sorted(pid for pid in pids if pid != os.getpid() and _carries(pid, build_id))


def kill_orphan(pid: int | None, build_id: str) -> int | None:
    """Kill what a dead instance of the runner left running of a build; the pid of its
    command, or ``None`` when nothing of it was alive.

    The recorded ``pid`` is killed with its process group only while it still is that
    build's command (its environment carries ``SQ_BUILD_ID=<build_id>``), so a reused pid
    is never killed. The instance may have died before it recorded the pid, and a process
    may have left the group: every process carrying the build's id is killed too."""
    leader = pid if pid is not None and _carries(pid, build_id) else None
    found = build_processes(build_id)
    if leader is None and found:
        leaders = [p for p in found if _group_of(p) == p]
        leader = leaders[0] if leaders else found[0]
    if leader is not None and _group_of(leader) == leader:
        kill_group(leader, signal.SIGKILL)
    for other in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(other, signal.SIGKILL)
    return leader


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


async def _pump(stream: asyncio.StreamReader | None, log: LogBuffer) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        log.write(chunk)


async def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log: LogBuffer,
    timeout_s: float,
    cancelled: asyncio.Event,
    grace_s: float,
    on_start: Callable[[int], Awaitable[None]] | None = None,
    pass_fds: Sequence[int] = (),
) -> Outcome:
    """Run the command to its end, its timeout or a cancel; its output goes to ``log``.

    | End | Outcome |
    |---|---|
    | exit 0 | ``succeeded`` |
    | exit n != 0, or killed by a signal | ``failed`` (``command exited n`` / ``... signal``) |
    | ``timeout_s`` passed | group stopped; ``failed`` (``timed out after Ns``) |
    | ``cancelled`` set | group stopped; ``cancelled`` |
    | the command cannot start | ``failed`` (why) |

    Whatever the end, the process group is killed afterwards (nothing outlives a build).
    ``pass_fds`` are descriptors the command inherits (the sandbox's status pipe).
    """
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=str(cwd), env=dict(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        return Outcome(BuildStatus.FAILED, f"the build command could not start: {exc}")
    reader = asyncio.create_task(_pump(proc.stdout, log))
    waiter = asyncio.create_task(proc.wait())
    cancel = asyncio.create_task(cancelled.wait())
    try:
        if on_start is not None:
            await on_start(proc.pid)
        done, _ = await asyncio.wait({waiter, cancel}, timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            code = waiter.result()
            outcome = _exited(code, time.monotonic() - started)
        elif cancel in done:
            await stop_group(proc, grace_s)
            outcome = Outcome(BuildStatus.CANCELLED, "cancelled while running")
        else:
            await stop_group(proc, grace_s)
            outcome = Outcome(BuildStatus.FAILED, f"timed out after {timeout_s:g}s")
    except BaseException:  # stopped from outside (server shutdown): leave nothing behind
        kill_group(proc.pid)
        raise
    finally:
        cancel.cancel()
        kill_group(proc.pid)  # whatever the command left running in its group
        try:
            await asyncio.wait_for(asyncio.shield(reader), DRAIN_S)
        except (TimeoutError, asyncio.CancelledError):
            reader.cancel()
        if not waiter.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(waiter, grace_s + 1)
    return outcome


def _exited(code: int, seconds: float) -> Outcome:
    took = f"after {seconds:.1f}s"
    if code == 0:
        return Outcome(BuildStatus.SUCCEEDED, f"command exited 0 {took}", 0)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return Outcome(BuildStatus.FAILED, f"command killed by {name} {took}", code)
    return Outcome(BuildStatus.FAILED, f"command exited {code} {took}", code)
