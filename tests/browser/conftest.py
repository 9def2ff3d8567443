"""Browser tests: Playwright driving Debian's Chromium (``/usr/bin/chromium``) against
the real app served in-process (``tests/e2e/harness.serve``) on SQLite.

One browser for the whole session, one server per test module; every test gets a
fresh browser context (its own storage). The machine cannot download Playwright's
own browsers, so they are never installed: without ``/usr/bin/chromium`` (``.ci/run``
installs it) or the ``playwright`` package these tests skip and say why.

Screenshots go to ``var/artifacts/screenshots/<name>.png`` (git-ignored); with
``SQ_UPDATE_DOCS_IMAGES=1`` the README's two (``docs/img/queue-page.png`` and
``docs/img/request-page.png``, the visible viewport only) are rewritten too.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.e2e.harness import ROOT

CHROMIUM = Path(os.environ.get("SQ_TEST_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = ROOT / "var" / "artifacts" / "screenshots"
DOCS_IMG = ROOT / "docs" / "img"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

PLAYWRIGHT_MISSING = "the playwright package is not installed (pip install -e '.[dev]')"


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    playwright_api = pytest.importorskip("playwright.async_api", reason=PLAYWRIGHT_MISSING)
    if not CHROMIUM.exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium; "
                    ".ci/run does it)")
    async with playwright_api.async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                     headless=True)
        try:
            yield b
        finally:
            await b.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    p = await context.new_page()
    p.set_default_timeout(15_000)
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield p
    finally:
        await context.close()
    assert not errors, f"script errors on the page: {errors}"


@pytest.fixture(scope="session")
def sqlite_db_factory(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    def make() -> tuple[str, Path]:
        folder = tmp_path_factory.mktemp(f"browser-{uuid.uuid4().hex[:6]}")
        db = folder / "sq.db"
        shutil.copyfile(sqlite_template, db)
        return f"sqlite+aiosqlite:///{db}", folder

    return make


async def screenshot(page: Any, name: str, *, docs: bool = False) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    if docs and os.environ.get("SQ_UPDATE_DOCS_IMAGES") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        # a committed image carries no path of the machine that took it: the test's
        # interpreter (in build commands and their logs) shows as its name
        await page.evaluate(
            "([p, n]) => { for (const el of document.querySelectorAll('code, pre, li')) {"
            " for (const t of el.childNodes) { if (t.nodeType === 3 && t.data.includes(p))"
            " t.data = t.data.split(p).join(n); } } }",
            [sys.executable, Path(sys.executable).name])
        await page.screenshot(path=str(DOCS_IMG / f"{name}.png"), full_page=False)
    return path
