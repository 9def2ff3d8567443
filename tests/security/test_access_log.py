"""Credentials in a query string never reach the logs: the access log line of a request
to ``/api/v1/admin/...?token=<secret>`` shows the value masked, as the ``Authorization``
header never shows at all. (The admin API takes its token only from that header; a
client that puts it in the URL anyway must not leak it into the log.)"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest
import uvicorn

from app.main import create_app
from app.settings import Settings
from tests.conftest import BACKENDS
from tests.e2e.harness import free_port
from tests.support.logs import captured_logs

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

QUEUES = "queues:\n  - name: demo\n"


async def test_a_token_in_the_query_string_is_masked_in_the_access_log(
    database_url: str, tmp_path: Path,
) -> None:
    token = "ops:" + uuid.uuid4().hex
    others = {name: f"{name}-{uuid.uuid4().hex}" for name in ("access_token", "api_key")}
    (tmp_path / "queues.yaml").write_text(QUEUES)
    settings = Settings(_env_file=None,  # type: ignore[call-arg]
                        database_url=database_url, queues_file=tmp_path / "queues.yaml",
                        admin_token=token, queue_shutdown_grace_ms=1000)
    with captured_logs("INFO") as out:
        server = uvicorn.Server(uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=free_port(), log_config=None,
            lifespan="on", log_level="info", access_log=False))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                assert not task.done(), task.result()
                await asyncio.sleep(0.02)
            port = server.servers[0].sockets[0].getsockname()[1]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                query = f"token={token}&limit=5&" + "&".join(f"{k}={v}" for k, v in others.items())
                r = await client.get(f"/api/v1/admin/topics?{query}")
                assert r.status_code == 401  # a query token is not accepted, only the header
                r = await client.get("/api/v1/admin/topics",
                                     headers={"Authorization": f"Bearer {token}"})
                assert r.status_code == 200
        finally:
            server.should_exit = True
            await task
    # the access log's structured lines (httpx logs its requests too: masked the same way)
    lines = [line for line in out.text.splitlines()
             if "http request" in line and "/api/v1/admin/topics" in line]
    assert len(lines) == 2, out.text
    assert "token=[redacted]&limit=5&access_token=[redacted]&api_key=[redacted]" in lines[0]
    for secret in (token, token.split(":", 1)[1], *others.values()):
        assert secret not in out.text

