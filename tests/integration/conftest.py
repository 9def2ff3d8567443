"""Fixtures of the integration tests: the gateway ``env``, and the command runner's
``remote`` (a seeded git remote), ``store`` (the SQL build store) and ``make_runner``
from ``tests/support/commandrunner.py``. A module that defines a fixture of the same
name (``remote`` in the git tests) uses its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.commandrunner import (  # noqa: F401 - the command runner's fixtures
    make_runner,
    remote,
    store,
)
from tests.support.gateway import Env, opened_env


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    async with opened_env(database_url) as e:
        yield e
