"""Fixtures of the security tests: ``store`` (the SQL build store of the command runner)
from ``tests/support/commandrunner.py``, the one definition the integration tests use too."""

from tests.support.commandrunner import store  # noqa: F401 - the SQL build store fixture
