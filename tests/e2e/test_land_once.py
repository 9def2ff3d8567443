"""Each change lands at most once per queue, over HTTP on SQLite and PostgreSQL: a storm
of concurrent lands of one change accepts exactly one; a landed change is refused
naming its commit; an errored one may land again; an ``Idempotency-Key`` gives a
resent land its first sqid back. On the demo queue (fakes) and on a real git queue,
where the branch of a landed change is moved to its landed commit when configured."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.domain import messages as m
from app.extensions.merger.fake import landed_sha
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(120),
]

STORM = 50


async def storm(server: Server, uri: str, queue: str) -> list[httpx.Response]:
    url = f"/api/v1/queues/{queue}/requests"
    return list(await asyncio.gather(*(
        server.client.post(url, json={"change_uris": [uri]}) for _ in range(STORM))))


def winner_of(answers: list[httpx.Response]) -> str:
    """The one accepted sqid; every other answer is a 409 naming it."""
    accepted = [r for r in answers if r.status_code == 202]
    assert len(accepted) == 1, [r.status_code for r in answers]
    sqid = str(accepted[0].json()["sqid"])
    refused = [r for r in answers if r.status_code != 202]
    assert len(refused) == STORM - 1
    for r in refused:
        assert r.status_code == 409, r.text
        err = r.json()["error"]
        assert err["code"] in ("change_in_flight", "change_landed"), err
        assert f" {sqid} " in err["message"] or f" {sqid}" in err["message"], err
    return sqid


async def test_a_storm_of_lands_of_one_change_accepts_exactly_one(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        uri = change("storm", files="storm/a.py")
        sqid = winner_of(await storm(server, uri, "demo"))
        assert await server.wait_terminal(sqid) == "landed"
        assert await server.statuses_of_queue() == {sqid: "landed"}
        summary = await server.summary(sqid)
        assert summary["landed_commits"] == [landed_sha(uri)]
        [landed] = [e for e in await server.history(sqid) if e.get("status") == "landed"]
        assert landed["metadata"]["commits"] == [landed_sha(uri)]


async def test_landed_changes_are_refused_and_errored_ones_may_land_again(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        failing = change("again", files="again/a.py", fake="build-fail")
        first = await server.land(failing)
        assert await server.wait_terminal(first) == "error"
        # the same change (markers do not count): its claim was released by the error
        fixed = change("again", files="again/a.py")
        second = await server.land(fixed)
        assert await server.wait_terminal(second) == "landed"

        for uri in (fixed, failing, change("again", files="elsewhere/b.py")):
            r = await server.client.post("/api/v1/queues/demo/requests",
                                         json={"change_uris": [uri]})
            assert r.status_code == 409, r.text
            err = r.json()["error"]
            assert err["code"] == "change_landed"
            assert f"already landed as {landed_sha(fixed)} by {second}" in err["message"]
        # a stack holding it is refused as a whole, and claims nothing of the rest
        other = change("other", files="other/a.py")
        r = await server.client.post("/api/v1/queues/demo/requests",
                                     json={"change_uris": [other, fixed]})
        assert r.status_code == 409 and r.json()["error"]["code"] == "change_landed"
        third = await server.land(other)
        assert await server.wait_terminal(third) == "landed"
        assert await server.statuses_of_queue() == {
            first: "error", second: "landed", third: "landed"}


async def test_an_idempotency_key_returns_the_first_sqid(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path) as server:
        url = "/api/v1/queues/demo/requests"
        body: dict[str, Any] = {"change_uris": [change("idem", files="idem/a.py")]}
        headers = {"Idempotency-Key": "client-7f3a"}
        first = await server.client.post(url, json=body, headers=headers)
        again = await server.client.post(url, json=body, headers=headers)
        assert first.status_code == again.status_code == 202, again.text
        sqid = first.json()["sqid"]
        assert again.json()["sqid"] == sqid
        assert "idempotent-replayed" not in first.headers
        assert again.headers["idempotent-replayed"] == "true"
        assert await server.wait_terminal(sqid) == "landed"
        late = await server.client.post(url, json=body, headers=headers)
        assert late.status_code == 202 and late.json() == {
            "sqid": sqid, "queue": "demo", "status": "landed"}
        assert len(await server.runtime.broker.find_messages(m.START, sqid)) == 1
        assert list(await server.statuses_of_queue()) == [sqid]

        other = {"change_uris": [change("idem2", files="idem/b.py")]}
        r = await server.client.post(url, json=other, headers=headers)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "idempotency_key_reused" and sqid in err["message"]
        r = await server.client.post(url, json=body, headers={"Idempotency-Key": "a b"})
        assert r.status_code == 400 and "Idempotency-Key" in r.json()["error"]["message"]
        assert list(await server.statuses_of_queue()) == [sqid]


GIT_QUEUES = queues_file(
    git_queue(git_extra="move_head_branches: true", conflicts=None),
    git_queue("plainq", repository="./plain.git", repo_key="sandbox.local/plain",
              conflicts=None))


@pytest.mark.slow
async def test_a_storm_on_a_git_queue_lands_the_commit_once_and_moves_its_branch(
    database_url: str, tmp_path: Path
) -> None:
    write_queues(tmp_path, GIT_QUEUES)
    repo = GitSandbox.seeded(tmp_path, SANDBOX_KEY)
    plain = GitSandbox.seeded(tmp_path, "sandbox.local/plain", bare="plain.git",
                              work="plain-work")
    uri = repo.branch("feature", {"src/hello.txt": "hello\n"}, "Add hello")
    pinned = repo.tip("feature")
    plain_uri = plain.branch("feature", {"src/hi.txt": "hi\n"}, "Add hi")
    plain_pinned = plain.tip("feature")
    async with serve(database_url, tmp_path) as server:
        sqid = winner_of(await storm(server, uri, "gitq"))
        kept = await server.land(plain_uri, queue="plainq")
        assert await server.wait_terminal(sqid) == "landed", await server.summary(sqid)
        assert await server.wait_terminal(kept) == "landed", await server.summary(kept)
        assert await server.statuses_of_queue("gitq") == {sqid: "landed"}
        commits = (await server.summary(sqid))["landed_commits"]
        plain_commits = (await server.summary(kept))["landed_commits"]
    assert repo.main("log", "--format=%s", "main").splitlines() == [
        f"Add hello ({sqid})", "initial"]
    assert commits == [repo.tip("main")]
    assert repo.tip("feature") == repo.tip("main") != pinned  # moved: shows as merged
    assert plain_commits == [plain.tip("main")]
    assert plain.tip("feature") == plain_pinned  # not configured: untouched
