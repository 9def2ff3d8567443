"""A request's priority on the pages (real Chromium, the real app): a badge for
``hotfix`` and ``high`` on the queue page's row and beside the request page's status,
none for ``normal``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.browser.conftest import PLAYWRIGHT_MISSING
from tests.e2e.harness import Server, change, serve

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(90)]

TOKEN = "ops:s3cret"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder, admin_token=TOKEN) as s:
        yield s


async def land(server: Server, uri: str, priority: str) -> str:
    r = await server.client.post("/api/v1/queues/demo/requests",
                                 headers={"Authorization": f"Bearer {TOKEN}"},
                                 json={"change_uris": [uri], "priority": priority})
    assert r.status_code == 202, r.text
    return str(r.json()["sqid"])


async def test_priority_badges_on_the_queue_and_request_pages(
    server: Server, page: Any
) -> None:
    fix = await land(server, change("badge-fix", files="p/a.py", build_ms=8000), "hotfix")
    high = await land(server, change("badge-high", files="q/a.py", build_ms=8000), "high")
    plain = await land(server, change("badge-plain", files="r/a.py", build_ms=8000),
                       "normal")
    await page.goto(f"{server.base_url}/queues/demo")
    row = page.locator(f'tbody.req[data-sqid="{fix}"] td.name .badge-priority-hotfix')
    await expect(row).to_have_text("hotfix")
    await expect(page.locator(f'tbody.req[data-sqid="{high}"] .badge-priority-high')) \
        .to_have_text("high")
    await expect(page.locator(f'tbody.req[data-sqid="{plain}"] td.name')).to_be_visible()
    assert await page.locator(f'tbody.req[data-sqid="{plain}"] .badge-priority').count() == 0
    await page.goto(f"{server.base_url}/queues/demo/requests/{fix.rsplit('/', 1)[1]}")
    await expect(page.locator("#status .badge-priority-hotfix")).to_have_text("hotfix")
    for sqid in (fix, high, plain):
        await server.cancel(sqid)
