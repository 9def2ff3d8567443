"""Serve a ``FakeGitHub`` on a free loopback port (uvicorn in a thread), for the tests
(``tests/support/fake_github.py``) and ``submitqueue demo --github``."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from app.extensions.github.fake import FakeGitHub


@contextmanager
def serve_in_thread(repo_path: Path, **kwargs: Any) -> Iterator[FakeGitHub]:
    """A ``FakeGitHub(repo_path, **kwargs)`` answering at its ``base_url`` until exit."""
    fake = FakeGitHub(repo_path, **kwargs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    fake.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the fake GitHub did not start")
        time.sleep(0.01)
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
