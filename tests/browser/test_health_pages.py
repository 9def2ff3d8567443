"""Honest status in a real Chromium: a request whose build stage was dead-lettered (its
reconciler paused, as an operator would to look first) says so on its page and on the
queue page — the stage, the attempts, the last error, "needs an operator" with a link
to /admin — and its chance to land and ETA stop claiming what the planner alone would;
an unknown queue is a 404 page that says so and does not pretend to be reconnecting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.browser.conftest import PLAYWRIGHT_MISSING, screenshot
from tests.e2e.harness import Server, change, serve

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(90)]

TOKEN = "ops-bob:health-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder, admin_token=TOKEN, queue_max_attempts=3) as s:
        yield s


async def stuck_request(server: Server) -> str:
    """A request whose build trigger fails every attempt, left in build_dlq."""
    r = await server.client.post("/api/v1/admin/consumers/build_dlq/pause", headers=AUTH,
                                 json={"reason": "inspect before reconciling"})
    assert r.status_code == 200, r.text
    sqid = await server.land(change("stuck", files="stuck/a.py", fake="trigger-error"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = await server.client.get("/api/v1/admin/dlq/build_dlq/messages", headers=AUTH)
        if r.json()["items"]:
            return sqid
        await asyncio.sleep(0.1)
    raise AssertionError("no dead letter arrived")


async def test_a_dead_lettered_request_says_so_on_its_page_and_the_queue_page(
    server: Server, page: Any
) -> None:
    sqid = await stuck_request(server)
    n = sqid.rsplit("/", 1)[1]

    await page.goto(f"{server.base_url}/queues/demo/requests/{n}")
    health = page.locator("#next .health")
    await expect(health).to_have_attribute("data-health", "dead_lettered")
    await expect(health.locator(".badge")).to_have_text(
        "dead-lettered at build after 3 attempts — needs an operator")
    text = await health.inner_text()
    assert "its reconciler is paused" in text
    assert "ConnectionError" in text and "trigger" in text  # the last error, whole
    link = health.locator("a.admin-link")
    assert await link.get_attribute("href") == "/admin"
    await expect(page.locator("#next dd.p-land")).to_have_text("0 %")
    facts = await page.locator("#next dl.facts").inner_text()
    assert "100 %" not in facts
    assert "unknown" in facts  # no ETA
    assert "dead-lettered at build" in facts  # the basis says why
    await screenshot(page, "request-page-dead-lettered")

    await page.goto(f"{server.base_url}/queues/demo")
    card = page.locator(f'tbody.req[data-sqid="{sqid}"]')
    await expect(card.locator(".health")).to_have_attribute("data-health", "dead_lettered")
    card_text = await card.inner_text()
    assert "after 3 attempts" in card_text and "needs an operator" in card_text
    assert "ConnectionError" in card_text
    assert await card.locator("a.admin-link").get_attribute("href") == "/admin"
    await expect(card.locator(".p-land strong")).to_have_text("0 %")
    assert "100 %" not in card_text
    await card.get_by_role("button", name=f"Show the batch and paths of {sqid}").click()
    await expect(card.locator("article.batch .health")).to_have_attribute(
        "data-health", "dead_lettered")
    await screenshot(page, "queue-page-dead-lettered")

    # resumed, the reconciler ends it as error: the page follows live, the badge goes
    r = await server.client.post("/api/v1/admin/consumers/build_dlq/resume", headers=AUTH,
                                 json={})
    assert r.status_code == 200, r.text
    await page.goto(f"{server.base_url}/queues/demo/requests/{n}")
    await expect(page.locator("#next .removal")).to_have_attribute("data-kind", "dead_lettered")
    assert await page.locator("#next .health").count() == 0


async def test_an_unknown_queue_is_a_404_page_that_does_not_keep_retrying(
    server: Server, page: Any
) -> None:
    response = await page.goto(f"{server.base_url}/queues/nope")
    assert response.status == 404
    await page.wait_for_selector("body[data-not-found=true]")
    await expect(page.locator("#title")).to_have_text("Queue not found")
    assert await page.title() == "Queue not found · SubmitQueue"
    await expect(page.locator("#error [role=alert]")).to_contain_text(
        "queue 'nope' is not configured (configured: demo")
    await asyncio.sleep(1.5)  # a live stream would have failed and said so by now
    await expect(page.locator("#live")).to_have_text("not found")
    assert not await page.locator("#stages").is_visible()
    response = await page.goto(f"{server.base_url}/queues/nope/requests/1")
    assert response.status == 404
    await expect(page.locator("#title")).to_have_text("Queue not found")
    await asyncio.sleep(1.5)
    await expect(page.locator("#live")).to_have_text("not found")
