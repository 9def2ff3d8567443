"""Schemathesis fuzzes the REST API from its own OpenAPI schema against the real app, on
SQLite and PostgreSQL (whose text columns refuse the NUL schemathesis puts in strings):
no 5xx, and every response matches the documented schema, status codes and types.
``tests/e2e/test_input_fuzz.py`` adds what a schema does not suggest (lone surrogates,
integers past int64, forged cursors)."""

from __future__ import annotations

import asyncio
import shutil
import threading
import uuid
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
from tests.conftest import BACKENDS, _pg_admin_sync, _pg_url_for
from tests.e2e.harness import ROOT, free_port


@pytest.fixture(scope="module", params=BACKENDS)
def live_server(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("fuzz")
    shutil.copyfile(ROOT / "queues.yaml", tmp / "queues.yaml")
    pg_name: str | None = None
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp / 'fuzz.db'}"
    else:
        template: str = request.getfixturevalue("pg_template")
        pg_name = f"sq_fuzz_{uuid.uuid4().hex[:10]}"
        _pg_admin_sync(f'CREATE DATABASE "{pg_name}" TEMPLATE "{template}"')
        url = _pg_url_for(pg_name)
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
        if pg_name:
            _pg_admin_sync(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


CHECKS = [
    not_a_server_error, status_code_conformance, content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.slow
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
