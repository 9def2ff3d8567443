"""The queue page with 50 requests in flight, in a real Chromium at 1280x800: one
compact row each (title, author, place, stage, elapsed, chance, ETA), every row on
the first screen, building apart from waiting for a build slot, a batch folded under
its row, the filter ("author:", "mine"), and the 24 h chart drawn as inline SVG.

Seeded fast: a few requests that land or fail at once (the chart's history), then 50
whose fake builds take ten minutes, so they stay in flight for the whole module.
``SQ_UPDATE_DOCS_IMAGES=1`` rewrites ``docs/img/queue-50.png`` (the visible screen)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest
import pytest_asyncio

from tests.browser.conftest import DOCS_IMG, PLAYWRIGHT_MISSING, screenshot
from tests.e2e.harness import Server, change, serve

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(120)]

IN_FLIGHT = 50
BUDGET = 4
AUTHORS = ["Ada Lovelace <ada@example.com>", "Grace Hopper <grace@example.com>",
           "Linus Torvalds <linus@example.com>", "Margaret Hamilton <margaret@example.com>",
           "Ken Thompson <ken@example.com>"]
TOPICS = ["retry budget", "login form", "cache keys", "build cache", "search index",
          "audit log", "rate limiter", "docs links", "CLI colours", "SSE reconnect"]
VERBS = ["Fix", "Add", "Speed up", "Refactor", "Document"]


def seeded(i: int, *, build_ms: int, fake: str = "") -> str:
    author = AUTHORS[i % len(AUTHORS)]
    title = f"{VERBS[i % len(VERBS)]} {TOPICS[i % len(TOPICS)]}"
    uri = change(f"topic-{i:02d}", files=f"area{i % 25}/f{i}.py", build_ms=build_ms, fake=fake)
    return f"{uri}&sq-author={quote(author)}&sq-title={quote(title)}"


async def until(check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.2)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    async with serve(url, folder) as s:
        history = [await s.land(seeded(100 + i, build_ms=100)) for i in range(3)]
        history.append(await s.land(seeded(103, build_ms=100, fake="build-fail")))
        await s.wait_all_terminal(history, timeout=60)
        for i in range(IN_FLIGHT):
            await s.land(seeded(i, build_ms=600_000))

        async def all_speculating() -> bool:
            r = await s.client.get("/api/v1/queues/demo/overview")
            o = r.json()
            rows = [x for g in o["stages"] for x in g["requests"]]
            return len(rows) == IN_FLIGHT and all(x["stage"] == "speculating" for x in rows) \
                and o["slots"]["in_use"] == BUDGET
        await until(all_speculating)
        yield s


async def test_fifty_in_flight_fit_one_screen_as_compact_rows(
    server: Server, browser: Any
) -> None:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"{server.base_url}/queues/demo")
        rows = page.locator("#stages tbody.req")
        await expect(rows).to_have_count(IN_FLIGHT)
        await page.wait_for_selector("#live[data-state=live]")

        # every row on the first screen, none taller than a compact line
        # (measured in one step: a live update may redraw the list between two calls)
        boxes = await page.evaluate("""Array.from(document.querySelectorAll(
            '#stages tbody.req')).map((e) => e.getBoundingClientRect().toJSON())""")
        assert len(boxes) == IN_FLIGHT
        heights = [b["height"] for b in boxes]
        bottom = max(b["bottom"] for b in boxes)
        print(f"{IN_FLIGHT} rows of {min(heights):.1f}-{max(heights):.1f} px; the lowest "
              f"ends at {bottom:.0f} px of 800")
        assert max(heights) <= 24, heights
        assert bottom <= 800, f"the lowest row ends at {bottom}px, below the 800px screen"
        assert await page.evaluate("document.documentElement.scrollWidth") <= 1280

        # building apart from waiting for a slot, with the budget in words
        building = page.locator('#stages tbody.req[data-activity="building"]')
        waiting = page.locator('#stages tbody.req[data-activity="waiting_for_slot"]')
        await expect(building).to_have_count(BUDGET)
        await expect(waiting).to_have_count(IN_FLIGHT - BUDGET)
        heads = await page.locator("#stages tbody.group th").all_inner_texts()
        assert any(t.startswith(f"Building ({BUDGET}/{BUDGET} build slots in use)") for t in heads)
        assert any(f"Waiting for a build slot ({BUDGET}/{BUDGET} in use)" in t for t in heads)
        await expect(page.locator("#slots")).to_contain_text(
            f"{IN_FLIGHT} in flight · {BUDGET} building, {IN_FLIGHT - BUDGET} waiting for a "
            f"build slot ({BUDGET}/{BUDGET} in use)")

        # one row: place, request, title and branch, author, stage, elapsed, chance, ETA
        first = page.locator('#stages tbody.req[data-sqid="demo/5"]')
        cells = await first.locator("tr.row td").all_inner_texts()
        assert cells[0] == "1" and cells[1] == "demo/5"
        assert cells[2].startswith("Fix retry budget") and "topic-00" in cells[2]
        assert cells[3] == "Ada Lovelace"
        assert cells[4] in ("building", "waiting")
        assert cells[5].endswith(("s", "min")) and cells[6] == "~90 %"  # the prior, marked
        assert "percent-encoded" not in cells[2] and "%2F" not in "".join(cells)
        await screenshot(page, "queue-50")
        if os.environ.get("SQ_UPDATE_DOCS_IMAGES") == "1":
            DOCS_IMG.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(DOCS_IMG / "queue-50.png"), full_page=False)

        # the 24 h chart: inline SVG with the landed and failed history
        chart = page.locator("#chart svg.throughput")
        assert await chart.get_attribute("data-landed") == "3"
        assert "3 landed, 1 failed" in (await chart.get_attribute("aria-label") or "")
        assert await page.locator("#chart rect.bar-failed").count() == 1

        # the batch and its paths fold out under the row, and stay open across updates
        await first.get_by_role("button", name="Show the batch and paths of demo/5").click()
        fold = first.locator("tr.fold")
        await expect(fold.locator("article.batch table.paths")).to_be_visible()
        await expect(fold).to_contain_text("on the target branch alone")
        await page.evaluate("window.__same = 1")
        await server.land(seeded(60, build_ms=600_000))  # a live update redraws the list
        await expect(rows).to_have_count(IN_FLIGHT + 1)
        await expect(fold.locator("table.paths")).to_be_visible()
        await first.get_by_role("button", name="Hide the batch and paths of demo/5").click()
        await expect(first.locator("tr.fold")).to_have_count(0)

        # the filter: words, author:, and "mine" by the name given
        await page.get_by_label("Filter").fill("author:grace")
        grace = 10  # i % 5 == 1 for i < 50 (the 51st, i = 60, is Ada's)
        await expect(rows).to_have_count(grace)
        await expect(page.locator("#shown")).to_have_text(f"{grace} of {IN_FLIGHT + 1} shown")
        assert "q=author%3Agrace" in page.url
        await page.get_by_label("Filter").fill("cache keys")
        await expect(rows).to_have_count(5)  # topic 2 of 10: i = 2, 12, 22, 32, 42
        await page.get_by_label("Filter").fill("")
        await page.get_by_label("Mine").check()
        await expect(page.locator("#stages")).to_contain_text("sign in, or give your name")
        await page.get_by_label("I am").fill("ken@example.com")
        await expect(rows).to_have_count(10)  # i % 5 == 4
        for author in await rows.locator("td.author").all_inner_texts():
            assert author == "Ken Thompson"
        assert await page.evaluate("window.__same") == 1  # never reloaded
        assert not errors, errors
    finally:
        await context.close()


async def test_the_overview_api_says_who_and_what_each_row_is(server: Server) -> None:
    o = (await server.client.get("/api/v1/queues/demo/overview")).json()
    rows = [x for g in o["stages"] for x in g["requests"]]
    assert [r["position"] for r in rows] == list(range(1, len(rows) + 1))
    r = next(x for x in rows if x["sqid"] == "demo/5")
    assert (r["title"], r["branch"], r["author"], r["author_email"]) == (
        "Fix retry budget", "topic-00", "Ada Lovelace", "ada@example.com")
    assert r["forecast"]["p_land_from"] == "prior"
    texts = {x["activity_text"] for x in rows if x["activity"] == "waiting_for_slot"}
    assert texts == {f"waiting for a build slot ({BUDGET}/{BUDGET} in use)"}
    assert o["slots"] == {"budget": BUDGET, "in_use": BUDGET, "building": BUDGET,
                          "waiting_for_slot": len(rows) - BUDGET,
                          "text": f"{BUDGET}/{BUDGET} in use"}
    t = o["throughput"]
    assert (t["landed"], t["failed"], len(t["buckets"])) == (3, 1, 24)
    assert t["mean_wait_ms"] is not None and t["mean_wait_ms"] > 0
    landed = next(x for x in o["recent"] if x["status"] == "landed")
    assert landed["title"] and landed["landed_commits"]


async def test_search_finds_a_batchs_requests(server: Server) -> None:
    o = (await server.client.get("/api/v1/queues/demo/overview")).json()
    b = o["batches"][0]
    r = (await server.client.get("/api/v1/search", params={"q": b["id"]})).json()
    assert r["kind"] == "batch"
    assert [x["sqid"] for x in r["items"]] == b["requests"]
    assert r["items"][0]["page"] == f"/queues/demo/requests/{b['requests'][0].split('/')[1]}"
    none = (await server.client.get("/api/v1/search", params={"q": "demo/batch/999"})).json()
    assert none["items"] == []
