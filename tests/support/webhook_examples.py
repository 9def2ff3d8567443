"""GitHub's own example webhook payloads: the npm package ``@octokit/webhooks-examples``
(7.6.1), packed by ``.ci/run`` into ``$XDG_CACHE_HOME/submitqueue`` (default
``~/.cache/submitqueue``) and read from the tarball; never committed. Without it the
tests that use ``examples()`` skip, saying how to fetch it."""

from __future__ import annotations

import json
import os
import tarfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

VERSION = "7.6.1"
TARBALL = f"octokit-webhooks-examples-{VERSION}.tgz"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "submitqueue"


@cache
def _load(path: str) -> dict[str, list[dict[str, Any]]]:
    with tarfile.open(path) as tar:
        member = tar.extractfile("package/api.github.com/index.json")
        assert member is not None
        events = json.load(member)
    return {e["name"]: e["examples"] for e in events}


def examples(event: str) -> list[dict[str, Any]]:
    """Every example payload of ``event`` on api.github.com (skips when not cached)."""
    path = cache_dir() / TARBALL
    if not path.exists():
        pytest.skip(f"GitHub's example webhook payloads are not cached ({path} is missing): "
                    f"run .ci/run, or `npm pack @octokit/webhooks-examples@{VERSION}` in "
                    f"{cache_dir()}")
    found = _load(str(path)).get(event, [])
    assert found, f"@octokit/webhooks-examples {VERSION} has no {event} examples"
    return found
