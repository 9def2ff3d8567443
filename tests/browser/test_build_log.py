"""A real failed build in the browser: a queue on a real git sandbox whose builds run
its ``sq_test.py`` (the command runner); a change that adds a ``BROKEN`` file ends in
error, and its page names the failed build and links to that build's log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.browser.conftest import PLAYWRIGHT_MISSING, screenshot
from tests.e2e.harness import Server, serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues

expect = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING).expect
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(90)]

QUEUES = queues_file(git_queue(
    repository="./sandbox.git", git_extra="create_sandbox: true",
    build_runner='{type: command, command: ["{python}", "sq_test.py"], timeout_s: 60, '
                 'max_parallel: 2}',
    extra="description: Real git sandbox with real builds"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(sqlite_db_factory: Any) -> AsyncIterator[Server]:
    url, folder = sqlite_db_factory()
    write_queues(folder, QUEUES)
    async with serve(url, folder) as s:  # creates and seeds ./sandbox.git
        yield s


def push_change(root: Path, branch: str, files: dict[str, str]) -> str:
    clone = GitSandbox(root, SANDBOX_KEY, bare="sandbox.git", work=f"work-{branch}")
    clone.clone()
    clone.git("checkout", "--quiet", "-b", branch)
    return clone.push(branch, clone.commit(files, f"Add {branch}"))


async def test_a_failed_real_build_links_to_its_log(server: Server, page: Any) -> None:
    root = Path(server.runtime.settings.queues_file).parent
    uri = push_change(root, "breaks-it", {"pkg/broken.txt": "fine\nBROKEN\n"})
    sqid = await server.land(uri, queue="gitq")
    assert await server.wait_terminal(sqid, timeout=60) == "error"

    await page.goto(f"{server.base_url}/queues/gitq/requests/{sqid.rsplit('/', 1)[1]}")
    removal = page.locator(".removal[data-kind=build_failed]")
    await removal.wait_for()
    text = await removal.inner_text()
    # in a person's words, not the planner's ("path 2e495d118d (on top of demo/batch/3)")
    assert "Its build failed when tested on the target branch alone, so it was taken out " \
        "of the queue." in text
    assert "path " not in text and "/batch/" not in text
    log_link = removal.get_by_role("link", name="log of build")
    href = await log_link.get_attribute("href")
    assert href is not None and href.startswith("/api/v1/builds/") and href.endswith("/log")
    paths_link = page.locator("table.paths a.build-log")
    assert await paths_link.get_attribute("href") == href

    # the failing lines inline: the tail around the first failure, numbered as in the log
    excerpt = page.locator("#next figure.log-excerpt")
    await expect(excerpt.locator("a.full-log")).to_have_attribute("href", href)
    first = excerpt.locator("li[data-first=true]")
    await expect(first).to_have_class("failing")
    await expect(first.locator("code")).to_have_text(
        "FAILED: a line that is exactly BROKEN in: pkg/broken.txt")
    lines = await excerpt.locator("li code").all_inner_texts()
    assert "checked: pkg/broken.txt" in lines  # the lines before it, for context
    number = int(await first.get_attribute("value") or 0)
    assert number > 1 and f"first failure (line {number})" in await excerpt.inner_text()
    steps = page.locator("#next .next-steps")
    await expect(steps).to_contain_text("fix the change, push a new commit and submit it again")
    await screenshot(page, "request-page-build-log", docs=True)

    await log_link.click()
    await page.wait_for_url(f"**{href}")
    log = await page.locator("body").inner_text()
    assert "checked: pkg/broken.txt" in log and "BROKEN" in log
