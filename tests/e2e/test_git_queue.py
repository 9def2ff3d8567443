"""A queue on a real git repository, configured in queues.yaml, landed through HTTP.

A bare ``remote.git`` in tmp_path is the queue's repository (named relative to the
queues file); a working clone pushes feature branches to it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

import pytest

from app.extensions.gitutil import git_env
from tests.conftest import BACKENDS
from tests.e2e.harness import serve

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(90),
]

QUEUES = """\
queues:
  - name: gitq
    change_provider: {type: git}
    merger: {type: git}
    git:
      repository: ./remote.git
      repo_key: sandbox.local/sandbox
      target_branch: main
    build_runner: {type: fake, delay_ms: 0}
    conflict_analyzer: {type: pathoverlap, by: directory}
    default_strategy: squash_rebase
"""


class Repo:
    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.bare = root / "remote.git"
        self.work = root / "work"
        self.git("init", "--bare", "--quiet", "--initial-branch=main", str(self.bare), cwd=root)
        self.git("clone", "--quiet", str(self.bare), str(self.work), cwd=root)
        self.git("checkout", "--quiet", "-b", "main")
        self.commit({"a.txt": "one\ntwo\nthree\n"}, "initial")
        self.git("push", "--quiet", "origin", "main")

    def git(self, *args: str, cwd: Path | None = None) -> str:
        res = subprocess.run(["git", *args], cwd=cwd or self.work, env=git_env(self.home),
                             capture_output=True, text=True, check=False, timeout=30)
        assert res.returncode == 0, f"git {args}: {res.stderr}"
        return res.stdout.strip()

    def commit(self, files: Mapping[str, str], message: str) -> str:
        for name, content in files.items():
            path = self.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        self.git("add", "-A")
        self.git("commit", "--quiet", "-m", message)
        return self.git("rev-parse", "HEAD")

    def branch(self, name: str, files: Mapping[str, str], message: str) -> str:
        """Commit on ``name`` (from the remote's main) and push; return the change URI."""
        self.git("fetch", "--quiet", "origin")
        self.git("checkout", "--quiet", "-B", name, "origin/main")
        sha = self.commit(files, message)
        self.git("push", "--quiet", "--force", "origin", f"HEAD:refs/heads/{name}")
        return uri(name, sha)

    def main(self, *args: str) -> str:
        return self.git(*args, cwd=self.bare)


def uri(branch: str, sha: str) -> str:
    return f"git://sandbox.local/sandbox/{quote(f'refs/heads/{branch}', safe='')}/{sha}"


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    return Repo(tmp_path)


async def test_a_change_lands_on_main(database_url: str, tmp_path: Path, repo: Repo) -> None:
    change = repo.branch("feature", {"src/hello.txt": "hello\n"}, "Add hello")
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(change, queue="gitq")
        assert await server.wait_terminal(sqid) == "landed", await server.summary(sqid)
    subjects = repo.main("log", "--format=%s", "main").splitlines()
    assert subjects == [f"Add hello ({sqid})", "initial"]
    assert repo.main("show", "main:src/hello.txt") == "hello"
    assert "refs/heads/feature" in repo.main("log", "-1", "--format=%B", "main")


async def test_a_moved_ref_is_stale(database_url: str, tmp_path: Path, repo: Repo) -> None:
    first = repo.branch("moving", {"src/a.txt": "a\n"}, "First")
    repo.commit({"src/a.txt": "b\n"}, "Second")  # the branch moves on after submission
    repo.git("push", "--quiet", "origin", "HEAD:refs/heads/moving")
    before = repo.main("rev-parse", "main")
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(first, queue="gitq")
        assert await server.wait_terminal(sqid) == "error"
        assert "stale" in (await server.summary(sqid))["last_error"]
    assert repo.main("rev-parse", "main") == before


async def test_a_conflict_ends_in_error_and_main_is_untouched(
    database_url: str, tmp_path: Path, repo: Repo
) -> None:
    change = repo.branch("clash", {"a.txt": "one\nTWO (branch)\nthree\n"}, "Change two")
    repo.git("checkout", "--quiet", "-B", "main", "origin/main")
    repo.commit({"a.txt": "one\nTWO (main)\nthree\n"}, "Main changes two")
    repo.git("push", "--quiet", "origin", "main")
    before = repo.main("rev-parse", "main")
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(change, queue="gitq")
        assert await server.wait_terminal(sqid) == "error"
        last_error = (await server.summary(sqid))["last_error"]
        assert "a.txt" in last_error, last_error
    assert repo.main("rev-parse", "main") == before
