"""Many land requests at once: 200 concurrent requests over 20 folders all land."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve

pytestmark = [pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
              pytest.mark.slow, pytest.mark.timeout(300)]


async def land_as_a_client_would(server: Server, uri: str, retries: list[int]) -> str:
    """POST one land request; a 503 (overloaded: nothing was written) is retried after its
    ``Retry-After``, as a well-behaved client does. Anything else but 202 fails."""
    for _ in range(10):
        r = await server.client.post("/api/v1/queues/demo/requests",
                                     json={"change_uris": [uri]})
        if r.status_code != 503:
            assert r.status_code == 202, r.text
            return str(r.json()["sqid"])
        assert r.headers.get("retry-after"), "a 503 must say when to retry"
        retries.append(1)
        await asyncio.sleep(min(float(r.headers["retry-after"]), 2.0))
    raise AssertionError(f"{uri}: still 503 after 10 attempts")


async def test_200_concurrent_requests_over_20_folders_all_land(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        uris = [change(f"load-{i}", files=f"f{i % 20}/file{i}.py") for i in range(200)]
        started = time.monotonic()
        retries: list[int] = []
        sqids = await asyncio.gather(*(land_as_a_client_would(server, u, retries)
                                       for u in uris))
        assert len(set(sqids)) == 200
        final = await server.wait_all_terminal(sqids, timeout=240)
        elapsed = time.monotonic() - started
        statuses = list(final.values())
        assert statuses == ["landed"] * 200, {s: statuses.count(s) for s in set(statuses)}
        print(f"\n200 requests landed in {elapsed:.1f}s ({200 / elapsed:.1f} landed/s), "
              f"{len(retries)} POSTs retried after a 503")
        r = await server.client.get("/api/v1/queues")
        demo = next(q for q in r.json()["items"] if q["name"] == "demo")
        assert demo["counts"].get("landed") == 200
