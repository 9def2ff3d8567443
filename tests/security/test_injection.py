"""Injection through what a change names: branch names, file names and commit messages
full of shell syntax, refs that climb out of ``refs/``, option-shaped refs and foreign
repositories, landed through the real app (HTTP) on a real git queue whose builds run
sandboxed. Nothing a change names may reach a shell or a git option, and nothing
outside the queue's own repository may be read or written."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from tests.conftest import BACKENDS
from tests.e2e.harness import serve
from tests.gitfixtures import (
    SANDBOX_KEY,
    GitSandbox,
    change_uri,
    git_queue,
    queues_file,
    write_queues,
)
from tests.security.attack import needs_bwrap

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(120),
    needs_bwrap,
]

QUEUES = queues_file(git_queue(
    git_extra="move_head_branches: true",
    build_runner='{type: command, command: ["{python}", "check.py"], timeout_s: 60}'))

CHECK = "import os\nprint('checked', sorted(os.listdir('.')))\n"
NASTY = "x$(touch${IFS}pwned-ref);touch${IFS}pwned-semi`touch${IFS}pwned-tick`"


@pytest.fixture
def repo(tmp_path: Path) -> GitSandbox:
    write_queues(tmp_path, QUEUES)
    return GitSandbox.seeded(tmp_path, SANDBOX_KEY, files={"check.py": CHECK})


def pwned(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("pwned*")]


async def test_shell_syntax_in_branch_file_and_message_lands_as_plain_text(
    database_url: str, tmp_path: Path, repo: GitSandbox
) -> None:
    change = repo.branch(NASTY, {"src/$(touch pwned-file).txt": "$(touch pwned-content)\n"},
                         "$(touch pwned-msg) `touch pwned-msg2`; touch pwned-msg3")
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(change, queue="gitq")
        assert await server.wait_terminal(sqid) == "landed", await server.summary(sqid)
        (commit,) = (await server.summary(sqid))["landed_commits"]
    assert repo.main("show", "main:src/$(touch pwned-file).txt") == "$(touch pwned-content)"
    assert repo.main("log", "-1", "--format=%s", "main").startswith("$(touch pwned-msg)")
    assert repo.main("rev-parse", f"refs/heads/{NASTY}") == commit  # the head branch moved
    assert not pwned(tmp_path, Path.cwd()), "a shell ran something a change named"


@pytest.mark.parametrize("ref", [
    "refs/heads/../../../../etc/passwd",  # climbs out of refs/
    "refs/heads/a/../../config",
    "--upload-pack=touch pwned-opt",  # option-shaped: must never reach git as an option
    "-c core.sshCommand=touch pwned-c",
    "refs/heads/ok\nrefs/heads/main",  # a second line
    "refs/../HEAD",
])
async def test_a_hostile_ref_is_refused_with_a_reason_and_touches_nothing(
    database_url: str, tmp_path: Path, repo: GitSandbox, ref: str
) -> None:
    sha = repo.tip()
    before = repo.main("rev-parse", "main")
    uri = change_uri(SANDBOX_KEY, ref, sha) if "\n" not in ref else (
        f"git://{SANDBOX_KEY}/{quote(ref, safe='')}/{sha}")
    async with serve(database_url, tmp_path) as server:
        r = await server.client.post("/api/v1/queues/gitq/requests",
                                     json={"change_uris": [uri]})
        if r.status_code == 202:  # accepted as text; the provider must refuse it
            sqid = r.json()["sqid"]
            assert await server.wait_terminal(sqid) == "error", await server.summary(sqid)
            assert (await server.summary(sqid))["last_error"]
        else:
            assert r.status_code in (400, 422), r.text
            assert r.json()["error"]["message"]
    assert repo.main("rev-parse", "main") == before
    assert not pwned(tmp_path, Path.cwd())


async def test_a_change_of_another_repository_or_a_local_path_is_refused(
    database_url: str, tmp_path: Path, repo: GitSandbox
) -> None:
    sha = repo.tip()
    before = repo.main("rev-parse", "main")
    other = tmp_path / "other.git"
    async with serve(database_url, tmp_path) as server:
        for uri in (change_uri("evil.example/other", "refs/heads/x", sha),
                    f"file://{other}/refs%2Fheads%2Fx/{sha}",
                    f"git://{SANDBOX_KEY}/..%2F..%2Fother.git/{sha}"):
            r = await server.client.post("/api/v1/queues/gitq/requests",
                                         json={"change_uris": [uri]})
            if r.status_code == 202:
                sqid = r.json()["sqid"]
                assert await server.wait_terminal(sqid) == "error", await server.summary(sqid)
            else:
                assert r.status_code in (400, 422), r.text
    assert repo.main("rev-parse", "main") == before
