"""``submitqueue demo --github`` from an empty directory: a fake GitHub, a server of its
own, pull requests labelled by webhook, checks, landing; exit 0 as expected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT

pytestmark = pytest.mark.timeout(60)


def test_the_github_demo_runs_from_an_empty_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQ_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--github", "--count", "3",
                           "--fail", "1", "--timeout", "45"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=55)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "2 landed, 1 removed: as expected" in out
    assert out.count("- merged on GitHub") == 2
    assert "#3 github-demo/3: error (" in out
    assert "Merge refs/pull/2/head (github-demo/2)" in out
    assert "#1 success: Landed as " in out and "#2 success: Landed as " in out
    assert "#3 failure: Removed: " in out
    assert list(tmp_path.iterdir()) == []  # everything lived in a scratch directory
