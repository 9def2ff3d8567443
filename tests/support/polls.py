"""Waiting on a condition, never on a sleep: poll until it holds or fail naming it."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


async def wait_for(condition: Callable[[], Any], what: str, timeout: float = 20,
                   interval: float = 0.02) -> Any:
    """Poll ``condition`` (sync or async) until it returns something truthy, and return
    it; ``AssertionError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)

