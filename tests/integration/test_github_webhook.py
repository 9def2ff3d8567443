"""``POST /api/v1/github/webhook`` on SQLite and PostgreSQL: deliveries signed and sent by
the fake GitHub, over the gateway's real app, database and broker; lands and cancels
through the same path as REST; a delivery acted on once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from app.db.repos.request_log import persist_log
from app.db.tables import github_deliveries as deliveries_t
from app.db.tables import request_summaries as sum_t
from app.domain.entities import RequestLog
from app.domain.github_config import GitHubConfig
from app.domain.messages import CANCEL, START, log_id
from app.domain.queue_config import QueueConfig
from app.domain.states import LogType
from app.extensions.github.client import Credentials, GitHubClient
from app.extensions.github.fake import FakeGitHub, signature
from app.extensions.github.provider import GitHubChangeProvider
from app.gateway.github_resync import GitHubResync
from tests.conftest import BACKENDS
from tests.support.gateway import T0, Env, error, finish, opened_env
from tests.support.webhook_examples import examples

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

SECRET = "webhook-s3cret"
URL = "/api/v1/github/webhook"
API = "http://fake-github.test"


@pytest.fixture
def fake(tmp_path: Path) -> FakeGitHub:
    gh = FakeGitHub(tmp_path / "widgets.git")
    gh.base_url = API
    return gh


def _provider(config: GitHubConfig, transport: httpx.AsyncBaseTransport) -> Any:
    return GitHubChangeProvider(config, GitHubClient(config, Credentials(token="fake-token"),
                                                     transport=transport))


@pytest.fixture
async def env(database_url: str, fake: FakeGitHub,
              monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Env]:
    monkeypatch.setenv("SQ_TEST_GH_WEBHOOK", SECRET)
    gh = GitHubConfig(repository="acme/widgets", api_url=API, token_env="SQ_TEST_GH_TOKEN",
                      webhook_secret_env="SQ_TEST_GH_WEBHOOK")
    queues = {"gh": QueueConfig.model_validate(
        {"name": "gh", "change_provider": {"type": "github"}, "github": gh.model_dump()})}
    async with opened_env(database_url, queues=queues) as e:
        provider = _provider(gh, httpx.ASGITransport(app=fake.app))
        e.runtime.extensions = SimpleNamespace(  # type: ignore[attr-defined]
            for_queue=lambda name: SimpleNamespace(provider=provider))
        yield e


async def send(env: Env, fake: FakeGitHub, event: str, payload: dict[str, Any], *,
               delivery: str | None = None, secret: str = SECRET) -> httpx.Response:
    body, headers = fake.signed(event, payload, secret.encode(), delivery)
    return await env.client.post(URL, content=body, headers=headers)


async def summaries(env: Env) -> list[Any]:
    async with env.runtime.db.read() as s:
        return list((await s.execute(sa.select(sum_t).order_by(sum_t.c.request_id))).all())


async def test_the_land_label_lands_the_head_once_per_delivery(env: Env,
                                                               fake: FakeGitHub) -> None:
    pull = fake.open_pull({"a.txt": "1\n"}, author="mona")
    event = fake.pull_request_event(1, "labeled", label="merge-queue", sender="mona")
    r = await send(env, fake, "pull_request", event, delivery="d-1")
    assert r.status_code == 200, r.text
    [outcome] = r.json()["outcomes"]
    assert (outcome["queue"], outcome["action"], outcome["sqids"]) == ("gh", "landed", ["gh/1"])
    [row] = await summaries(env)
    assert (row.submitted_by, row.status) == ("github:mona", "accepted")
    [msg] = await env.messages(START)
    assert msg.payload["change_uris"] == [
        f"github://github.com/acme/widgets/pull/1/{pull.head_sha}"]
    again = await send(env, fake, "pull_request", event, delivery="d-1")
    assert (again.status_code, again.json()["duplicate"], again.json()["outcomes"]) == \
        (200, True, [])
    assert len(await summaries(env)) == 1 and len(await env.messages(START)) == 1
    async with env.runtime.db.read() as s:
        [taken] = (await s.execute(sa.select(deliveries_t))).all()
    assert (taken.delivery_id, taken.event) == ("d-1", "pull_request")
    assert taken.outcome == "gh: landed (pull request #1 at " + pull.head_sha[:12] + " queued)"
    twice = await send(env, fake, "pull_request", event, delivery="d-2")  # a second label
    assert twice.json()["outcomes"][0]["action"] == "refused"
    assert "gh/1" in twice.json()["outcomes"][0]["detail"]


async def test_a_push_to_a_queued_pull_request_supersedes_it(env: Env, fake: FakeGitHub) -> None:
    pull = fake.open_pull({"a.txt": "1\n"})
    await send(env, fake, "pull_request", fake.pull_request_event(1, "labeled",
                                                                  label="merge-queue"))
    before = pull.head_sha
    fake.push(1, {"a.txt": "2\n"})
    event = {**fake.pull_request_event(1, "synchronize"), "before": before,
             "after": fake.pulls[1].head_sha}
    r = await send(env, fake, "pull_request", event)
    [outcome] = r.json()["outcomes"]
    assert (outcome["action"], outcome["detail"], outcome["sqids"]) == \
        ("cancelled", "superseded by a new push", ["gh/1"])
    [row] = await summaries(env)
    assert row.status == "cancelling"
    [msg] = await env.messages(CANCEL)
    assert (msg.payload["reason"], msg.payload["actor"]) == \
        ("superseded by a new push", "github:octocat")


@pytest.mark.parametrize(("action", "reason"), [
    ("unlabeled", "the merge-queue label was removed by @octocat"),
    ("closed", "pull request #1 was closed by @octocat"),
])
async def test_unlabel_and_close_cancel(env: Env, fake: FakeGitHub, action: str,
                                        reason: str) -> None:
    fake.open_pull({"a.txt": "1\n"})
    await send(env, fake, "pull_request", fake.pull_request_event(1, "labeled",
                                                                  label="merge-queue"))
    if action == "closed":
        fake.pulls[1].state = "closed"
    r = await send(env, fake, "pull_request",
                   fake.pull_request_event(1, action, label="merge-queue"))
    assert r.json()["outcomes"][0]["detail"] == reason
    assert [m.payload["reason"] for m in await env.messages(CANCEL)] == [reason]


async def test_comment_commands_need_write_access(env: Env, fake: FakeGitHub) -> None:
    fake.open_pull({"a.txt": "1\n"})
    fake.permissions.update({"mona": "write", "reader": "read"})
    refused = await send(env, fake, "issue_comment",
                         fake.comment_event(1, "/submitqueue land", sender="reader"))
    assert refused.json()["outcomes"][0] == {
        "queue": "gh", "action": "refused", "sqids": [],
        "detail": "@reader has read access to acme/widgets; /submitqueue commands need "
                  "write access"}
    stranger = await send(env, fake, "issue_comment",
                          fake.comment_event(1, "/submitqueue land", sender="stranger"))
    assert stranger.json()["outcomes"][0]["action"] == "refused"
    assert await summaries(env) == []
    landed = await send(env, fake, "issue_comment",
                        fake.comment_event(1, "/SubmitQueue land\nplease", sender="mona"))
    assert landed.json()["outcomes"][0]["sqids"] == ["gh/1"]
    cancelled = await send(env, fake, "issue_comment",
                           fake.comment_event(1, "/submitqueue cancel", sender="mona"))
    assert cancelled.json()["outcomes"][0]["detail"] == \
        "cancelled by @mona with /submitqueue cancel"
    chatter = await send(env, fake, "issue_comment",
                         fake.comment_event(1, "looks good to me", sender="mona"))
    assert chatter.json()["outcomes"] == []


async def test_what_the_queue_does_not_take(env: Env, fake: FakeGitHub) -> None:
    fake.repo.set_ref("refs/heads/release", fake.tip())
    fake.open_pull({"a.txt": "1\n"}, base="release")
    other = await send(env, fake, "pull_request",
                       fake.pull_request_event(1, "labeled", label="merge-queue"))
    assert other.json()["outcomes"][0]["detail"] == \
        "pull request #1 targets 'release'; this queue lands on 'main'"
    label = await send(env, fake, "pull_request",
                       fake.pull_request_event(1, "labeled", label="bug"))
    assert label.json()["outcomes"] == []
    ping = await send(env, fake, "ping", {"zen": "Keep it logically awesome."})
    assert (ping.status_code, ping.json()["outcomes"]) == (200, [])
    foreign = {**fake.pull_request_event(1, "labeled", label="merge-queue"),
               "repository": {**fake.repository(), "full_name": "acme/gadgets"}}
    ignored = await send(env, fake, "pull_request", foreign)
    assert ignored.json()["outcomes"][0]["action"] == "ignored"
    assert await summaries(env) == []


async def test_bad_deliveries_get_a_json_error(env: Env, fake: FakeGitHub) -> None:
    fake.open_pull({"a.txt": "1\n"})
    event = fake.pull_request_event(1, "labeled", label="merge-queue")
    wrong = await send(env, fake, "pull_request", event, secret="not-it")
    assert wrong.status_code == 401 and "does not match" in error(wrong)["message"]
    body, headers = fake.signed("pull_request", event, SECRET.encode())
    unsigned = await env.client.post(URL, content=body, headers={
        k: v for k, v in headers.items() if k != "X-Hub-Signature-256"})
    assert unsigned.status_code == 401 and "missing or malformed" in error(unsigned)["message"]
    nameless = await env.client.post(URL, content=body, headers={
        k: v for k, v in headers.items() if k != "X-GitHub-Delivery"})
    assert nameless.status_code == 400 and "X-GitHub-Delivery" in error(nameless)["message"]
    garbage = b"not json"
    headers["X-Hub-Signature-256"] = signature(SECRET.encode(), garbage)
    not_json = await env.client.post(URL, content=garbage, headers=headers)
    assert not_json.status_code == 400 and "not JSON" in error(not_json)["message"]
    broken = await send(env, fake, "pull_request", {"action": "labeled"}, delivery="d-broken")
    assert broken.status_code == 400 and "repository.full_name" in error(broken)["message"]
    assert await summaries(env) == []
    async with env.runtime.db.read() as s:  # a refused delivery is not recorded as taken
        ids = [r.delivery_id for r in (await s.execute(sa.select(deliveries_t))).all()]
    assert ids == []


async def test_github_down_is_503_and_the_delivery_can_be_redelivered(
        env: Env, fake: FakeGitHub) -> None:
    fake.open_pull({"a.txt": "1\n"})
    fake.permissions["mona"] = "admin"
    real = env.runtime.extensions.for_queue("gh").provider  # type: ignore[attr-defined]
    down = _provider(real.config, httpx.MockTransport(
        lambda r: httpx.Response(502, json={"message": "bad gateway"})))
    env.runtime.extensions = SimpleNamespace(  # type: ignore[attr-defined]
        for_queue=lambda name: SimpleNamespace(provider=down))
    event = fake.comment_event(1, "/submitqueue land", sender="mona")
    r = await send(env, fake, "issue_comment", event, delivery="d-9")
    assert r.status_code == 503 and "redeliver" in error(r)["message"]
    env.runtime.extensions = SimpleNamespace(  # type: ignore[attr-defined]
        for_queue=lambda name: SimpleNamespace(provider=real))
    again = await send(env, fake, "issue_comment", event, delivery="d-9")
    assert (again.json()["duplicate"], again.json()["outcomes"][0]["sqids"]) == (False, ["gh/1"])


async def test_githubs_own_labeled_and_synchronize_examples(env: Env, fake: FakeGitHub) -> None:
    """@octokit/webhooks-examples' payloads, pointed at this queue's repository."""
    def ours(payload: dict[str, Any]) -> dict[str, Any]:
        out = json.loads(json.dumps(payload))
        out["repository"]["full_name"] = "acme/widgets"
        out["pull_request"]["base"]["ref"] = "main"
        out["pull_request"]["state"] = "open"
        if "label" in out:
            out["label"]["name"] = "merge-queue"
        return out

    labeled = ours(next(p for p in examples("pull_request") if p["action"] == "labeled"))
    r = await send(env, fake, "pull_request", labeled)
    assert r.json()["outcomes"][0]["sqids"] == ["gh/1"], r.text
    [msg] = await env.messages(START)
    pr = labeled["pull_request"]
    assert msg.payload["change_uris"] == [
        f"github://github.com/acme/widgets/pull/{pr['number']}/{pr['head']['sha']}"]
    push = ours(next(p for p in examples("pull_request") if p["action"] == "synchronize"))
    push["pull_request"]["number"] = pr["number"]
    push["before"] = pr["head"]["sha"]
    r = await send(env, fake, "pull_request", push)
    assert r.json()["outcomes"][0]["detail"] == "superseded by a new push", r.text


async def test_the_resync_lands_what_a_lost_delivery_left_out(env: Env, fake: FakeGitHub) -> None:
    queued = fake.open_pull({"a.txt": "1\n"})
    queued.labels.append("merge-queue")
    await send(env, fake, "pull_request", fake.pull_request_event(1, "labeled",
                                                                  label="merge-queue"))
    lost = fake.open_pull({"b.txt": "1\n"})
    lost.labels.append("merge-queue")  # labelled, but the delivery never arrived
    fake.open_pull({"c.txt": "1\n"})  # not labelled
    fake.open_pull({"d.txt": "1\n"}, draft=True).labels.append("merge-queue")
    fake.repo.set_ref("refs/heads/release", fake.tip())
    fake.open_pull({"e.txt": "1\n"}, base="release").labels.append("merge-queue")
    closed = fake.open_pull({"f.txt": "1\n"})
    closed.labels.append("merge-queue")
    closed.state = "closed"
    resync = GitHubResync(env.runtime)  # type: ignore[arg-type]
    assert resync.queues() == ["gh"]
    first = await resync.run()
    assert [(o.action, o.sqids) for o in first["gh"]] == [("ignored", []), ("landed", ["gh/2"])]
    assert first["gh"][0].detail == (f"pull request #1 at {queued.head_sha[:12]} was "
                                     "submitted before as gh/1 (accepted)")
    [msg] = [m for m in await env.messages(START) if m.payload["id"] == "gh/2"]
    assert msg.payload["change_uris"] == [
        f"github://github.com/acme/widgets/pull/{lost.number}/{lost.head_sha}"]
    second = await resync.run()  # converged: nothing new
    assert [o.action for o in second["gh"]] == ["ignored", "ignored"]
    await finish(env, "gh/2", "error")  # its build failed: not landed again every interval
    third = await resync.run()
    assert [o.action for o in third["gh"]] == ["ignored", "ignored"]
    assert "submitted before as gh/2 (error)" in third["gh"][1].detail
    new_head = fake.push(lost.number, {"b.txt": "2\n"})  # a new push is a new submission
    fourth = await resync.run()
    assert [(o.action, o.sqids) for o in fourth["gh"]] == [("ignored", []),
                                                          ("landed", ["gh/3"])]
    assert new_head[:12] in fourth["gh"][1].detail
    assert len(await summaries(env)) == 3


async def status_of(env: Env, sqid: str) -> tuple[str, dict[str, Any]]:
    async with env.runtime.db.read() as s:
        row = (await s.execute(sa.select(sum_t).where(sum_t.c.request_id == sqid))).one()
    return row.status, json.loads(row.metadata_json)


async def test_the_resync_cancels_what_a_lost_delivery_left_queued(
        env: Env, fake: FakeGitHub) -> None:
    """Label removed, closed, pushed to, retargeted, with each delivery lost: the resync
    cancels those requests, and leaves alone a comment's request without the label, a
    pull request the queue closed as landed, and one GitHub no longer shows."""
    fake.permissions["mona"] = "write"
    fake.repo.set_ref("refs/heads/release", fake.tip())
    pulls = [fake.open_pull({f"{i}.txt": "1\n"}) for i in range(7)]
    for pull in pulls[:6]:
        pull.labels.append("merge-queue")
        r = await send(env, fake, "pull_request",
                       fake.pull_request_event(pull.number, "labeled", label="merge-queue"))
        assert r.json()["outcomes"][0]["action"] == "landed", r.text
    r = await send(env, fake, "issue_comment",
                   fake.comment_event(7, "/submitqueue land", sender="mona"))
    assert r.json()["outcomes"][0]["sqids"] == ["gh/7"], r.text
    assert (await status_of(env, "gh/1"))[1]["origin"] == "label"
    await persist_log(env.runtime.db, RequestLog(  # a later status keeps the origin
        queue="gh", request_id="gh/1", timestamp_ms=T0 + 500, type=LogType.STATUS,
        status="speculating", request_version=2, log_id=log_id("gh/1", "speculating")))
    assert await status_of(env, "gh/1") == ("speculating", {"origin": "label"})
    assert (await status_of(env, "gh/7"))[1]["origin"] == "comment"
    resync = GitHubResync(env.runtime)  # type: ignore[arg-type]
    assert [o.action for o in (await resync.run())["gh"]] == ["ignored"] * 6  # converged
    # GitHub changes; none of these deliveries reaches the server
    pulls[0].labels.remove("merge-queue")  # gh/1: label removed
    pulls[1].state = "closed"  # gh/2: closed
    new_head = fake.push(3, {"2.txt": "2\n"})  # gh/3: pushed to
    pulls[3].base_ref = "release"  # gh/4: retargeted
    pulls[4].labels.append("merged-by-queue")  # gh/5: the queue's own squash landing
    pulls[4].state = "closed"
    del fake.pulls[6]  # gh/6: GitHub answers 404 (deleted, or we lost sight of it)
    # gh/7 (queued by a comment) never had the label: left alone
    first = (await resync.run())["gh"]
    cancelled = {o.sqids[0]: o.detail for o in first if o.action == "cancelled"}
    note = " (seen by the resync: GitHub's delivery saying so was lost)"
    assert cancelled == {
        "gh/1": f"the merge-queue label was removed{note}",
        "gh/2": f"pull request #2 was closed{note}",
        "gh/3": "superseded by a new push",
        "gh/4": f"pull request #4 now targets 'release'; this queue lands on 'main'{note}",
    }
    assert new_head[:12] in next(o.detail for o in first if o.action == "landed")
    [msg] = [m for m in await env.messages(CANCEL) if m.payload["id"] == "gh/1"]
    assert msg.payload["actor"] == "github:submitqueue-resync"
    for sqid in ("gh/5", "gh/6", "gh/7"):
        assert (await status_of(env, sqid))[0] == "accepted", sqid
    # no consumer runs here: gh/1's summary still says speculating (the cancelling entry
    # of version 0 does not outrank it), so the next resync asks again: the same log id
    # and message id, nothing new written or published
    messages = len(await env.messages(CANCEL))
    second = (await resync.run())["gh"]
    assert [o.sqids for o in second if o.action == "cancelled"] == [["gh/1"]]
    assert len(await env.messages(CANCEL)) == messages
    await finish(env, "gh/1", "cancelled")
    third = (await resync.run())["gh"]  # converged
    assert [o for o in third if o.action == "cancelled"] == []


async def test_the_resync_rides_out_github_being_down(env: Env, fake: FakeGitHub) -> None:
    real = env.runtime.extensions.for_queue("gh").provider  # type: ignore[attr-defined]
    down = _provider(real.config, httpx.MockTransport(
        lambda r: httpx.Response(503, json={"message": "unavailable"})))
    env.runtime.extensions = SimpleNamespace(  # type: ignore[attr-defined]
        for_queue=lambda name: SimpleNamespace(provider=down))
    assert await GitHubResync(env.runtime).run() == {}  # type: ignore[arg-type]
