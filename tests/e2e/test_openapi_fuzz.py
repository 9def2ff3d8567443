"""Schemathesis fuzzes the REST API from its own OpenAPI schema against the real app:
no 5xx, and every response matches the documented schema, status codes and types."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from app.db.migrate import upgrade_sync
from app.main import create_app
from app.settings import Settings
from tests.e2e.harness import ROOT, free_port


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("fuzz")
    shutil.copyfile(ROOT / "queues.yaml", tmp / "queues.yaml")
    url = f"sqlite+aiosqlite:///{tmp / 'fuzz.db'}"
    upgrade_sync(url)
    app = create_app(Settings(_env_file=None, database_url=url,  # type: ignore[call-arg]
                              queues_file=tmp / "queues.yaml", log_level="WARNING"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           lifespan="on", log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        threading.Event().wait(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


CHECKS = [
    not_a_server_error, status_code_conformance, content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.timeout(600)
def test_api_conforms_to_its_schema(live_server: str) -> None:
    schema = schemathesis.openapi.from_url(f"{live_server}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6, [op.label for op in operations]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            case.call_and_validate(checks=CHECKS)

        check()
