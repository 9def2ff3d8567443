"""A ``Rig`` per test on the backend the test is parametrised with (``BACKENDS``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.controllers import Rig, make_rig


@pytest.fixture
async def rig(database_url: str) -> AsyncIterator[Rig]:
    r = make_rig(database_url)
    try:
        yield r
    finally:
        await r.aclose()
