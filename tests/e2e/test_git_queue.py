"""A queue on a real git repository, configured in queues.yaml, landed through HTTP.

A bare ``remote.git`` in tmp_path is the queue's repository (named relative to the
queues file); a working clone pushes feature branches to it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BACKENDS
from tests.e2e.harness import serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(90),
]

QUEUES = queues_file(git_queue())


@pytest.fixture
def repo(tmp_path: Path) -> GitSandbox:
    write_queues(tmp_path, QUEUES)
    return GitSandbox.seeded(tmp_path, SANDBOX_KEY)


async def test_a_change_lands_on_main(database_url: str, tmp_path: Path, repo: GitSandbox) -> None:
    change = repo.branch("feature", {"src/hello.txt": "hello\n"}, "Add hello")
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(change, queue="gitq")
        assert await server.wait_terminal(sqid) == "landed", await server.summary(sqid)
    subjects = repo.main("log", "--format=%s", "main").splitlines()
    assert subjects == [f"Add hello ({sqid})", "initial"]
    assert repo.main("show", "main:src/hello.txt") == "hello"
    assert "refs/heads/feature" in repo.main("log", "-1", "--format=%B", "main")


async def test_a_moved_ref_is_stale(database_url: str, tmp_path: Path, repo: GitSandbox) -> None:
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
    database_url: str, tmp_path: Path, repo: GitSandbox
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
