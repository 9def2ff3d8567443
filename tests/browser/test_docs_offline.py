"""``/docs`` and ``/redoc`` render in a browser that can reach nothing but the server
(every other request is aborted): their assets come from this origin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.browser.conftest import PLAYWRIGHT_MISSING
from tests.e2e.harness import Server, serve

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(90)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder) as s:
        yield s


async def offline(page: Any, base_url: str) -> list[str]:
    """Abort every request that is not to ``base_url``; returns the aborted URLs."""
    blocked: list[str] = []

    async def route(r: Any) -> None:
        if r.request.url.startswith(base_url):
            await r.continue_()
        else:
            blocked.append(r.request.url)
            await r.abort()

    await page.route("**/*", route)
    return blocked


async def test_swagger_ui_renders_the_operations_with_the_network_blocked(
    server: Server, page: Any
) -> None:
    blocked = await offline(page, server.base_url)
    response = await page.goto(f"{server.base_url}/docs")
    assert response.status == 200
    await expect(page.locator(".swagger-ui .info .title")).to_contain_text("SubmitQueue")
    land = page.locator(".opblock-summary-path", has_text="/api/v1/queues/{queue}/requests")
    await expect(land.first).to_be_visible()
    assert await page.locator(".opblock").count() >= 10
    assert blocked == [], f"/docs asked for off-origin assets: {blocked}"


async def test_redoc_renders_the_operations_with_the_network_blocked(
    server: Server, page: Any
) -> None:
    blocked = await offline(page, server.base_url)
    response = await page.goto(f"{server.base_url}/redoc")
    assert response.status == 200
    await expect(page.locator("h1").first).to_contain_text("SubmitQueue")
    await expect(page.get_by_text("/api/v1/queues/{queue}/requests").first).to_be_attached()
    assert blocked == [], f"/redoc asked for off-origin assets: {blocked}"
