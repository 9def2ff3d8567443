"""Bad input never reaches the database, on SQLite and PostgreSQL: lone surrogates, NUL
and control characters in change URIs, filters, search terms and cancel reasons;
integers past int64 in list bounds and cursors; a ``true`` where a cursor holds a time.
Each is a 4xx naming the field, with nothing written. (These were 500s; NUL only on
PostgreSQL, whose text columns refuse it.)"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from app.api.errors import response_for
from app.db.tables import request_log as log_t
from app.db.tables import request_summaries as sum_t
from app.domain.errors import ValidationError
from app.domain.messages import CANCEL
from tests.conftest import BACKENDS
from tests.support.gateway import SHA, URI_A, URI_B, Env, error, land

pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)

INT64 = 2**63 - 1
LIST = "/api/v1/queues/demo/requests"
PHAB = "phab://phab.example.com/D12/3"
NO_CURSOR_QUERY = {"queue": "demo", "since_ms": None, "until_ms": None, "status": None,
                   "change_uri": None}


def raw_json(body: Any) -> dict[str, Any]:
    """A request whose JSON keeps lone surrogates as ``\\ud800`` escapes (as a client's
    JSON encoder writes them)."""
    return {"content": json.dumps(body), "headers": {"content-type": "application/json"}}


def cursor_of(after: list[Any], query: dict[str, Any] = NO_CURSOR_QUERY) -> str:
    raw = json.dumps({"q": query, "after": after}).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(("uri", "what"), [
    (f"github://github.com/acme/widgets/pull/1/{SHA}\ud800", "lone surrogate (U+D800)"),
    (f"{PHAB}?sq-files=a\x00b", "NUL (U+0000)"),  # passes the URI grammar: markers are free
    (f"{PHAB}?sq-files=a\x1b[31m", "control character (U+001B)"),
    (f"{PHAB}?sq-files=a\nb", "control character (U+000A)"),
])
async def test_land_refuses_change_uris_with_unstorable_text(
    env: Env, uri: str, what: str
) -> None:
    r = await env.client.post(LIST, **raw_json({"change_uris": [URI_A, uri]}))
    assert r.status_code == 422, r.text
    err = error(r)
    assert err["code"] == "invalid_request"
    assert err["message"].startswith("invalid request: change_uris.1: ") and what in err["message"]
    await env.assert_nothing_written()


async def test_error_bodies_encode_whatever_text_they_echo(env: Env) -> None:
    r = await env.client.post(LIST, **raw_json({"change_uris": [URI_A], "x\ud800": 1}))
    assert r.status_code == 422 and "request body" in error(r)["message"]
    await env.assert_nothing_written()
    # a message quoting client text verbatim still encodes, with the surrogate escaped
    body = json.loads(response_for(ValidationError("bad key 'x\ud800'")).body)
    assert body == {"error": {"code": "validation_error", "message": "bad key 'x\\ud800'"}}


@pytest.mark.parametrize("name", ["since_ms", "until_ms"])
async def test_list_bounds_stop_at_int64(env: Env, name: str) -> None:
    await land(env, URI_A)
    for value in (2**63, 2**64 + 5, 10**30):
        r = await env.client.get(LIST, params={name: value})
        assert r.status_code == 422, r.text
        assert f"query parameter '{name}'" in error(r)["message"]
        assert str(INT64) in error(r)["message"]
    r = await env.client.get(LIST, params={name: INT64})
    assert r.status_code == 200
    expected = ["demo/1"] if name == "until_ms" else []
    assert [i["sqid"] for i in r.json()["items"]] == expected


@pytest.mark.parametrize("after", [
    [True, "demo/1"], [False, "demo/1"], [2**63, "demo/1"], [10**40, "demo/1"], [-1, "demo/1"],
    [1.5, "demo/1"], [1, "demo/1\x00"], [1, "demo/\ud800"], [1, ""], [1, "x" * 300],
    [1, 5], [None, "demo/1"],
])
async def test_list_refuses_forged_cursors(env: Env, after: list[Any]) -> None:
    await land(env, URI_A)
    r = await env.client.get(LIST, params={"cursor": cursor_of(after)})
    assert r.status_code == 400, r.text
    assert error(r) == {"code": "validation_error", "message": "cursor is malformed; pass "
                        "next_cursor exactly as a previous page returned it"}


async def test_a_cursor_at_the_int64_edge_still_pages(env: Env) -> None:
    await land(env, URI_A)
    r = await env.client.get(LIST, params={"cursor": cursor_of([INT64, "demo/9"])})
    assert r.status_code == 200 and [i["sqid"] for i in r.json()["items"]] == ["demo/1"]


@pytest.mark.parametrize(("path", "param", "value"), [
    (LIST, "change_uri", f"{PHAB}\x00"),
    (LIST, "change_uri", f"{PHAB}\x07"),
    (LIST, "cursor", "e30\x00"),
    ("/api/v1/search", "q", f"git://a.example.com/r/refs%2Fheads%2Fm/{SHA}\x00"),
    ("/api/v1/search", "q", "demo/1\x00"),
    ("/api/v1/search", "queue", "demo\x00"),
])
async def test_filters_and_search_refuse_nul_and_control_characters(
    env: Env, path: str, param: str, value: str
) -> None:
    await land(env, URI_A)
    params = {param: value} if param != "queue" else {"q": "1", "queue": value}
    r = await env.client.get(path, params=params)
    assert r.status_code == 422, r.text
    assert f"query parameter '{param}'" in error(r)["message"]


@pytest.mark.parametrize("reason", ["stop\x00now", "stop\ud800", "bell\x07"])
async def test_cancel_refuses_an_unstorable_reason_and_writes_nothing(
    env: Env, reason: str
) -> None:
    await land(env, URI_B)
    before = await env.count(log_t)
    r = await env.client.post(f"{LIST}/1/cancel", **raw_json({"reason": reason}))
    assert r.status_code == 422, r.text
    assert error(r)["message"].startswith("invalid request: reason: ")
    assert await env.count(log_t) == before  # no `cancelling` recorded
    assert await env.messages(CANCEL) == []
    assert (await env.client.get(f"{LIST}/1")).json()["status"] == "accepted"


async def test_free_text_keeps_tabs_and_newlines(env: Env) -> None:
    await land(env, URI_B)
    r = await env.client.post(f"{LIST}/1/cancel", json={"reason": "line one\n\tline two"})
    assert r.status_code == 202
    [msg] = await env.messages(CANCEL)
    assert msg.payload["reason"] == "line one\n\tline two"
    assert await env.count(sum_t) == 1


async def test_request_numbers_past_int64_are_refused(env: Env) -> None:
    for path in (f"{LIST}/{2**63}", f"{LIST}/{2**63}/history", f"{LIST}/{10**30}/cancel"):
        method = env.client.post if path.endswith("cancel") else env.client.get
        r = await method(path)
        assert r.status_code == 422, (path, r.text)
        assert "path parameter 'n'" in error(r)["message"]
    await env.assert_nothing_written()
