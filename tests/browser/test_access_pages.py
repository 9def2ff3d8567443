"""The pages under SQ_AUTH=required in a real Chromium: a request's cancel button is
offered only to a token that may cancel it (its submitter's with ``cancel``, or one with
``cancel:any``), the cancel goes through with the tab's token and its history names who
cancelled; without a token the page offers a sign-in and the server refuses a cancel
sent anyway. With SQ_AUTH_READS=required a page shows nothing until a token is given,
then reads and follows the queue live with it (the stream is read with fetch)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.browser.conftest import PLAYWRIGHT_MISSING, screenshot
from tests.e2e.harness import Server, change, serve

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(90)]

ADMIN = {"Authorization": "Bearer ops:browser-admin-secret"}


async def token(server: Server, label: str, *scopes: str) -> str:
    r = await server.client.post("/api/v1/admin/tokens", headers=ADMIN,
                                 json={"label": label, "scopes": list(scopes)})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


async def land_as(server: Server, secret: str, uri: str) -> str:
    r = await server.client.post("/api/v1/queues/demo/requests", json={"change_uris": [uri]},
                                 headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 202, r.text
    return str(r.json()["sqid"])


async def sign_in(page: Any, secret: str) -> None:
    await page.locator("#signin-open").click()
    await page.get_by_label("API token", exact=True).fill(secret)
    await page.get_by_role("button", name="Use this token").click()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder, auth="required", admin_token=ADMIN["Authorization"][7:]) as s:
        yield s


async def test_only_a_token_that_may_cancel_gets_the_button_and_the_cancel_names_it(
    server: Server, page: Any
) -> None:
    alice = await token(server, "alice", "land", "cancel")
    bob = await token(server, "bob", "land", "cancel")
    sqid = await land_as(server, alice, change("long", files="long/a.py", build_ms=60_000))
    n = sqid.rsplit("/", 1)[1]
    await page.goto(f"{server.base_url}/queues/demo/requests/{n}")
    await page.wait_for_selector("body[data-loaded]")
    await expect(page.locator("#submitted")).to_contain_text("Submitted by alice")
    await expect(page.locator("#cancel-section")).to_be_visible()
    # no token: no cancel button, a way to sign in, and the server refuses one sent anyway
    await expect(page.locator("#cancel-why")).to_contain_text("needs an API token")
    await expect(page.locator("#cancel")).to_be_hidden()
    await expect(page.locator("#cancel-signin")).to_be_visible()
    refused = await page.evaluate(
        """async (url) => { const r = await fetch(url, {method: "POST",
             headers: {"Content-Type": "application/json"}, body: '{"reason": "x"}'});
           return [r.status, (await r.json()).error.code]; }""",
        f"/api/v1/queues/demo/requests/{n}/cancel")
    assert refused == [401, "unauthorized"]

    # a wrong token is not kept
    await sign_in(page, "sq_000000000000_" + "x" * 43)
    await expect(page.locator("#signin-error")).to_contain_text("Not signed in")
    assert await page.evaluate("sessionStorage.getItem('submitqueue.token')") is None
    await page.get_by_role("button", name="Close").click()

    # bob may cancel only his own requests
    await sign_in(page, bob)
    await expect(page.locator("#signin-who")).to_contain_text("bob")
    await expect(page.locator("#cancel-why")).to_contain_text("submitted by alice")
    await expect(page.locator("#cancel")).to_be_hidden()
    await expect(page.locator("#live")).to_have_attribute("data-state", "live")

    # alice may: the button is there and the cancel goes through with her token
    await page.locator("#signout").click()
    await expect(page.locator("#signin-open")).to_be_visible()
    await sign_in(page, alice)
    await expect(page.locator("#cancel")).to_be_visible()
    await screenshot(page, "request-page-signed-in")
    await page.locator("#cancel").click()
    await page.locator("#cancel-reason").fill("not needed after all")
    await page.locator("#cancel-confirm").click()
    await expect(page.locator("#cancel-result")).to_contain_text("Cancel requested")
    await page.wait_for_selector("body[data-status=cancelled]", timeout=30_000)
    await expect(page.locator(".removal")).to_contain_text("Cancelled by alice")
    history = await server.history(sqid)
    cancelling = [e for e in history if e.get("status") == "cancelling"]
    assert cancelling and cancelling[-1]["metadata"]["actor"] == "alice"


async def test_another_actors_request_needs_cancel_any(server: Server, page: Any) -> None:
    alice = await token(server, "alice2", "land")
    ops = await token(server, "oncall", "cancel:any")
    sqid = await land_as(server, alice, change("long2", files="long/b.py", build_ms=60_000))
    await page.goto(f"{server.base_url}/queues/demo/requests/{sqid.rsplit('/', 1)[1]}")
    await page.wait_for_selector("body[data-loaded]")
    await sign_in(page, ops)
    await expect(page.locator("#cancel")).to_be_visible()
    await page.locator("#cancel").click()
    await page.locator("#cancel-confirm").click()
    await page.wait_for_selector("body[data-status=cancelled]", timeout=30_000)
    await expect(page.locator(".removal")).to_contain_text("Cancelled by oncall")


async def test_reads_required_shows_nothing_without_a_token_then_follows_live(
    sqlite_db_factory: Any, page: Any
) -> None:
    url, folder = sqlite_db_factory()
    async with serve(url, folder, auth="required", auth_reads="required",
                     admin_token=ADMIN["Authorization"][7:]) as server:
        reader = await token(server, "viewer", "read")
        lander = await token(server, "lander", "land")
        await page.goto(f"{server.base_url}/queues/demo")
        await expect(page.locator("#error [role=alert]")).to_contain_text("Sign in")
        assert await page.locator("#stages tbody.req").count() == 0
        await sign_in(page, reader)
        await expect(page.locator("#live")).to_have_attribute("data-state", "live")
        await expect(page.locator("#error")).to_be_empty()
        sqid = await land_as(server, lander, change("seen", files="seen/a.py", build_ms=300))
        # the event stream (fetch with the token) brings it in without a reload
        await page.wait_for_selector(f'#recent tr[data-sqid="{sqid}"][data-status="landed"]',
                                     timeout=30_000)
        await page.goto("about:blank")  # ends the stream, so the server can stop
