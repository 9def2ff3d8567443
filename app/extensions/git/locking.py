"""Locks that serialise work on one git repository: among this event loop's tasks
(an ``asyncio.Lock``) and among every process of the host (``flock`` on a file beside
the repository). Every fetch, worktree and push of a mirror runs under its lock.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import weakref
from pathlib import Path
from types import TracebackType

__all__ = ["MirrorLock", "host_flock", "mirror_lock"]


class MirrorLock:
    """``async with``: this process's ``asyncio.Lock`` for a path, then the host's ``flock``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_file = path.parent / f"{path.name}.lock"
        self._local = asyncio.Lock()
        self._fd: int | None = None

    def locked(self) -> bool:
        return self._local.locked()

    async def __aenter__(self) -> None:
        await self._local.acquire()
        try:
            self.lock_file.parent.mkdir(parents=True, exist_ok=True)
            self._fd = await host_flock(self.lock_file)
        except BaseException:
            self._local.release()
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                os.close(fd)  # drops the flock
        finally:
            self._local.release()


async def host_flock(path: Path) -> int:
    """An exclusive ``flock`` on ``path``, held by the returned descriptor (close it to let
    go). Waits in a thread of its own when another process holds it; cancellable."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        pass
    except BaseException:
        os.close(fd)
        raise
    loop = asyncio.get_running_loop()
    got: asyncio.Future[None] = loop.create_future()

    def handover(error: OSError | None) -> None:  # in the loop
        if got.done():  # the waiter was cancelled: nobody will use the lock
            os.close(fd)
        elif error is not None:
            os.close(fd)
            got.set_exception(error)
        else:
            got.set_result(None)

    def wait() -> None:  # in the thread
        error: OSError | None = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            error = exc
        try:
            loop.call_soon_threadsafe(handover, error)
        except RuntimeError:  # the loop is closed: nobody is waiting
            os.close(fd)

    threading.Thread(target=wait, name=f"sq-flock-{path.name}", daemon=True).start()
    try:
        await got
    except asyncio.CancelledError:
        if got.done() and not got.cancelled():  # granted and cancelled at once: let go
            os.close(fd)
        raise
    return fd


_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, MirrorLock]] = (
    weakref.WeakKeyDictionary()
)


def mirror_lock(path: Path) -> MirrorLock:
    """The lock serialising all work on the repository at ``path``: among this event
    loop's tasks and among every process (and loop) of the host."""
    loop = asyncio.get_running_loop()
    locks = _LOCKS.setdefault(loop, {})
    key = str(path.resolve())
    lock = locks.get(key)
    if lock is None:
        lock = locks[key] = MirrorLock(Path(key))
    return lock
