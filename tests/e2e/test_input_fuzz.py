"""Hostile input against the real app, on SQLite and PostgreSQL, driven by hypothesis:
lone surrogates, NUL and other control characters, integers past int64 and JSON of the
wrong type (``true`` where a cursor holds a time) in land, list, search, cancel and the
admin API's drain and pause bodies, path segments, query strings and cursors.

Every answer is below 500 and, when it is an error, has the JSON error shape; a
refused request leaves every table it could have written exactly as it was.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.db.tables import admin_audit, change_uri_requests, counters, request_log
from app.db.tables import request_summaries as summaries
from app.queue.schema import queue_messages, queue_pauses
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, serve

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(600),
    pytest.mark.slow,
]

TOKEN = "ops:fuzz"
SHA = "0123456789abcdef0123456789abcdef01234567"
PHAB = "phab://phab.example.com/D12/3"
GIT = f"git://git.example.com/team/repo/refs%2Fheads%2Fmain/{SHA}"
INT64 = 2**63 - 1
WATCHED = (summaries, request_log, counters, change_uri_requests, admin_audit, queue_messages,
           queue_pauses)
NO_FILTERS = {"queue": "demo", "since_ms": None, "until_ms": None, "status": None,
              "change_uri": None}

# -- strategies -------------------------------------------------------------------------

SPECIAL = st.sampled_from(["\x00", "\ud800", "\udfff", "\udc80", "\x1b[31m", "\x7f", "\x08",
                           "\t", "\n", "\r", "\u2028", "\ufeff", "\U0010ffff", "é"])
TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(categories=["Cs", "Cc"]), min_size=1, max_size=4),
    st.builds(lambda a, b, c: a + b + c, st.text(max_size=8), SPECIAL, st.text(max_size=8)),
)
HUGE = st.one_of(st.integers(INT64 - 2, INT64 + 2), st.integers(2**63, 2**200),
                 st.integers(-(2**80), -1))
INT = st.one_of(HUGE, st.integers(0, 10**13), st.just(1))
JSON = st.one_of(st.none(), st.booleans(), INT, st.floats(allow_nan=False), TEXT,
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                        st.integers(), max_size=1))
CHANGE_URI = st.one_of(
    st.builds(lambda n: f"phab://phab.example.com/D{n}/1", st.integers(1, 10**9)),  # valid
    st.builds(lambda t: f"{PHAB}?sq-files={t}", TEXT),  # the grammar lets markers through
    st.builds(lambda t: GIT + t, TEXT),
    TEXT,
)


def cursor_of(after: list[Any], query: dict[str, Any] = NO_FILTERS) -> str:
    raw = json.dumps({"q": query, "after": after}).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


CURSOR = st.one_of(TEXT, st.builds(cursor_of, st.lists(JSON, min_size=2, max_size=2)),
                   st.builds(cursor_of, st.tuples(INT, TEXT).map(list)))


@dataclass
class Call:
    kind: str
    method: str
    path: str
    query: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    has_body: bool = False

    def url(self) -> str:
        def enc(v: Any) -> str:  # surrogates go out as their (invalid) UTF-8 bytes
            return quote(str(v).encode("utf-8", "surrogatepass"), safe="")

        qs = "&".join(f"{k}={enc(v)}" for k, v in self.query.items() if v is not None)
        return self.path + (f"?{qs}" if qs else "")


def seg(value: Any) -> str:
    return quote(str(value).encode("utf-8", "surrogatepass"), safe="")


def maybe(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), s)


def body_call(kind: str, path: str | st.SearchStrategy[str],
              body: st.SearchStrategy[Any]) -> st.SearchStrategy[Call]:
    paths = path if isinstance(path, st.SearchStrategy) else st.just(path)
    return st.builds(lambda p, b: Call(kind, "POST", p, body=b, has_body=True), paths, body)


LAND = body_call("land", st.sampled_from(["/api/v1/queues/demo/requests",
                                          "/api/v1/queues/squashy/requests"]),
                 st.one_of(st.fixed_dictionaries(
                     {"change_uris": st.lists(CHANGE_URI, min_size=1, max_size=3)},
                     optional={"strategy": st.one_of(st.sampled_from(["rebase", "merge"]),
                                                     JSON)}),
                           JSON))
LIST = st.one_of(
    st.builds(lambda q: Call("list", "GET", "/api/v1/queues/demo/requests", query=q),
              st.fixed_dictionaries({}, optional={
                  "since_ms": INT, "until_ms": INT, "change_uri": maybe(CHANGE_URI),
                  "limit": st.integers(-1, 300), "status": TEXT})),
    st.builds(lambda c: Call("list", "GET", "/api/v1/queues/demo/requests", query={"cursor": c}),
              CURSOR),
)
SEARCH = st.builds(lambda q, queue: Call("search", "GET", "/api/v1/search",
                                         query={"q": q, "queue": queue}),
                   st.one_of(CHANGE_URI, st.builds(lambda n: f"demo/{n}", INT), TEXT),
                   maybe(st.one_of(st.just("demo"), TEXT)))
CANCEL = body_call("cancel",
                   st.builds(lambda n: f"/api/v1/queues/demo/requests/{seg(n)}/cancel",
                             st.one_of(st.integers(1, 3), INT, TEXT)),
                   st.one_of(st.fixed_dictionaries({"reason": st.one_of(TEXT, JSON)}), JSON))
DRAIN = body_call("drain", st.builds(lambda t: f"/api/v1/admin/dlq/{seg(t)}/drain",
                                     st.one_of(st.just("build_dlq"), TEXT)),
                  st.fixed_dictionaries(
                      {"mode": st.one_of(st.sampled_from(["reconcile", "requeue", "discard"]),
                                         JSON)},
                      optional={"message_ids": maybe(st.lists(st.one_of(INT, TEXT, JSON),
                                                              max_size=3)),
                                "reason": st.one_of(TEXT, JSON), "limit": INT,
                                "cursor": maybe(st.one_of(TEXT, INT))}))
PAUSE = body_call("pause", st.builds(lambda t, a: f"/api/v1/admin/consumers/{seg(t)}/{a}",
                                     st.one_of(st.just("build"), TEXT),
                                     st.sampled_from(["pause", "resume"])),
                  st.fixed_dictionaries({}, optional={
                      "group": maybe(st.one_of(st.just("orchestrator"), TEXT)),
                      "partition_key": maybe(TEXT), "reason": st.one_of(TEXT, JSON)}))
ADMIN_READ = st.one_of(
    st.builds(lambda i: Call("admin_read", "GET", f"/api/v1/admin/dlq/build_dlq/messages/{seg(i)}"),
              st.one_of(INT, TEXT)),
    st.builds(lambda c: Call("admin_read", "GET", "/api/v1/admin/dlq/build_dlq/messages",
                             query={"cursor": c}), st.one_of(INT, TEXT)),
    st.builds(lambda c: Call("admin_read", "GET", "/api/v1/admin/audit", query={"cursor": c}),
              st.one_of(INT, TEXT)),
)
CALLS = st.one_of(LAND, LIST, SEARCH, CANCEL, DRAIN, PAUSE, ADMIN_READ)


# -- the test ---------------------------------------------------------------------------


async def fingerprint(server: Server) -> tuple[int, ...]:
    async with server.runtime.db.read() as s:
        return tuple([int((await s.execute(sa.select(sa.func.count()).select_from(t)))
                          .scalar_one()) for t in WATCHED])


async def test_hostile_input_is_a_4xx_and_writes_nothing(database_url: str,
                                                         tmp_path: Path) -> None:
    async with serve(database_url, tmp_path, admin_token=TOKEN, role="gateway") as server:
        for uri in (f"{PHAB}", GIT):  # something for cancels and searches to find
            await server.land(uri)
        loop = asyncio.get_running_loop()
        seen: Counter[tuple[str, str]] = Counter()

        def counts() -> tuple[int, ...]:
            return asyncio.run_coroutine_threadsafe(fingerprint(server), loop).result(30)

        def run() -> None:
            with httpx.Client(base_url=server.base_url, timeout=30,
                              headers={"Authorization": f"Bearer {TOKEN}"}) as client:

                @given(call=CALLS)
                @settings(max_examples=400, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                def check(call: Call) -> None:
                    before = counts()
                    kw: dict[str, Any] = {}
                    if call.has_body:
                        kw = {"content": json.dumps(call.body).encode(),
                              "headers": {"content-type": "application/json"}}
                    r = client.request(call.method, call.url(), **kw)
                    assert r.status_code < 500, (call, r.status_code, r.text)
                    seen[(call.kind, "ok" if r.status_code < 400 else "refused")] += 1
                    if r.status_code < 400:
                        return
                    body = r.json()
                    assert set(body) == {"error"}, (call, body)
                    assert set(body["error"]) == {"code", "message"}, (call, body)
                    assert all(isinstance(v, str) and v for v in body["error"].values())
                    assert counts() == before, (call, r.status_code, r.text)

                check()

        await asyncio.to_thread(run)
    # the strategies reach both sides of every endpoint's validation
    for kind in ("land", "list", "search", "cancel", "drain", "pause", "admin_read"):
        assert seen[(kind, "refused")] > 0, seen
    for kind in ("land", "list", "search", "pause"):
        assert seen[(kind, "ok")] > 0, seen
