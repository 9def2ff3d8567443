"""The gateway's change claims and idempotency keys (``app/gateway/landing.py``,
``app/db/repos/claims.py``) over HTTP in process, on SQLite and PostgreSQL: the unique
claim under concurrency, all-or-nothing stacks, the terminal fold releasing or keeping
claims (idempotent under redelivery and reordering), receipts whose ``start`` was lost,
and the migration's backfill."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from alembic import command
from app.db.engine import Database
from app.db.migrate import alembic_config, upgrade
from app.db.repos import claims
from app.db.repos import request_log as repo
from app.db.repos.request_log import persist_log
from app.db.tables import change_claims as claim_t
from app.db.tables import idempotency_keys as key_t
from app.db.tables import request_summaries as sum_t
from app.domain.entities import RequestLog
from app.domain.messages import CANCEL, LOG, START, log_id
from app.domain.states import LogType
from tests.conftest import BACKENDS
from tests.support.gateway import (
    SHA,
    T0,
    URI_A,
    URI_B,
    URI_C,
    Env,
    error,
    finish,
    land,
    make_env,
)

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

URL = "/api/v1/queues/demo/requests"
COMMIT = "c" * 40


async def post(env: Env, *uris: str, **headers: str) -> httpx.Response:
    return await env.client.post(URL, json={"change_uris": list(uris)}, headers=headers)


async def holders(env: Env) -> dict[str, tuple[str, str, str]]:
    """change_key -> (owner, state, landed commit)."""
    async with env.runtime.db.read() as s:
        rows = (await s.execute(sa.select(claim_t))).all()
    return {r.change_key: (r.request_id, r.state, r.landed_commit) for r in rows}


async def test_concurrent_lands_of_one_change_take_one_claim(env: Env) -> None:
    answers = await asyncio.gather(*(post(env, URI_A) for _ in range(50)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [202] + [409] * 49, codes
    [won] = [r.json()["sqid"] for r in answers if r.status_code == 202]
    for r in answers:
        if r.status_code == 409:
            assert error(r)["code"] == "change_in_flight"
            assert f"already in flight as {won} " in error(r)["message"]
    assert await env.count(sum_t) == 1
    assert len(await env.messages(START)) == 1
    assert await holders(env) == {f"github://github.com/acme/widgets@{SHA}": (won, "live", "")}


async def test_a_stack_is_claimed_all_or_nothing(env: Env) -> None:
    assert await land(env, URI_A) == "demo/1"
    r = await post(env, URI_B, URI_A)
    assert r.status_code == 409 and "already in flight as demo/1" in error(r)["message"]
    assert await land(env, URI_B) == "demo/2"  # the refused stack left no claim on URI_B
    assert await env.count(sum_t) == 2
    # the same commit under another branch name is the same change
    alias = f"git://git.example.com/team/repo/refs%2Fheads%2Fother/{SHA}"
    assert await land(env, URI_C) == "demo/3"
    r = await post(env, alias)
    assert r.status_code == 409
    assert f"already in flight as demo/3 (as {URI_C})" in error(r)["message"]
    r = await post(env, "phab://phab.example.com/D99/1", alias.replace("other", "x"), URI_C)
    assert r.status_code == 400 and "name the same change" in error(r)["message"]


async def test_the_terminal_fold_settles_claims_idempotently(env: Env) -> None:
    first = await land(env, URI_A)
    await finish(env, first, "error")
    second = await land(env, URI_A)  # released: the change may be landed again
    # the first owner's terminal status redelivered, and a late non-terminal status,
    # do not release the second owner's claim
    await finish(env, first, "error")
    await persist_log(env.runtime.db, RequestLog(
        queue="demo", request_id=first, timestamp_ms=T0 + 5, type=LogType.STATUS,
        status="validating", log_id=log_id(first, "validating")))
    r = await post(env, URI_A)
    assert r.status_code == 409 and f"in flight as {second}" in error(r)["message"]

    await finish(env, second, "landed", batch_id="demo/batch/1", commits=[COMMIT])
    r = await post(env, URI_A)
    assert r.status_code == 409 and error(r)["code"] == "change_landed"
    assert f"already landed as {COMMIT} by {second}" in error(r)["message"]
    summary = (await env.client.get(f"{URL}/2")).json()
    assert summary["landed_commits"] == [COMMIT]
    # a repair of the landed status without the commits keeps the recorded commit
    await persist_log(env.runtime.db, RequestLog(
        queue="demo", request_id=second, timestamp_ms=T0 + 2_000, type=LogType.STATUS,
        status="landed", request_version=3, log_id=f"{second}/landed/repair"))
    assert set((await holders(env)).values()) == {(second, "landed", COMMIT)}
    assert (await env.client.get(f"{URL}/2")).json()["landed_commits"] == [COMMIT]

    cancelled = await land(env, URI_B)
    await finish(env, cancelled, "cancelled")
    assert set((await holders(env)).values()) == {(second, "landed", COMMIT)}


async def test_lands_racing_the_release_of_the_previous_owner_take_it_once(env: Env) -> None:
    owner = await land(env, URI_A)
    for _ in range(8):
        answers = await asyncio.gather(
            finish(env, owner, "error"), *(post(env, URI_A) for _ in range(6)))
        won = [r.json()["sqid"] for r in answers[1:] if r.status_code == 202]
        assert len(won) <= 1, won
        assert all(r.status_code in (202, 409) for r in answers[1:])
        if not won:  # every land came before the release: the change is free now
            won = [await land(env, URI_A)]
        owner = won[0]
        assert set((await holders(env)).values()) == {(owner, "live", "")}


async def test_a_failed_start_publish_gives_claims_and_key_back(database_url: str) -> None:
    env = await make_env(database_url, topics=(CANCEL, LOG))  # no `start`: publish fails
    try:
        r = await post(env, URI_A, **{"Idempotency-Key": "k1"})
        assert r.status_code == 503, r.text
        assert await env.count(claim_t) == 0 and await env.count(key_t) == 0
        assert await env.count(sum_t) == 1  # the hidden receipt stays, invisible
    finally:
        await env.client.aclose()
        await env.runtime.broker.close()
        await env.runtime.db.dispose()


async def hidden_receipt(env: Env, sqid: str, uri: str, *, received_ms: int,
                         key: str | None = None, body: dict[str, Any] | None = None) -> None:
    """What a gateway that died between its commit and its ``start`` publish left."""
    from app.api.schemas import LandBody
    from app.domain.change_uri import parse_change_uri
    from app.gateway.landing import body_digest

    async with env.runtime.db.write() as s:
        await s.execute(sa.text("INSERT INTO counters (queue, domain, value) "
                                "VALUES ('demo', 'request', 1)"))
        if key is not None:
            land = LandBody.model_validate(body or {"change_uris": [uri]})
            digest = body_digest(land.change_uris, land.strategy)
            await claims.reserve_key(s, queue="demo", key=key, request_id=sqid,
                                     body_sha256=digest, now_ms=received_ms)
        await claims.claim_stack(s, queue="demo", request_id=sqid,
                                 changes=[(parse_change_uri(uri).identity, uri)],
                                 now_ms=received_ms)
        await repo.create_summary(s, queue="demo", request_id=sqid, change_uris=[uri],
                                  received_at_ms=received_ms, metadata={"strategy": "merge"})


async def test_an_orphaned_receipt_is_handed_on_by_the_next_land(env: Env) -> None:
    await hidden_receipt(env, "demo/1", URI_A, received_ms=T0 - 20_000)
    r = await post(env, URI_A)
    assert r.status_code == 409
    assert "already in flight as demo/1 (now accepted)" in error(r)["message"]
    [msg] = await env.runtime.broker.find_messages(START, "demo/1")
    assert msg.payload["strategy"] == "merge" and msg.payload["change_uris"] == [URI_A]
    assert (await env.client.get(f"{URL}/1")).json()["status"] == "accepted"


async def test_a_young_hidden_receipt_is_left_to_its_own_gateway(env: Env) -> None:
    await hidden_receipt(env, "demo/1", URI_A, received_ms=T0 + 10)
    r = await post(env, URI_A)
    assert r.status_code == 409 and "being accepted right now" in error(r)["message"]
    assert await env.messages(START) == []


async def test_a_replayed_key_hands_its_hidden_receipt_on(env: Env) -> None:
    await hidden_receipt(env, "demo/1", URI_A, received_ms=T0 + 10, key="lost-answer")
    r = await post(env, URI_A, **{"Idempotency-Key": "lost-answer"})
    assert r.status_code == 202, r.text
    assert r.json() == {"sqid": "demo/1", "queue": "demo", "status": "accepted"}
    assert len(await env.runtime.broker.find_messages(START, "demo/1")) == 1
    assert await env.count(sum_t) == 1
    r = await env.client.post(URL, json={"change_uris": [URI_A], "strategy": "merge"},
                              headers={"Idempotency-Key": "lost-answer"})
    assert r.status_code == 422 and error(r)["code"] == "idempotency_key_reused"


async def test_the_migration_backfills_claims_of_existing_requests(database_url: str) -> None:
    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0004")
    db = Database(database_url)
    rows = [  # (sqid, status, uris, received)
        ("demo/1", "landed", [URI_A], 1), ("demo/2", "error", [URI_B], 2),
        ("demo/3", "speculating", [URI_B, URI_C], 3), ("demo/4", "accepted", [URI_C], 4),
        ("demo/5", "accepting", ["phab://phab.example.com/D7/1"], 5),
    ]
    # the table as revision 0004 had it (0009 added submitted_by)
    old_t = sa.Table("request_summaries", sa.MetaData(),
                     *[sa.Column(c.name, c.type) for c in sum_t.columns
                       if c.name != "submitted_by"])
    try:
        async with db.write() as s:
            for sqid, status, uris, received in rows:
                await s.execute(sa.insert(old_t).values(
                    queue="demo", request_id=sqid, change_uris_json=json.dumps(uris),
                    received_at_ms=received, status=status, request_version=0,
                    status_timestamp_ms=received, version=1))
    finally:
        await db.dispose()
    await upgrade(database_url)
    db = Database(database_url)
    try:
        async with db.read() as s:
            got = {r.change_key: (r.request_id, r.state)
                   for r in (await s.execute(sa.select(claim_t))).all()}
    finally:
        await db.dispose()
    assert got == {
        f"github://github.com/acme/widgets@{SHA}": ("demo/1", "landed"),
        "phab://phab.example.com/D12/3": ("demo/3", "live"),
        f"git://git.example.com/team/repo@{SHA}": ("demo/3", "live"),
    }
