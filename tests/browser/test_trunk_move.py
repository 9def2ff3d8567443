"""The queue page says when the target moved outside the queue (issue 18): hidden
before any move, then "main moved outside the queue at <sha>; N paths rebuilt"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from app.db.repos import epochs as epoch_repo
from tests.browser.conftest import PLAYWRIGHT_MISSING, screenshot
from tests.e2e.harness import Server, serve

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(90)]

TIP = "0bf471bbe68da01c49b29ce35abb88c9b05d3ea2"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder) as s:
        yield s


async def test_the_queue_page_shows_a_move_of_the_target_and_the_rebuilds(
    server: Server, page: Any
) -> None:
    await page.goto(f"{server.base_url}/queues/demo")
    await page.wait_for_selector("body[data-loaded]")
    await expect(page.locator("#moved")).to_be_hidden()
    async with server.runtime.db.write() as s:  # what mergesignal and speculate write
        epoch = await epoch_repo.record(s, queue="demo", tip_sha=TIP, batch_id="demo/batch/1",
                                        now_ms=1)
        await epoch_repo.add_rebuilt(s, queue="demo", epoch=epoch, count=3)
    await page.reload()
    notice = page.locator("#moved")
    await expect(notice).to_be_visible()
    await expect(notice).to_have_text(
        "the target moved outside the queue at 0bf471bbe68d; 3 paths rebuilt")
    assert await notice.get_attribute("title") == f"{TIP} (trunk epoch 1)"
    await screenshot(page, "queue-page-trunk-move")
