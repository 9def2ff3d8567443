"""Run the real app (gateway + consumers) in-process on a free port and talk HTTP to it."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from app.main import Runtime, create_app
from app.settings import Settings
from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"landed", "error", "cancelled"}


def change(branch: str, *, files: str, fake: str = "", build_ms: int | None = None,
           sha_seed: str | None = None) -> str:
    """A fake git change URI with markers."""
    import hashlib

    sha = hashlib.sha1((sha_seed or branch).encode()).hexdigest()
    query = f"sq-files={files}"
    if fake:
        query += f"&sq-fake={fake}"
    if build_ms is not None:
        query += f"&sq-build-ms={build_ms}"
    return f"git://demo.example.com/demo/refs%2Fheads%2F{branch}/{sha}?{query}"


class Server:
    def __init__(self, base_url: str, app: Any) -> None:
        self.base_url = base_url
        self.app = app
        self.client = httpx.AsyncClient(base_url=base_url, timeout=30)

    @property
    def runtime(self) -> Runtime:
        return self.app.state.runtime  # type: ignore[no-any-return]

    async def land(self, *uris: str, queue: str = "demo", strategy: str | None = None) -> str:
        body: dict[str, Any] = {"change_uris": list(uris)}
        if strategy:
            body["strategy"] = strategy
        r = await self.client.post(f"/api/v1/queues/{queue}/requests", json=body)
        assert r.status_code == 202, r.text
        return str(r.json()["sqid"])

    async def summary(self, sqid: str) -> dict[str, Any]:
        queue, n = sqid.rsplit("/", 1)
        r = await self.client.get(f"/api/v1/queues/{queue}/requests/{n}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    async def history(self, sqid: str) -> list[dict[str, Any]]:
        queue, n = sqid.rsplit("/", 1)
        r = await self.client.get(f"/api/v1/queues/{queue}/requests/{n}/history")
        assert r.status_code == 200, r.text
        return r.json()["events"]  # type: ignore[no-any-return]

    async def statuses(self, sqid: str) -> list[str]:
        return [e["status"] for e in await self.history(sqid) if e["type"] == "status"]

    async def cancel(self, sqid: str, reason: str = "test") -> httpx.Response:
        queue, n = sqid.rsplit("/", 1)
        return await self.client.post(f"/api/v1/queues/{queue}/requests/{n}/cancel",
                                      json={"reason": reason})

    async def wait_status(self, sqid: str, wanted: set[str], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        status = ""
        while time.monotonic() < deadline:
            status = (await self.summary(sqid))["status"]
            if status in wanted:
                return status
            await asyncio.sleep(0.05)
        raise AssertionError(f"{sqid} is {status!r}, not one of {sorted(wanted)}, after {timeout}s")

    async def wait_terminal(self, sqid: str, timeout: float = 30) -> str:
        return await self.wait_status(sqid, TERMINAL, timeout)

    async def statuses_of_queue(self, queue: str = "demo") -> dict[str, str]:
        """Every request's status via the list API (newest first, all pages)."""
        out: dict[str, str] = {}
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 200}
            if cursor:
                params["cursor"] = cursor
            r = await self.client.get(f"/api/v1/queues/{queue}/requests", params=params)
            assert r.status_code == 200, r.text
            body = r.json()
            out.update({i["sqid"]: i["status"] for i in body["items"]})
            cursor = body.get("next_cursor")
            if not cursor:
                return out

    async def wait_all_terminal(self, sqids: list[str], timeout: float = 120,
                                queue: str = "demo") -> dict[str, str]:
        """Poll the list API (one request per page) until every sqid is terminal."""
        deadline = time.monotonic() + timeout
        while True:
            statuses = await self.statuses_of_queue(queue)
            mine = {s: statuses.get(s, "?") for s in sqids}
            if all(v in TERMINAL for v in mine.values()):
                return mine
            if time.monotonic() > deadline:
                waiting = {s: v for s, v in mine.items() if v not in TERMINAL}
                raise AssertionError(f"{len(waiting)} requests not terminal after {timeout}s: "
                                     f"{dict(list(waiting.items())[:10])}")
            await asyncio.sleep(0.5)


@asynccontextmanager
async def serve(database_url: str, tmp_path: Path, **overrides: Any) -> AsyncIterator[Server]:
    queues_file = tmp_path / "queues.yaml"
    if not queues_file.exists():
        shutil.copyfile(ROOT / "queues.yaml", queues_file)
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=database_url, queues_file=queues_file, queue_poll_interval_ms=200,
        queue_shutdown_grace_ms=2000, **{"log_level": "WARNING", **overrides},
    )
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    handle = Server(f"http://127.0.0.1:{port}", app)
    try:
        yield handle
    finally:
        await handle.client.aclose()
        server.should_exit = True
        await task
