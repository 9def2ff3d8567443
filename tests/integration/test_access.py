"""Access (SQ_AUTH=required): tokens and scopes, actors in the history, quotas — on
both databases, through the gateway's HTTP API."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa

from app.db.tables import api_tokens
from app.db.tables import request_summaries as sum_t
from app.domain.access import parse_token
from app.domain.queue_config import QueueConfig, QuotasConfig
from app.gateway.access import AccessPolicy
from tests.conftest import BACKENDS
from tests.support.gateway import URI_A, URI_B, URI_C, Env, finish, opened_env

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
ADMIN = "ops:bootstrap-secret"
URL = "/api/v1/queues/demo/requests"


@pytest.fixture
async def env(database_url: str) -> AsyncIterator[Env]:
    queues = {"demo": QueueConfig(name="demo", quotas=QuotasConfig(in_flight=2, per_hour=3)),
              "other": QueueConfig(name="other")}
    async with opened_env(database_url, queues=queues,
                          policy=AccessPolicy(mode="required", admin_token=ADMIN)) as e:
        yield e


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def token(env: Env, label: str, *scopes: str, **extra: Any) -> dict[str, Any]:
    r = await env.client.post("/api/v1/admin/tokens", headers=bearer(ADMIN),
                              json={"label": label, "scopes": list(scopes), **extra})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    assert body["token"].startswith("sq_")
    return body


async def land(env: Env, secret: str | None, uri: str, queue: str = "demo") -> Any:
    return await env.client.post(f"/api/v1/queues/{queue}/requests",
                                 json={"change_uris": [uri]},
                                 headers=bearer(secret) if secret else {})


async def test_land_needs_a_token_with_the_land_scope(env: Env) -> None:
    r = await land(env, None, URI_A)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "needs a token with the scope 'land'" in r.json()["error"]["message"]
    reader = await token(env, "watcher", "read")
    r = await land(env, reader["token"], URI_A)
    assert r.status_code == 403 and r.json()["error"]["code"] == "missing_scope"
    assert "'land'" in r.json()["error"]["message"]
    assert await env.count(sum_t) == 0  # refused calls store nothing
    bot = await token(env, "ci-bot", "land")
    r = await land(env, bot["token"], URI_A)
    assert r.status_code == 202, r.text
    history = (await env.client.get(f"{URL}/1/history")).json()["events"]
    assert history[0]["status"] == "accepted" and history[0]["metadata"] == {"actor": "ci-bot"}
    assert (await env.client.get(f"{URL}/1")).json()["submitted_by"] == "ci-bot"
    # reads stay public (SQ_AUTH_READS=public), and whoami says who a token is
    who = (await env.client.get("/api/v1/auth/whoami", headers=bearer(bot["token"]))).json()
    assert who["actor"] == "ci-bot" and who["scopes"] == ["land", "read"]
    assert who["auth"] == "required"


async def test_cancel_own_needs_cancel_and_another_s_needs_cancel_any(env: Env) -> None:
    alice = await token(env, "alice", "land", "cancel")
    bob = await token(env, "bob", "land", "cancel")
    lead = await token(env, "lead", "cancel:any")
    assert (await land(env, alice["token"], URI_A)).status_code == 202
    cancel = f"{URL}/1/cancel"
    r = await env.client.post(cancel, json={"reason": "mine now"}, headers=bearer(bob["token"]))
    assert r.status_code == 403, r.text
    assert "submitted by alice" in r.json()["error"]["message"]
    assert "cancel:any" in r.json()["error"]["message"]
    assert (await env.client.post(cancel, json={})).status_code == 401
    r = await env.client.post(cancel, json={"reason": "release freeze"},
                              headers=bearer(lead["token"]))
    assert r.status_code == 202 and r.json()["status"] == "cancelling"
    events = (await env.client.get(f"{URL}/1/history")).json()["events"]
    assert events[-1]["metadata"] == {"reason": "release freeze", "actor": "lead"}
    # the owner may cancel its own
    assert (await land(env, alice["token"], URI_B)).status_code == 202
    r = await env.client.post(f"{URL}/2/cancel", json={}, headers=bearer(alice["token"]))
    assert r.status_code == 202


async def test_admin_api_refuses_a_land_token_and_revoked_or_expired_tokens(env: Env) -> None:
    bot = await token(env, "ci-bot", "land")
    r = await env.client.get("/api/v1/admin/topics", headers=bearer(bot["token"]))
    assert r.status_code == 403 and r.json()["error"]["code"] == "missing_scope"
    admin = await token(env, "ops-bob", "admin")
    assert (await env.client.get("/api/v1/admin/tokens",
                                 headers=bearer(admin["token"]))).status_code == 200
    r = await env.client.post(f"/api/v1/admin/tokens/{bot['id']}/revoke",
                              json={"reason": "leaked"}, headers=bearer(admin["token"]))
    assert r.status_code == 200 and r.json()["revoked"] is True
    r = await land(env, bot["token"], URI_A)
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    short = await token(env, "short", "land", expires_in_s=1)
    env.runtime.broker.clock.now += 2000  # type: ignore[attr-defined]
    r = await land(env, short["token"], URI_A)
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    wrong = bot["token"][:-4] + "AAAA"
    assert (await land(env, wrong, URI_A)).status_code == 401
    listed = (await env.client.get("/api/v1/admin/tokens?include_revoked=true",
                                   headers=bearer(ADMIN))).json()["items"]
    assert {t["label"] for t in listed} == {"ci-bot", "ops-bob", "short"}
    assert all("token" not in t and "secret_hash" not in t for t in listed)
    audit = (await env.client.get("/api/v1/admin/audit", headers=bearer(ADMIN))).json()
    actions = [(e["actor"], e["action"]) for e in audit["items"]]
    assert ("ops-bob", "token.revoke") in actions and ("ops", "token.create") in actions


async def test_the_database_holds_no_plaintext_secret(env: Env, database_url: str) -> None:
    made = await token(env, "ci-bot", "land")
    # the whole secret (it may hold "_": a split on the last one could leave a few
    # characters that occur in the hash by chance)
    parsed = parse_token(made["token"])
    assert parsed is not None
    secret = parsed[1]
    async with env.runtime.db.read() as s:
        rows = [tuple(r) for r in (await s.execute(sa.select(api_tokens))).all()]
    assert rows and not any(secret in str(v) or made["token"] in str(v)
                            for row in rows for v in row)
    assert rows[0][4].startswith("scrypt$")  # secret_hash
    if database_url.startswith("sqlite"):
        path = database_url.split("///", 1)[1]
        await env.runtime.db.dispose()
        with open(path, "rb") as f:
            raw = f.read()
        assert secret.encode() not in raw
        return
    # PostgreSQL: the whole database as pg_dump writes it (what a backup would hold)
    pg_dump = shutil.which("pg_dump")
    if pg_dump is None:
        pytest.skip("pg_dump is not installed (apt-get install postgresql-client)")
    url = sa.engine.make_url(database_url)
    dump = subprocess.run(
        [pg_dump, "-h", url.host or "127.0.0.1", "-p", str(url.port or 5432),
         "-U", url.username or "postgres", "--no-owner", url.database or ""],
        capture_output=True, check=True, timeout=60).stdout
    assert b"api_tokens" in dump and b"scrypt$" in dump  # the dump holds the table
    assert secret.encode() not in dump


async def test_a_token_limited_to_a_queue_acts_only_there(env: Env) -> None:
    bot = await token(env, "other-bot", "land", queues=["other"])
    assert (await land(env, bot["token"], URI_A, queue="other")).status_code == 202
    r = await land(env, bot["token"], URI_B)
    assert r.status_code == 403 and "not 'demo'" in r.json()["error"]["message"]
    r = await env.client.post("/api/v1/admin/tokens", headers=bearer(ADMIN),
                              json={"label": "x", "scopes": ["land"], "queues": ["nope"]})
    assert r.status_code == 400 and "not configured" in r.json()["error"]["message"]


async def test_quotas_answer_429_with_retry_after_and_store_nothing(env: Env) -> None:
    bot = await token(env, "agent", "land", "cancel")
    for uri in (URI_A, URI_B):
        assert (await land(env, bot["token"], uri)).status_code == 202
    before = await env.count(sum_t)
    r = await land(env, bot["token"], URI_C)
    assert r.status_code == 429 and r.json()["error"]["code"] == "quota_exceeded"
    assert int(r.headers["retry-after"]) >= 1 and "in flight" in r.json()["error"]["message"]
    assert await env.count(sum_t) == before
    # another actor has its own quota
    person = await token(env, "alice", "land")
    assert (await land(env, person["token"], URI_C)).status_code == 202
    # one ends: in flight frees up, but the hourly quota (3) then holds
    await env.client.post(f"{URL}/1/cancel", json={}, headers=bearer(bot["token"]))
    await finish(env, "demo/1", "cancelled")
    uri_d = URI_C[:-1] + "8"  # another commit
    assert (await land(env, bot["token"], uri_d)).status_code == 202
    await finish(env, "demo/2", "cancelled")
    r = await land(env, bot["token"], URI_C[:-1] + "9")
    assert r.status_code == 429 and "last hour" in r.json()["error"]["message"]
    assert 3500 <= int(r.headers["retry-after"]) <= 3600
    assert 'submitqueue_quota_refusals_total{limit="per_hour",queue="demo"} 1.0' in \
        env.runtime.metrics.render(None)[0].decode()


async def test_whoami_in_open_mode_answers_what_authorize_allows(database_url: str) -> None:
    """Under SQ_AUTH=open anyone may land and cancel anywhere, a token limited to a queue
    included: whoami must not report a queue limit authorize() does not apply."""
    async with opened_env(database_url, policy=AccessPolicy(mode="open", admin_token=ADMIN)) \
            as env:
        bot = await token(env, "lane-bot", "land", queues=["demo"])
        who = (await env.client.get("/api/v1/auth/whoami",
                                    headers=bearer(bot["token"]))).json()
        assert who["actor"] == "lane-bot" and who["queues"] is None
        assert {"land", "cancel:any", "read"} <= set(who["scopes"])
        anon = (await env.client.get("/api/v1/auth/whoami")).json()
        assert anon["anonymous"] and anon["auth"] == "open" and "cancel:any" in anon["scopes"]
