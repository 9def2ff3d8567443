"""The API documentation (``/docs``, ``/openapi.json``): every operation says what it
does and shows an example, each example fits its schema, and the docs show how to
authenticate (the bearer token on the admin API, the HMAC header on CI's callback)."""

from __future__ import annotations

import json
import shutil
import types
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import BaseRoute

from app.api import examples
from app.main import create_app
from app.settings import Settings
from tests.e2e.harness import ROOT

pytestmark = pytest.mark.timeout(60)
Op = tuple[str, str, dict[str, Any]]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    tmp = tmp_path_factory.mktemp("docs")
    shutil.copyfile(ROOT / "queues.yaml", tmp / "queues.yaml")
    return create_app(Settings(_env_file=None,  # type: ignore[call-arg]
                               database_url=f"sqlite+aiosqlite:///{tmp / 'sq.db'}",
                               queues_file=Path(tmp / "queues.yaml")))


@pytest.fixture(scope="module")
def spec(app: FastAPI) -> dict[str, Any]:
    return app.openapi()


def _api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    """Every APIRoute, also inside routers FastAPI keeps included lazily."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _api_routes(inner.routes)


def _operations(spec: dict[str, Any]) -> Iterator[Op]:
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            yield path, method, op


def _success(op: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    code = min(c for c in op["responses"] if c.startswith("2"))
    return code, op["responses"][code]


def _media_examples(media: dict[str, Any]) -> list[Any]:
    found = [media["example"]] if "example" in media else []
    return found + [e["value"] for e in media.get("examples", {}).values()]


def _schema_examples(schema: dict[str, Any], spec: dict[str, Any]) -> list[Any]:
    """The ``examples`` of a schema, through ``$ref`` and ``anyOf`` (an optional body)."""
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    found = list(schema.get("examples", []))
    for alt in schema.get("anyOf", []):
        found += _schema_examples(alt, spec)
    return found


def _request_examples(op: dict[str, Any], spec: dict[str, Any]) -> list[Any]:
    media = op["requestBody"]["content"]["application/json"]
    return _media_examples(media) + _schema_examples(media["schema"], spec)


def _invalid(example: Any, schema: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    validator = jsonschema_rs.Draft202012Validator(
        {**schema, "components": spec["components"]})
    return [f"{list(e.instance_path)}: {e.message}" for e in validator.iter_errors(example)]


def test_every_operation_has_its_own_summary_and_a_description(app: FastAPI,
                                                               spec: dict[str, Any]) -> None:
    routes = [r for r in _api_routes(app.routes) if r.include_in_schema]
    assert len(routes) == sum(1 for _ in _operations(spec)) >= 26
    # FastAPI makes a summary of the function's name ("Dlq Topics") when none is given
    assert [r.path for r in routes if not r.summary] == []
    for path, method, op in _operations(spec):
        assert op.get("summary") and len(op.get("description", "")) >= 100, (method, path)


def test_every_operation_shows_an_example_answer_and_an_example_body(
        spec: dict[str, Any]) -> None:
    for path, method, op in _operations(spec):
        code, ok = _success(op)
        shown = [x for media in ok.get("content", {}).values() for x in _media_examples(media)]
        if code == "204":
            assert "content" not in ok, (method, path)
        else:
            assert shown, (method, path, code)
        if "requestBody" in op:
            assert _request_examples(op, spec), (method, path)
        else:
            assert code != "204", (method, path)  # no body and no answer: nothing shown
        for status, response in op["responses"].items():  # errors show the error body
            media = response.get("content", {}).get("application/json")
            if status >= "400" and media is not None:
                assert _media_examples(media) + _schema_examples(media["schema"], spec), (
                    method, path, status)


def test_every_example_fits_its_schema(spec: dict[str, Any]) -> None:
    checked = 0
    for path, method, op in _operations(spec):
        for code, response in op["responses"].items():
            for media_type, media in response.get("content", {}).items():
                schema = media.get("schema", {})
                for example in _media_examples(media) + _schema_examples(schema, spec):
                    assert _invalid(example, schema, spec) == [], (method, path, code,
                                                                   media_type)
                    checked += 1
        if "requestBody" in op:
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            for example in _request_examples(op, spec):
                assert _invalid(example, schema, spec) == [], (method, path, "body")
                checked += 1
    assert checked >= 40


def test_the_check_catches_an_example_that_does_not_fit(spec: dict[str, Any]) -> None:
    schema = {"$ref": "#/components/schemas/LandAccepted"}
    assert _invalid(examples.example("LAND_ACCEPTED"), schema, spec) == []
    assert _invalid({"sqid": "demo/1", "queue": "demo"}, schema, spec) != []


def _body_models(app: FastAPI) -> Iterator[tuple[str, type[BaseModel]]]:
    for route in _api_routes(app.routes):
        if route.body_field is not None:
            annotation = route.body_field.field_info.annotation
            options = typing.get_args(annotation) if isinstance(
                annotation, types.UnionType) else (annotation,)
            for model in options:
                if isinstance(model, type) and issubclass(model, BaseModel):
                    yield route.path, model


def test_every_example_in_the_file_is_shown(spec: dict[str, Any]) -> None:
    text = json.dumps(spec)
    unused = [name for name in examples.names()
              if json.dumps(examples.example(name)) not in text]
    assert unused == []


def test_request_examples_are_accepted_by_their_models(app: FastAPI) -> None:
    """Stricter than the schema: the models' validators (SafeLine, extra="forbid")."""
    from app.extensions.builds.webhook import CallbackBody

    models = dict(_body_models(app))
    assert len(models) >= 5
    for path, model in models.items():
        shown = model.model_json_schema().get("examples", [])
        assert shown, (path, model.__name__)
        for example in shown:
            model.model_validate(example)
    CallbackBody.model_validate(examples.example("BUILD_STATUS_IN"))  # shown by openapi_extra


def test_admin_operations_need_the_bearer_token_and_ci_signs_its_callback(
        spec: dict[str, Any]) -> None:
    schemes = spec["components"]["securitySchemes"]
    assert schemes["ApiToken"]["type"] == "http" and schemes["ApiToken"]["scheme"] == "bearer"
    admin = [(path, method, op) for path, method, op in _operations(spec)
             if path.startswith("/api/v1/admin/")]
    assert len(admin) == 11
    for path, method, op in admin:
        assert op["security"] == [{"ApiToken": []}], (method, path)
    hmac = schemes["CallbackSignature"]
    assert (hmac["type"], hmac["in"], hmac["name"]) == ("apiKey", "header",
                                                         "X-SubmitQueue-Signature")
    assert "HMAC-SHA256" in hmac["description"] and "t=" in hmac["description"]
    callback = spec["paths"]["/api/v1/builds/{build_id}/status"]["post"]
    assert callback["security"] == [{"CallbackSignature": []}]
    assert "X-SubmitQueue-Signature" in callback["description"]
