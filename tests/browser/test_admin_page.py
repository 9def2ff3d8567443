"""The admin page in a real Chromium: sign in with the token (kept in sessionStorage
only), see a dead letter, reconcile it, see the next one arrive by itself and discard
it with a reason, read the audit log; the request it was about then shows why it was
removed."""

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

TOKEN = "ops-alice:s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder, admin_token=TOKEN, queue_max_attempts=2) as s:
        yield s


async def dead_letter(server: Server) -> tuple[str, dict[str, Any]]:
    """A request whose build trigger keeps failing, dead-lettered and left in build_dlq
    (its reconciler paused, as an operator would to look first)."""
    r = await server.client.post("/api/v1/admin/consumers/build_dlq/pause", headers=AUTH,
                                 json={"reason": "inspect before reconciling"})
    assert r.status_code == 200, r.text
    sqid = await server.land(change("flaky", files="flaky/a.py", fake="trigger-error"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = await server.client.get("/api/v1/admin/dlq/build_dlq/messages", headers=AUTH)
        items = r.json()["items"]
        if items:
            return sqid, items[0]
        await asyncio.sleep(0.1)
    raise AssertionError("no dead letter arrived")


async def test_sign_in_drain_a_dead_letter_and_read_the_audit(server: Server, page: Any) -> None:
    sqid, message = await dead_letter(server)
    await page.goto(f"{server.base_url}/admin")

    await page.get_by_label("Admin token").fill("ops-alice:wrong")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#error [role=alert]")).to_contain_text("wrong admin token")
    assert await page.evaluate("sessionStorage.length") == 0

    await page.get_by_label("Admin token").fill(TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    item = page.locator(f'li.dlq-message[data-id="{message["id"]}"]')
    await item.wait_for()
    assert await page.locator("#login").is_hidden()
    assert await page.evaluate("localStorage.length") == 0
    assert await page.evaluate("Object.values(sessionStorage)") == [TOKEN]
    text = await item.inner_text()
    assert "from build" in text and "ConnectionError" in text
    # the batch it names links to its request
    n = sqid.rsplit("/", 1)[1]
    await expect(item.locator(".entity-requests a")).to_have_attribute(
        "href", f"/queues/demo/requests/{n}")
    await expect(item.locator(".entity-requests")).to_have_text(f" (request {sqid})")
    assert "its reconciler is paused" in await page.locator(
        'section[data-topic="build_dlq"] h3').inner_text()
    await screenshot(page, "admin-page")

    # requeue and discard need a reason: the browser will not submit without one
    action = page.get_by_label(f"Action for message {message['id']}")
    await action.select_option("discard")
    await item.get_by_role("button", name="Apply").click()
    assert await page.evaluate(
        "document.querySelector('.dlq-action input[name=reason]').validity.valueMissing")
    assert (await server.client.get("/api/v1/admin/dlq/build_dlq/messages",
                                    headers=AUTH)).json()["items"] != []

    await action.select_option("reconcile")
    await item.get_by_label("Reason").fill("trigger service was down; fail it")
    await item.get_by_role("button", name="Apply").click()
    result = page.locator("#action-result")
    await page.locator("#action-result:has-text('reconciled')").wait_for()
    assert f"build_dlq #{message['id']}: reconciled" in await result.inner_text()
    await page.locator("#dlq:has-text('No dead letters')").wait_for()
    audit = page.locator('#audit tr[data-action="drain:reconcile"]')
    await audit.wait_for()
    row = await audit.inner_text()
    assert "ops-alice" in row and "trigger service was down" in row and "reconciled: 1" in row
    await screenshot(page, "admin-page-drained")

    # a new dead letter shows up by itself (the page refreshes) and is discarded
    await server.land(change("flaky2", files="flaky2/a.py", fake="trigger-error"))
    fresh = page.locator("li.dlq-message")
    await fresh.wait_for(timeout=20_000)
    fresh_id = await fresh.get_attribute("data-id")
    await page.get_by_label(f"Action for message {fresh_id}").select_option("discard")
    await fresh.get_by_label("Reason").fill("known flaky trigger; nothing to redo")
    await fresh.get_by_role("button", name="Apply").click()
    await page.locator(f"#action-result:has-text('#{fresh_id}: discarded')").wait_for()
    await page.locator('#audit tr[data-action="drain:discard"]').wait_for()

    # the request it was about ends in error, and its page says where and why
    assert await server.wait_terminal(sqid) == "error"
    await page.goto(f"{server.base_url}/queues/demo/requests/{sqid.rsplit('/', 1)[1]}")
    removal = page.locator(".removal[data-kind=dead_lettered]")
    await removal.wait_for()
    assert "Dead-lettered at stage build" in await removal.inner_text()
    assert await removal.get_by_role("link").get_attribute("href") == "/admin"

    # the token survives a reload of the tab, and signing out forgets it
    await page.goto(f"{server.base_url}/admin")
    await page.locator("#console:not([hidden])").wait_for()
    await page.get_by_role("button", name="Sign out").click()
    assert await page.evaluate("sessionStorage.length") == 0
    assert await page.locator("#login").is_visible()


async def test_drain_all_of_a_topic_and_resume_its_paused_reconciler(
    server: Server, page: Any
) -> None:
    r = await server.client.post("/api/v1/admin/consumers/build_dlq/pause", headers=AUTH,
                                 json={"reason": "look before draining"})
    assert r.status_code == 200, r.text
    for name in ("bulk1", "bulk2"):
        await server.land(change(name, files=f"{name}/a.py", fake="trigger-error"))
    deadline = time.monotonic() + 30
    items: list[Any] = []
    while time.monotonic() < deadline and len(items) < 2:
        items = (await server.client.get("/api/v1/admin/dlq/build_dlq/messages",
                                         headers=AUTH)).json()["items"]
        await asyncio.sleep(0.1)
    assert len(items) >= 2, items

    await page.goto(f"{server.base_url}/admin")
    await page.get_by_label("Admin token").fill(TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    bulk = page.locator('form.dlq-all[data-topic="build_dlq"]')
    await bulk.wait_for()
    await bulk.get_by_role("combobox").select_option("discard")
    await bulk.get_by_role("button", name="Apply to all").click()  # no reason: refused
    assert await bulk.evaluate("f => f.querySelector('input[name=reason]').validity.valueMissing")
    await bulk.get_by_label("Reason").fill("trigger outage; every one of them is moot")
    await bulk.get_by_role("button", name="Apply to all").click()
    await page.locator(f"#action-result:has-text('discarded: {len(items)}')").wait_for()
    await page.locator("#dlq:has-text('No dead letters')").wait_for()

    resume = page.locator('button.consumer-toggle[data-topic="build_dlq"][data-action="resume"]')
    await resume.click()
    await page.locator("#action-result:has-text('resumed')").wait_for()
    await page.locator(
        'button.consumer-toggle[data-topic="build_dlq"][data-action="pause"]').wait_for()
    topics = (await server.client.get("/api/v1/admin/topics", headers=AUTH)).json()["topics"]
    (dlq,) = [t for t in topics if t["topic"] == "build_dlq"]
    assert not any(g["paused"] for g in dlq["groups"])
    await page.locator('#audit tr[data-action="resume"]').wait_for()
    assert "ops-alice" in await page.locator('#audit tr[data-action="resume"]').inner_text()
