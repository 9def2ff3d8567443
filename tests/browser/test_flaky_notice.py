"""A build failure the queue suspects was flaky, on the request page (real Chromium, the
real app): a change whose first build fails (``build-flaky``) and whose retry passes
lands, and its page says that a build failed, that the same combination passed when
built again, and the history's words for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.browser.conftest import PLAYWRIGHT_MISSING
from tests.e2e.harness import Server, change, serve
from tests.e2e.test_speculation import RETRY_QUEUE

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(90)]

QUEUES = RETRY_QUEUE % 1


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    (folder / "queues.yaml").write_text(QUEUES)
    async with serve(url, folder) as s:
        yield s


async def test_a_change_that_landed_after_a_suspected_flake_says_so(
    server: Server, page: Any
) -> None:
    flaky = await server.land(change("flaky-page", files="f/a.py", fake="build-flaky"))
    steady = await server.land(change("steady-page", files="g/a.py"))
    assert await server.wait_terminal(flaky) == "landed"
    assert await server.wait_terminal(steady) == "landed"

    view = (await server.client.get(f"/api/v1/queues/demo/requests/"
                                    f"{flaky.rsplit('/', 1)[1]}/view")).json()
    [flake] = view["flakes"]
    assert flake["detail"].endswith(
        "1 earlier attempt failed and attempt 2 passed: the failure is suspected flaky")

    await page.goto(f"{server.base_url}/queues/demo/requests/{flaky.rsplit('/', 1)[1]}")
    note = page.locator("#next .flake-note")
    await expect(note).to_contain_text("suspected flaky build")
    await expect(note).to_contain_text("the same combination passed when it was built again")
    await expect(note.locator("li.flake-detail")).to_have_text(flake["detail"])
    await expect(page.locator("#landed-commits code")).to_have_count(1)

    await page.goto(f"{server.base_url}/queues/demo/requests/{steady.rsplit('/', 1)[1]}")
    await page.locator("#landed-commits code").wait_for()
    assert await page.locator(".flake-note").count() == 0
