"""The freeze banner in a real Chromium: a frozen queue says so, with its reason, on
the queue page and on a waiting request's page; unfrozen, the banner is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.browser.conftest import PLAYWRIGHT_MISSING
from tests.e2e.harness import Server, change, serve

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(60)]

AUTH = {"Authorization": "Bearer ops:s3cret"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder, admin_token="ops:s3cret", freeze_recheck_ms=100) as s:
        yield s


async def test_a_frozen_queue_shows_a_banner_on_its_pages(server: Server, page: Any) -> None:
    r = await server.client.post("/api/v1/queues/demo/freeze", headers=AUTH,
                                 json={"reason": "release 4.2 branch cut"})
    assert r.status_code == 200, r.text
    sqid = await server.land(change("frozen-page", files="fp/a.py"))
    await server.wait_status(sqid, {"speculated"})
    await page.goto(f"{server.base_url}/queues/demo")
    banner = page.locator("#freeze-banner")
    await expect(banner).to_contain_text("frozen: release 4.2 branch cut (manual by ops")
    await expect(banner).to_contain_text("built, but nothing lands")
    await page.goto(f"{server.base_url}/queues/demo/requests/{sqid.rsplit('/', 1)[1]}")
    await expect(page.locator("#freeze-banner")).to_contain_text("release 4.2 branch cut")
    r = await server.client.post("/api/v1/queues/demo/unfreeze", headers=AUTH)
    assert r.status_code == 200, r.text
    assert await server.wait_terminal(sqid, timeout=10) == "landed"
    await page.goto(f"{server.base_url}/queues/demo")
    await page.wait_for_selector("body[data-loaded]")
    await expect(page.locator("#freeze-banner")).to_have_count(0)


async def test_the_admin_page_freezes_and_unfreezes_a_queue(server: Server, page: Any) -> None:
    await page.goto(f"{server.base_url}/admin")
    await page.fill("#token", "ops:s3cret")
    await page.click("#login button[type=submit]")
    form = page.locator('form.freeze-form[data-queue="demo"]')
    await form.locator("input[name=reason]").fill("incident INC-7")
    await form.locator("input[type=checkbox]").uncheck()
    await form.locator("button[type=submit]").click()
    await expect(page.locator("#action-result")).to_contain_text(
        "demo: frozen: incident INC-7 (manual by ops)")
    got = (await server.client.get("/api/v1/queues/demo/freeze")).json()["freeze"]
    assert (got["frozen"], got["allow_builds"], got["by"]) == (True, False, "ops")
    await expect(page.locator('li[data-queue="demo"]')).to_contain_text("incident INC-7")
    await page.locator('form.freeze-form[data-queue="demo"] button.unfreeze').click()
    await expect(page.locator("#action-result")).to_contain_text("demo: not frozen.")
    assert not (await server.client.get("/api/v1/queues/demo/freeze")).json()["freeze"]["frozen"]
    await expect(page.locator("table.audit")).to_contain_text("unfreeze")
