"""The pages' search (``GET /api/v1/search``): a sqid (``demo/12``; a bare number with
``queue``), a batch id (``demo/batch/3``: its requests, in order) or an exact change URI
(every configured queue). At most :data:`SEARCH_LIMIT` hits; an empty, oversized (over
:data:`MAX_QUERY` characters) or unrecognisable query -> ``ValidationError``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from app.db.repos import batches as batch_repo
from app.db.repos import views as view_repo
from app.domain.entities import RequestSummary
from app.domain.errors import ValidationError
from app.domain.ids import request_number
from app.views.data import ReadRuntime
from app.views.schemas import SearchHitOut, SearchOut

SEARCH_LIMIT = 20
MAX_QUERY = 1024

_SQID = re.compile(r"^(?P<queue>[A-Za-z0-9][A-Za-z0-9._-]{0,99})/(?P<n>[1-9][0-9]{0,17})$")
_BATCH = re.compile(r"^(?P<queue>[A-Za-z0-9][A-Za-z0-9._-]{0,99})/batch/[1-9][0-9]{0,17}$")


async def search(rt: ReadRuntime, queues: Sequence[str], q: str,
                 queue: str | None) -> SearchOut:
    """Find requests by sqid, batch id or exact change URI in the configured ``queues``."""
    text = q.strip()
    if not text:
        raise ValidationError("q is empty; search for a sqid like demo/12 or a change URI")
    if len(text) > MAX_QUERY:
        raise ValidationError(f"q is longer than {MAX_QUERY} characters; a change URI is at "
                              f"most {MAX_QUERY} bytes")
    if text.isdigit() and queue:
        text = f"{queue}/{text}"
    b = _BATCH.match(text)
    if b:
        if b["queue"] not in queues:
            return SearchOut(query=text, kind="batch", items=[])
        async with rt.db.read() as s:
            found_batch = await batch_repo.get_many(s, queue=b["queue"], ids={text})
            members = [m for x in found_batch.values() for m in x.contains]
            found = await view_repo.summaries(s, queue=b["queue"], request_ids=members)
        return SearchOut(query=text, kind="batch",
                         items=[_hit(found[m]) for m in members if m in found])
    m = _SQID.match(text)
    if m:
        if m["queue"] not in queues:
            return SearchOut(query=text, kind="sqid", items=[])
        async with rt.db.read() as s:
            found = await view_repo.summaries(s, queue=m["queue"], request_ids=[text])
        return SearchOut(query=text, kind="sqid", items=[_hit(x) for x in found.values()])
    if "://" not in text:
        raise ValidationError(f"q {text[:80]!r} is neither a sqid (like demo/12) nor a change "
                              "URI (like git://host/repo/refs%2Fheads%2Fbranch/<sha>)")
    async with rt.db.read() as s:
        keys = await view_repo.requests_of_change_uri(s, queues=list(queues),
                                                      change_uri=text, limit=SEARCH_LIMIT)
        items: list[SearchHitOut] = []
        for qn, rid in keys:
            found = await view_repo.summaries(s, queue=qn, request_ids=[rid])
            items.extend(_hit(x) for x in found.values())
    return SearchOut(query=text, kind="change_uri", items=items)


def _hit(s: RequestSummary) -> SearchHitOut:
    return SearchHitOut(sqid=s.request_id, queue=s.queue, status=s.status,
                        received_at_ms=s.received_at_ms, change_uris=list(s.change_uris),
                        page=f"/queues/{s.queue}/requests/{request_number(s.request_id)}")
