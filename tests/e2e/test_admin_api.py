"""The admin API end to end over HTTP (SQLite and PostgreSQL): auth, topic and DLQ
views, drain in each mode (idempotent, audited), pause/resume, bad input."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.db.repos import audit as audit_repo
from app.domain import messages as m
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.integration.queue_support import ClaimWatch

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(120),
]

TOKEN = "ops:s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
A = "/api/v1/admin"


async def api(server: Server, method: str, path: str, status: int = 200,
              **kw: Any) -> Any:
    kw.setdefault("headers", AUTH)
    r = await server.client.request(method, A + path, **kw)
    assert r.status_code == status, r.text
    return r.json()


async def audit_rows(server: Server) -> list[audit_repo.AuditEntry]:
    async with server.runtime.db.read() as s:
        return await audit_repo.list_entries(s)


async def wait_dlq_items(server: Server, topic: str, n: int, timeout: float = 30,
                         headers: dict[str, str] = AUTH) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    items: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        items = (await api(server, "GET", f"/dlq/{topic}/messages", headers=headers))["items"]
        if len(items) >= n:
            return items
        await asyncio.sleep(0.1)
    raise AssertionError(f"{topic} has {len(items)} messages, wanted {n}")


async def test_unset_token_refuses_every_admin_call(database_url: str, tmp_path: Path) -> None:
    async with serve(database_url, tmp_path) as server:
        for method, path in (("GET", "/topics"), ("GET", "/dlq"), ("GET", "/audit"),
                             ("POST", "/consumers/build/pause")):
            body = await api(server, method, path, 403)
            assert body["error"]["code"] == "admin_disabled"
            assert "SQ_ADMIN_TOKEN" in body["error"]["message"]
        stats = {t.topic: t for t in await server.runtime.broker.stats()}
        assert not any(g.paused for g in stats["build"].groups)
        assert await audit_rows(server) == []


async def test_wrong_or_missing_token_is_401_with_no_side_effect(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, admin_token=TOKEN) as server:
        for headers in ({}, {"Authorization": "Bearer ops:wrong"},
                        {"Authorization": "Basic b3BzOnMzY3JldA=="}, {"Authorization": "Bearer"}):
            body = await api(server, "POST", "/consumers/build/pause", 401, headers=headers,
                             json={"reason": "x"})
            assert body["error"]["code"] == "unauthorized"
            await api(server, "POST", "/dlq/build_dlq/drain", 401, headers=headers,
                      json={"mode": "discard", "reason": "x"})
        stats = {t.topic: t for t in await server.runtime.broker.stats()}
        assert not any(g.paused for g in stats["build"].groups)
        assert await audit_rows(server) == []
        assert (await api(server, "GET", "/audit"))["items"] == []


async def test_paused_dlq_accumulates_and_each_drain_mode_does_what_it_says(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, admin_token=TOKEN, queue_max_attempts=2) as server:
        paused = await api(server, "POST", "/consumers/build_dlq/pause",
                           json={"reason": "inspect"})
        assert paused["group"] == m.ORCHESTRATOR_DLQ_GROUP
        sqids = [await server.land(change(f"t{i}", files=f"d{i}/x.py", fake="trigger-error"))
                 for i in range(3)]
        watch = ClaimWatch(server.runtime.broker)
        items = await wait_dlq_items(server, "build_dlq", 3)
        # A claim of the paused build_dlq that began after all three arrived finished.
        await watch.claimed_since("build_dlq", watch.mark("build_dlq"))
        assert watch.handed_out["build_dlq"] == []
        for sqid in sqids:  # nothing reconciled them: still in progress
            assert (await server.summary(sqid))["status"] not in ("error", "landed")
        by_entity = {i["entity_id"]: i for i in items}
        assert len(by_entity) == 3
        one = items[0]
        assert one["original_topic"] == "build" and one["attempts"] == 2
        assert "ConnectionError" in one["last_error"] and one["failed_at_ms"] > 0
        detail = await api(server, "GET", f"/dlq/build_dlq/messages/{one['id']}")
        assert detail["payload"]["id"] == one["entity_id"]
        listing = {t["topic"]: t for t in (await api(server, "GET", "/dlq"))["topics"]}
        assert listing["build_dlq"]["size"] == 3
        assert listing["build_dlq"]["consumers"][0]["paused"] is True
        topics = {t["topic"]: t for t in (await api(server, "GET", "/topics"))["topics"]}
        assert topics["build"]["dlq_size"] == 3
        dlq_group = topics["build_dlq"]["groups"][0]
        assert dlq_group["paused"] is True and dlq_group["depth"] == 3

        sqid_of = {}
        for sqid in sqids:
            sqid_of[(await server.summary(sqid))["metadata"]["batch_id"]] = sqid
        rec, req, dis = items

        # reconcile: the batch fails, its request ends in error; repeating is a no-op
        out = await api(server, "POST", "/dlq/build_dlq/drain",
                        json={"mode": "reconcile", "message_ids": [rec["id"]]})
        assert out["results"][0]["result"] == "reconciled"
        assert out["results"][0]["outcome"]["action"] == "failed"
        rec_sqid = sqid_of[rec["entity_id"]]
        assert await server.wait_terminal(rec_sqid) == "error"
        assert "dead-lettered from build after 2 attempts" in (
            await server.summary(rec_sqid))["last_error"]
        again = await api(server, "POST", "/dlq/build_dlq/drain",
                          json={"mode": "reconcile", "message_ids": [rec["id"]]})
        assert again["results"] == [{"id": rec["id"], "result": "not_found"}]

        # requeue and discard need a reason
        for mode in ("requeue", "discard"):
            await api(server, "POST", "/dlq/build_dlq/drain", 400,
                      json={"mode": mode, "message_ids": [req["id"]]})

        # discard: gone from the DLQ; repeating reports not_found
        out = await api(server, "POST", "/dlq/build_dlq/drain",
                        json={"mode": "discard", "message_ids": [dis["id"]], "reason": "junk"})
        assert out["results"][0]["result"] == "discarded"
        await api(server, "GET", f"/dlq/build_dlq/messages/{dis['id']}", 404)

        # requeue: back to `build` with the same id; it fails again and returns
        out = await api(server, "POST", "/dlq/build_dlq/drain",
                        json={"mode": "requeue", "message_ids": [req["id"]],
                              "reason": "runner fixed"})
        assert out["results"][0] == {"id": req["id"], "result": "requeued", "to": "build"}
        again = await api(server, "POST", "/dlq/build_dlq/drain",
                          json={"mode": "requeue", "message_ids": [req["id"]],
                                "reason": "runner fixed"})
        assert again["results"][0]["result"] == "not_found"
        back = await wait_dlq_items(server, "build_dlq", 1)
        assert back[0]["message_id"] == req["message_id"] and back[0]["id"] != req["id"]

        # resume: the reconciler consumes what accumulated
        await api(server, "POST", "/consumers/build_dlq/resume", json={})
        assert await server.wait_terminal(sqid_of[req["entity_id"]]) == "error"
        assert (await api(server, "GET", "/dlq/build_dlq/messages"))["items"] == []

        audit = (await api(server, "GET", "/audit"))["items"]
        actions = [a["action"] for a in reversed(audit)]
        assert actions == ["pause", "drain:reconcile", "drain:reconcile", "drain:discard",
                           "drain:requeue", "drain:requeue", "resume"]
        assert {a["actor"] for a in audit} == {"ops"}
        discard = next(a for a in audit if a["action"] == "drain:discard")
        assert discard["message_ids"] == [dis["id"]] and discard["reason"] == "junk"
        assert discard["topic"] == "build_dlq" and discard["at_ms"] > 0


async def test_undecodable_poison_stays_until_discarded_and_drains_page(
    database_url: str, tmp_path: Path
) -> None:
    async with serve(database_url, tmp_path, admin_token="plain-secret") as server:
        server.client.headers["Authorization"] = "Bearer plain-secret"
        for _ in range(3):
            await server.runtime.broker.publish(m.START, {"nonsense": 1}, partition_key="demo",
                                                message_id=uuid.uuid4().hex)
        items = await wait_dlq_items(server, "start_dlq", 3, headers={})
        assert all(i["entity_id"] is None for i in items)
        out = await api(server, "POST", "/dlq/start_dlq/drain", json={"mode": "reconcile"},
                        headers={})
        assert [r["result"] for r in out["results"]] == ["undecodable"] * 3
        watch = ClaimWatch(server.runtime.broker)  # its reconciler keeps failing on it,
        await watch.claimed_since("start_dlq", 0)  # without losing it: it had its chance
        assert len((await api(server, "GET", "/dlq/start_dlq/messages", headers={}))["items"]) == 3
        page = await api(server, "POST", "/dlq/start_dlq/drain",
                         json={"mode": "discard", "reason": "poison", "limit": 2}, headers={})
        assert [r["result"] for r in page["results"]] == ["discarded"] * 2
        assert page["next_cursor"]
        rest = await api(server, "POST", "/dlq/start_dlq/drain",
                         json={"mode": "discard", "reason": "poison", "limit": 2,
                               "cursor": page["next_cursor"]}, headers={})
        assert [r["result"] for r in rest["results"]] == ["discarded"]
        assert rest["next_cursor"] is None
        assert (await api(server, "GET", "/dlq/start_dlq/messages", headers={}))["items"] == []
        audit = (await api(server, "GET", "/audit", headers={}))["items"]
        assert {a["actor"] for a in audit} == {"admin"}


async def test_bad_input(database_url: str, tmp_path: Path) -> None:
    async with serve(database_url, tmp_path, admin_token=TOKEN) as server:
        await api(server, "GET", "/dlq/nope_dlq/messages", 404)
        body = await api(server, "GET", "/dlq/build/messages", 404)
        assert "build_dlq" in body["error"]["message"]
        await api(server, "GET", "/dlq/build_dlq/messages/abc", 400)
        await api(server, "GET", "/dlq/build_dlq/messages/999999", 404)
        await api(server, "GET", "/dlq/build_dlq/messages", 400, params={"cursor": "x"})
        await api(server, "POST", "/dlq/build_dlq/drain", 400,
                  json={"mode": "discard", "reason": "r", "message_ids": ["1x"]})
        await api(server, "POST", "/dlq/build_dlq/drain", 422, json={"mode": "explode"})
        await api(server, "POST", "/dlq/nope/drain", 404, json={"mode": "reconcile"})
        await api(server, "POST", "/consumers/nope/pause", 404, json={})
        await api(server, "POST", "/consumers/build/pause", 404, json={"group": "nobody"})
        assert [a.action for a in await audit_rows(server)] == []


async def test_unstorable_text_and_odd_digits_are_refused_with_nothing_done(
    database_url: str, tmp_path: Path
) -> None:
    """NUL in a reason or partition key was a 500 on PostgreSQL (after the drain had
    acted, before its audit row); '²' passes str.isdigit() but not int()."""
    async with serve(database_url, tmp_path, admin_token=TOKEN) as server:
        for odd in ("²", "1²", "٣", "9" * 5000):
            await api(server, "GET", f"/dlq/build_dlq/messages/{odd}", 400)
            await api(server, "GET", "/dlq/build_dlq/messages", 400, params={"cursor": odd[:30]})
            await api(server, "GET", "/audit", 400, params={"cursor": odd[:30]})
            body = await api(server, "POST", "/dlq/build_dlq/drain", 400,
                             json={"mode": "discard", "reason": "r", "message_ids": [odd]})
            assert "malformed" in body["error"]["message"]
        for field, value in (("reason", "fixed\x00it"), ("reason", "bell\x07"),
                             ("cursor", "12\x00")):
            body = await api(server, "POST", "/dlq/build_dlq/drain", 422,
                             json={"mode": "discard", "reason": "r", field: value})
            assert body["error"]["message"].startswith(f"invalid request: {field}: ")
        for field, value in (("partition_key", "demo\x00"), ("reason", "why\x00"),
                             ("group", "build\x00"), ("partition_key", "a\nb")):
            body = await api(server, "POST", "/consumers/build/pause", 422,
                             json={"reason": "r", field: value})
            assert body["error"]["message"].startswith(f"invalid request: {field}: ")
        stats = {t.topic: t for t in await server.runtime.broker.stats()}
        assert not any(g.paused or g.paused_partitions for g in stats["build"].groups)
        assert await audit_rows(server) == []
        # free text may still span lines
        await api(server, "POST", "/consumers/build/pause", json={"reason": "one\n\ttwo"})
        [entry] = await audit_rows(server)
        assert entry.reason == "one\n\ttwo"


async def test_cli_lists_shows_and_drains(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from app.cli.root import cli
    from app.settings import get_settings

    async with serve(database_url, tmp_path, admin_token=TOKEN) as server:
        monkeypatch.setenv("SQ_ADMIN_TOKEN", TOKEN)
        get_settings.cache_clear()
        try:
            await server.runtime.broker.publish(m.START, {"nonsense": 1}, partition_key="demo",
                                                message_id="cli-poison")
            (item,) = await wait_dlq_items(server, "start_dlq", 1)

            def run(*args: str) -> str:
                result = CliRunner().invoke(cli, [*args, "--url", server.base_url])
                assert result.exit_code == 0, result.output
                return result.output

            listing = await asyncio.to_thread(run, "dlq", "list")
            assert any(line.split()[:2] == ["start_dlq", "1"] for line in listing.splitlines())
            shown = await asyncio.to_thread(run, "dlq", "show", "start_dlq")
            header, row = shown.splitlines()
            assert header.split() == ["ID", "ENTITY", "ATTEMPTS", "LAST", "ERROR"]
            assert row.split()[0] == str(item["id"])
            first_line = (item["last_error"] or "-").splitlines()[0]
            assert first_line in row  # the whole first line, not cut at 80 characters
            one = await asyncio.to_thread(run, "dlq", "show", "start_dlq", str(item["id"]))
            assert '"message_id": "cli-poison"' in one
            drained = await asyncio.to_thread(run, "dlq", "drain", "start_dlq", "--mode",
                                              "discard", "--reason", "cli test")
            assert "discarded: 1" in drained
            empty = await asyncio.to_thread(run, "dlq", "show", "start_dlq")
            assert empty.strip() == "(no dead letters on start_dlq)"
            assert (await api(server, "GET", "/dlq/start_dlq/messages"))["items"] == []
        finally:
            get_settings.cache_clear()



async def test_cli_creates_lists_and_revokes_tokens_and_the_client_sends_sq_token(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQ_AUTH=required: `token create` prints a secret once; `land` with SQ_TOKEN lands
    as the token's label; after `token revoke` the same land is refused (exit 1)."""
    from typer.testing import CliRunner

    from app.cli.root import cli
    from app.settings import get_settings

    async with serve(database_url, tmp_path, admin_token=TOKEN, auth="required") as server:
        monkeypatch.setenv("SQ_ADMIN_TOKEN", TOKEN)
        monkeypatch.delenv("SQ_TOKEN", raising=False)
        get_settings.cache_clear()
        try:
            def run(*args: str, code: int = 0) -> str:
                result = CliRunner().invoke(cli, [*args, "--url", server.base_url])
                assert result.exit_code == code, result.output
                return result.output

            made = await asyncio.to_thread(run, "token", "create", "--label", "ci-bot",
                                           "--scope", "land", "--expires-in", "30d")
            summary, secret = made.splitlines()[:2]
            assert summary.startswith("token ") and "for ci-bot (land" in summary
            assert secret.startswith("sq_")
            token_id = summary.split()[1]
            # the admin commands read SQ_URL as the client commands do
            monkeypatch.setenv("SQ_URL", server.base_url)
            alone = await asyncio.to_thread(CliRunner().invoke, cli, ["token", "list"])
            assert alone.exit_code == 0 and token_id in alone.output, alone.output
            listing = await asyncio.to_thread(run, "token", "list")
            assert any(line.split()[:3] == [token_id, "ci-bot", "land"]
                       for line in listing.splitlines())
            assert secret not in listing
            uri = "phab://phab.example.com/D901/1"
            refused = await asyncio.to_thread(run, "land", "-q", "demo", uri, code=1)
            assert "401" in refused
            monkeypatch.setenv("SQ_TOKEN", secret)
            sqid = (await asyncio.to_thread(run, "land", "-q", "demo", uri)).strip()
            assert sqid.startswith("demo/")
            r = await server.client.get(f"/api/v1/queues/demo/requests/{sqid.split('/')[1]}")
            assert r.json()["submitted_by"] == "ci-bot"
            shown = await asyncio.to_thread(run, "status", sqid)
            assert "by ci-bot" in shown.splitlines()[1], shown  # "  received  <when> by ci-bot"
            out = await asyncio.to_thread(run, "token", "revoke", token_id, "--reason", "done")
            assert out.strip() == f"revoked {token_id} (ci-bot)"
            again = await asyncio.to_thread(run, "land", "-q", "demo",
                                            "phab://phab.example.com/D902/1", code=1)
            assert "revoked" in again
        finally:
            get_settings.cache_clear()
