"""A real HTTP receiver on a local socket (``http.server`` in a thread): records every
POST and answers each path from a script (``answers["/flaky"] = [500, 200]``: the
first request 500, then 200 for good)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


class Receiver:
    def __init__(self, answers: dict[str, list[int]]) -> None:
        self.answers = answers
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def on(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    def _answer(self, path: str) -> int:
        with self._lock:
            script = self.answers.get(path, [404])
            return script.pop(0) if len(script) > 1 else script[0]

    def _record(self, r: Received) -> None:
        with self._lock:
            self.received.append(r)


@contextmanager
def receiver(answers: dict[str, list[int]]) -> Iterator[Receiver]:
    rec = Receiver(answers)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            rec._record(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                 body, time.monotonic()))
            code = rec._answer(self.path)
            reply = b'{"ok": true}' if code < 300 else b'{"error": "scripted"}'
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
