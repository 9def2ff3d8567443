"""The answers the OpenAPI schema (``/docs``, ``/openapi.json``) shows for each operation.

``examples.json`` holds real answers of a server on the repository's ``queues.yaml``
(demo and sandbox queues): ``demo/1`` landed, ``demo/2`` cancelled while it built, a
build that dead-lettered with its DLQ paused, then drained; an API token created,
used and revoked. Lists are cut to one or two items. ``BUILD_LOG`` follows the command
runner's log lines (``app/extensions/builds/command.py``) and ``EVENTS`` the SSE frames
of ``app/api/events.py``. Request bodies carry theirs on their models
(``json_schema_extra``). ``tests/integration/test_openapi_docs.py`` validates every
example against its schema, so a changed model fails there until its example follows.

```python
@router.get("/topics", response_model=TopicsOut, responses=ok(200, "TOPICS"))
```

``install_examples(app)`` (``app/api/app_routes.py``) puts them in the generated schema
whole (FastAPI would drop their ``null`` values).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI

_FILE = Path(__file__).with_name("examples.json")
MARKER = "x-sq-example"  # names the example in the generated schema; removed from it


@cache
def _all() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_FILE.read_text(encoding="utf-8"))
    return data


def names() -> list[str]:
    """Every example's name."""
    return list(_all())


def example(name: str) -> Any:
    """One example by name (``KeyError`` for a name the file lacks)."""
    return _all()[name]


def media(name: str) -> dict[str, Any]:
    """A media object (``content: {type: ...}``) that shows example ``name``."""
    return {"example": example(name), MARKER: name}


def ok(status: int, name: str, media_type: str = "application/json",
       description: str | None = None) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses=`` entry that shows example ``name`` for ``status``."""
    entry: dict[str, Any] = {"content": {media_type: media(name)}}
    if description:
        entry["description"] = description
    return {status: entry}


def install_examples(app: FastAPI) -> None:
    """Make ``app.openapi()`` show the examples whole. FastAPI drops every ``None``
    from the schema it generates, examples included (a ``"last_used_at_ms": null``
    would vanish and the example would no longer fit its schema), so each media
    object made by ``media()`` gets its example back, by name, once generated."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _restore(generate())
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented hook


def _restore(node: Any) -> None:
    if isinstance(node, dict):
        name = node.pop(MARKER, None)
        if name is not None:
            node["example"] = example(name)
        for value in node.values():
            _restore(value)
    elif isinstance(node, list):
        for value in node:
            _restore(value)
