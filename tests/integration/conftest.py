"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.gateway import Env, make_env


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    e = await make_env(database_url)
    try:
        yield e
    finally:
        await e.client.aclose()
        await e.runtime.broker.close()
        await e.runtime.db.dispose()
