"""The published OpenAPI schema: what a client generator or the docs page sees."""

from __future__ import annotations

import shutil
from pathlib import Path

from app.main import create_app
from app.settings import Settings
from tests.e2e.harness import ROOT


def test_the_openapi_schema_shows_the_admin_bearer_scheme_and_every_response_shape(
    tmp_path: Path,
) -> None:
    """Admin routes declare HTTPBearer (the schema names the scheme, so clients and the
    docs page know to send a token) and a response model each (no bare objects)."""
    shutil.copyfile(ROOT / "queues.yaml", tmp_path / "queues.yaml")
    settings = Settings(_env_file=None,  # type: ignore[call-arg]
                        database_url=f"sqlite+aiosqlite:///{tmp_path / 'sq.db'}",
                        queues_file=tmp_path / "queues.yaml")
    spec = create_app(settings).openapi()
    assert spec["components"]["securitySchemes"]["ApiToken"] == {
        "type": "http", "scheme": "bearer", "description": spec["components"][
            "securitySchemes"]["ApiToken"]["description"]}
    admin = {(path, method): op for path, ops in spec["paths"].items()
             if path.startswith("/api/v1/admin") for method, op in ops.items()}
    assert len(admin) == 11  # 8, and the tokens' create, list and revoke
    for (path, method), op in admin.items():
        assert op["security"] == [{"ApiToken": []}], (path, method)
        status = "201" if (path, method) == ("/api/v1/admin/tokens", "post") else "200"
        ok = op["responses"][status]["content"]["application/json"]["schema"]
        assert "$ref" in ok, (path, method, ok)  # a named model, not "object"
