"""The queue, request and index pages in a real Chromium against the real app: live
stage changes without a reload, a failed request's reason and evidence, cancel from
the page, search, escaping, phone width and the pages' security headers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from app.extensions.merger.fake import landed_sha
from tests.browser.conftest import PLAYWRIGHT_MISSING, screenshot
from tests.e2e.harness import Server, change, serve

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(90)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder) as s:
        yield s


def sel_in_stage(stage: str, sqid: str) -> str:
    return f'#stages tbody.req[data-stage="{stage}"][data-sqid="{sqid}"]'


async def test_queue_page_follows_requests_stage_by_stage_without_reloading(
    server: Server, page: Any
) -> None:
    warmup = await server.land(change("warmup", files="warm/a.py", build_ms=1500))
    await server.wait_terminal(warmup)  # the queue's history: what the ETAs are made of
    await page.goto(f"{server.base_url}/queues/demo")
    await page.wait_for_selector("#live[data-state=live]")
    await page.evaluate("window.__sameDocument = 'yes'")

    slow = await server.land(change("slow", files="lib/a.py", build_ms=6000))
    await page.wait_for_selector(sel_in_stage("speculating", slow))
    card = page.locator(sel_in_stage("speculating", slow))
    await expect(card.locator("td.chance")).to_have_text("~90 %")  # the prior, marked so
    assert "prior" in (await card.locator(".p-land").get_attribute("title") or "")
    # from the warm-up's 1.5 s build: "in ~…", or "unknown" once a build outlasts it
    assert re.fullmatch(r"in ~[0-9.]+ (ms|s|min)|in < 1 s|any moment|unknown",
                        await card.locator("td.eta-cell").inner_text())
    slow_link = f"/queues/demo/requests/{slow.rsplit('/', 1)[1]}"
    await page.locator(f'#stages a[href="{slow_link}"]').focus()  # a keyboard user's place
    behind = await server.land(change("behind", files="lib/b.py", build_ms=1500))
    other = await server.land(change("other", files="docs/x.md", build_ms=4000))
    await page.wait_for_selector(sel_in_stage("speculating", behind))
    await page.wait_for_selector(sel_in_stage("speculating", other))
    # the list was redrawn by live updates, and the focus stayed on the same link
    assert await page.evaluate("document.activeElement.getAttribute('href')") == slow_link

    await page.get_by_role("button", name=f"Show the batch and paths of {behind}").click()
    batch = page.locator(f'tbody.req[data-sqid="{behind}"] tr.fold article.batch')
    await batch.locator("table.paths tbody tr").first.wait_for()
    await expect(batch.locator("table.paths")).to_contain_text("on top of demo/batch/2")
    await expect(batch.locator(".deps")).to_contain_text("demo/batch/2")
    await screenshot(page, "queue-page", docs=True)

    for sqid in (slow, behind, other):
        await page.wait_for_selector(f'#recent tr[data-sqid="{sqid}"][data-status="landed"]',
                                     timeout=30_000)
    assert await page.locator(sel_in_stage("speculating", slow)).count() == 0
    assert await page.evaluate("window.__sameDocument") == "yes"  # never reloaded
    landed = await page.locator('#counts dd[data-count="landed"]').inner_text()
    assert int(landed) >= 4


async def test_a_failed_request_shows_its_typed_reason_and_the_failed_build(
    server: Server, page: Any
) -> None:
    bad = await server.land(change("bad", files="fail/a.py", fake="build-fail", build_ms=300))
    assert await server.wait_terminal(bad) == "error"
    n = bad.rsplit("/", 1)[1]
    await page.goto(f"{server.base_url}/queues/demo/requests/{n}")
    removal = page.locator(".removal[data-kind=build_failed]")
    await removal.wait_for()
    text = await removal.inner_text()
    assert "Its build failed when tested on the target branch alone, so it was taken out " \
        "of the queue." in text
    assert "path " not in text and "speculation" not in text  # no planner words
    build_id = await page.locator("table.paths .build-id").first.inner_text()
    assert build_id.startswith("fake-") and build_id in text  # the evidence names the build
    assert "its runner published no log" in text  # a fake build keeps none: no excerpt
    assert await page.locator("#next figure.log-excerpt").count() == 0
    await expect(page.locator("#next .next-steps li").first).to_contain_text(
        "fix the change, push a new commit and submit it again")
    assert await page.locator("#next-h").inner_text() == "Removed: its build failed"
    trail = await page.locator("#trail").inner_text()
    assert "speculating [building" in trail and "error" in trail
    assert await page.locator("#cancel-section").is_hidden()
    await screenshot(page, "request-page-failed")


async def test_a_landed_request_shows_the_commits_it_landed_as(
    server: Server, page: Any
) -> None:
    uri = change("shown", files="shown/a.py")
    sqid = await server.land(uri)
    assert await server.wait_terminal(sqid) == "landed"
    n = sqid.rsplit("/", 1)[1]
    await page.goto(f"{server.base_url}/queues/demo/requests/{n}")
    await page.locator("#landed-commits code").wait_for()
    assert await page.locator("#next-h").inner_text() == "Landed"
    assert await page.locator("#landed-commits code").all_inner_texts() == [landed_sha(uri)]
    assert await page.locator("#changes code.landed-as").inner_text() == landed_sha(uri)


async def test_cancel_from_the_request_page(server: Server, page: Any) -> None:
    ahead = await server.land(change("ahead", files="long/a.py", build_ms=20_000))
    await server.wait_status(ahead, {"speculating"})
    sqid = await server.land(change("long", files="long/b.py", build_ms=20_000))
    await server.wait_status(sqid, {"speculating"})
    n = sqid.rsplit("/", 1)[1]
    await page.goto(f"{server.base_url}/queues/demo/requests/{n}")
    await page.wait_for_selector("#live[data-state=live]")
    await page.locator(".p-land").wait_for()
    waits = page.locator(".waits")
    await expect(waits).to_contain_text(ahead)  # what it waits on, with its request
    await page.locator("table.paths tbody tr .build-id").first.wait_for()
    await screenshot(page, "request-page", docs=True)

    await page.get_by_role("button", name="Cancel this request…").click()
    dialog = page.locator("#cancel-dialog")
    assert await dialog.is_visible()
    await page.get_by_role("button", name="Keep it").click()  # first thought better of it
    assert not await dialog.is_visible()
    assert (await server.summary(sqid))["status"] == "speculating"

    await page.get_by_role("button", name="Cancel this request…").click()
    await page.get_by_label("Reason (optional, kept in its history)").fill("wrong branch")
    await page.get_by_role("button", name="Cancel the request").click()
    await page.wait_for_selector("body[data-status=cancelled]", timeout=30_000)
    removal = await page.locator(".removal[data-kind=cancelled]").inner_text()
    assert "reason given: wrong branch" in removal
    assert (await server.summary(sqid))["status"] == "cancelled"
    assert (await server.cancel(ahead)).status_code == 202  # leave the queue clean


async def test_a_script_in_a_change_uri_is_shown_as_text(server: Server, page: Any) -> None:
    payload = "<script>window.__xss=1</script><img src=x onerror=window.__xss=2>"
    uri = change("xss", files=f"x/{payload}", build_ms=10_000)
    sqid = await server.land(uri)
    alerts: list[str] = []
    page.on("dialog", lambda d: alerts.append(d.message))
    await page.goto(f"{server.base_url}/queues/demo")
    card = page.locator(f'tbody.req[data-sqid="{sqid}"]')
    await card.wait_for()
    await card.get_by_role("button", name=f"Show the batch and paths of {sqid}").click()
    assert payload in await card.locator("code.uri").inner_text()
    n = sqid.rsplit("/", 1)[1]
    await page.goto(f"{server.base_url}/queues/demo/requests/{n}")
    await page.locator("#changes code.uri").wait_for()
    assert await page.locator("#changes code.uri").inner_text() == uri
    assert await page.evaluate("document.querySelectorAll('main script, main img').length") == 0
    assert await page.evaluate("window.__xss") is None
    assert alerts == []


async def test_search_by_sqid_and_by_change_uri_from_any_page(server: Server, page: Any) -> None:
    uri = change("findme", files="find/a.py")
    sqid = await server.land(uri)
    await server.wait_terminal(sqid)
    n = sqid.rsplit("/", 1)[1]
    await page.goto(f"{server.base_url}/")
    await page.locator("article.queue-card").first.wait_for()
    await screenshot(page, "index-page")
    search = page.get_by_label("Find a request")
    await search.fill(sqid)
    await search.press("Enter")
    await page.wait_for_url(f"**/queues/demo/requests/{n}")
    await page.locator("#title:text-is('Request " + sqid + "')").wait_for()

    await page.goto(f"{server.base_url}/admin")
    await page.get_by_label("Find a request").fill(uri)
    await page.get_by_role("button", name="Search").click()
    await page.wait_for_url(f"**/queues/demo/requests/{n}")

    await page.get_by_label("Find a request").fill("demo/999999")
    await page.get_by_role("button", name="Search").click()
    await expect(page.locator("#search-results")).to_contain_text(
        "No request matches demo/999999")
    await page.get_by_label("Find a request").fill("not a thing")
    await page.get_by_role("button", name="Search").click()
    await expect(page.locator("#search-results [role=alert]")).to_contain_text(
        "neither a sqid")


async def test_pages_are_readable_at_phone_width_and_keyboard_usable(
    server: Server, browser: Any
) -> None:
    context = await browser.new_context(viewport={"width": 375, "height": 812},
                                        is_mobile=True, has_touch=True)
    try:
        p = await context.new_page()
        sqid = await server.land(change("phone", files="phone/a.py", build_ms=3000))
        for path, name in (("/queues/demo", "queue-page-phone"),
                           (f"/queues/demo/requests/{sqid.rsplit('/', 1)[1]}",
                            "request-page-phone")):
            await p.goto(server.base_url + path)
            await p.wait_for_selector("body[data-loaded]")
            overflow = await p.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"{path} scrolls sideways by {overflow}px at 375px"
            await screenshot(p, name)
        # keyboard: the skip link comes first and moves focus into the content
        await p.keyboard.press("Tab")
        assert await p.evaluate("document.activeElement.textContent") == "Skip to content"
        await p.keyboard.press("Enter")
        assert await p.evaluate("location.hash") == "#main"
    finally:
        await context.close()


async def test_pages_carry_security_headers_and_unknown_things_say_so(
    server: Server, page: Any
) -> None:
    response = await page.goto(f"{server.base_url}/queues/nope")
    assert response.status == 404  # the page still renders and says why
    headers = response.headers
    assert "default-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    await expect(page.locator("#error [role=alert]")).to_contain_text(
        "queue 'nope' is not configured")
    assert (await page.goto(f"{server.base_url}/queues/demo")).status == 200
    assert (await page.goto(f"{server.base_url}/queues/nope/requests/1")).status == 404
    js = await page.request.get(f"{server.base_url}/static/js/lib.js")
    assert js.headers["content-type"].startswith(("text/javascript", "application/javascript"))
    assert "default-src 'self'" in js.headers["content-security-policy"]
