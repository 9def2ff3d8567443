"""Deterministic interleavings: hook a named async function, count its calls and pause
chosen calls at entry or exit until the test releases them.

The hooked function runs in the test's own event loop (the in-process app of
``tests/e2e/harness.py`` does), so a paused call simply waits on an ``asyncio`` event
while the test drives another path; no sleeps. Typical use::

    gate = hook(monkeypatch, reconcilers, "terminate_request", pause="entry",
                when=lambda *a, **kw: kw["sqid"] == sqid)
    ...                                  # something calls it: that call now waits
    await gate.reached()                 # it is parked at its entry
    ...                                  # run the competing path to a known state
    gate.release()
    await gate.exited()                  # the paused call returned or raised
    assert isinstance(gate.errors[0], VersionMismatch)

``Actor`` tells one task's calls of a shared function (a repository read, say) from
the app's: ``when=actor``, and start the competing work with ``actor.start(...)``.

Never pause inside a ``Database.write()`` block on SQLite: every writer of the
process waits on that block's lock, the competing path included. Hook a function
called between transactions (or a read), as the tests of this repository do.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, TypeVar

import pytest

Where = Literal["entry", "exit"]
DEFAULT_TIMEOUT_S = 20.0
T = TypeVar("T")


class Gate:
    """The hook on one function: call counts, errors raised, and the pause."""

    def __init__(self, name: str, *, pause: Where | None, times: int,
                 when: Callable[..., bool] | None,
                 raises: Callable[[], BaseException] | None,
                 trace: list[tuple[str, str]] | None) -> None:
        self.name = name
        self.trace = trace
        self.pause = pause
        self.remaining = times  # calls still to pause (or to fail, with ``raises``)
        self.when = when
        self.raises = raises
        self.entered = 0  # matching calls that started
        self.finished = 0  # matching calls that returned or raised
        self.paused = 0  # matching calls that reached the pause
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []  # matching calls' args
        self.results: list[Any] = []
        self.errors: list[BaseException] = []
        self._released = asyncio.Event()
        self._release_error: BaseException | None = None
        self._changed = asyncio.Condition()

    def release(self, error: BaseException | None = None) -> None:
        """Let every paused call go on; with ``error``, a paused call raises it instead
        (at entry: the original never runs; at exit: its result is dropped), which is
        how a test stands in for a crash at that point."""
        self._release_error = error
        self._released.set()

    async def reached(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait until ``n`` calls are parked at (or went through) the pause."""
        await self._wait(lambda: self.paused >= n, f"{n} call(s) paused", timeout)

    async def exited(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait until ``n`` matching calls returned or raised."""
        await self._wait(lambda: self.finished >= n, f"{n} call(s) finished", timeout)

    async def _wait(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout)
            except TimeoutError:
                raise AssertionError(
                    f"{self.name}: not {what} within {timeout}s (entered {self.entered}, "
                    f"paused {self.paused}, finished {self.finished})") from None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _stop_here(self) -> None:
        self.paused += 1
        await self._notify()
        await self._released.wait()
        if self._release_error is not None:
            raise self._release_error

    def _mark(self, event: str) -> None:
        if self.trace is not None:
            self.trace.append((self.name, event))

    async def run(self, original: Callable[..., Awaitable[Any]], *args: Any,
                  **kwargs: Any) -> Any:
        if self.when is not None and not self.when(*args, **kwargs):
            return await original(*args, **kwargs)
        self.entered += 1
        self.calls.append((args, dict(kwargs)))
        self._mark("enter")
        act = self.remaining > 0
        if act:
            self.remaining -= 1
        try:
            if act and self.raises is not None:
                raise self.raises()
            if act and self.pause == "entry":
                await self._stop_here()
            result = await original(*args, **kwargs)
            if act and self.pause == "exit":
                await self._stop_here()
            self.results.append(result)
            self._mark("return")
            return result
        except BaseException as exc:
            self.errors.append(exc)
            self._mark("raise")
            raise
        finally:
            self.finished += 1
            await self._notify()


def hook(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, *,
         pause: Where | None = None, times: int = 1, when: Callable[..., bool] | None = None,
         raises: Callable[[], BaseException] | None = None,
         trace: list[tuple[str, str]] | None = None, label: str | None = None) -> Gate:
    """Replace ``owner.name`` (a module attribute, a class's method or an instance's
    attribute) with a hook.

    ``pause``: where the first ``times`` matching calls wait for ``Gate.release()``
    (None: only count). ``when(*args, **kwargs)``: which calls match (default all).
    ``raises``: instead of pausing, the first ``times`` matching calls raise the error
    this factory returns, before the original runs (fault injection).
    ``trace``: a list shared by several gates; each matching call appends
    ``(label, "enter" | "return" | "raise")``, so a test can assert an order.
    Patching a class affects its existing instances too (methods are looked up on
    the class), which is how the app's running controllers are reached.
    """
    original = getattr(owner, name)
    gate = Gate(label or f"{getattr(owner, '__name__', type(owner).__name__)}.{name}",
                pause=pause, times=times, when=when, raises=raises, trace=trace)

    @functools.wraps(original)
    async def hooked(*args: Any, **kwargs: Any) -> Any:
        return await gate.run(original, *args, **kwargs)

    monkeypatch.setattr(owner, name, hooked)
    return gate


class Actor:
    """Tells one actor's calls of a shared function from everyone else's: the calls
    made by a task started with ``start`` (and by the tasks it starts). Pass it as a
    hook's ``when`` (it accepts any arguments) or call it inside one::

        dlq = Actor("dlq")
        gate = hook(monkeypatch, batch_repo, "get", pause="exit", when=dlq)
        task = dlq.start(reconciler.reconcile(letter))  # only its read pauses
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._mine: contextvars.ContextVar[bool] = contextvars.ContextVar(
            f"actor-{name}", default=False)

    def start(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        context = contextvars.copy_context()
        context.run(self._mine.set, True)
        return asyncio.get_running_loop().create_task(work, context=context)

    def __call__(self, *args: Any, **kwargs: Any) -> bool:
        return self._mine.get()
