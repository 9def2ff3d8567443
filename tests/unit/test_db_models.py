"""The SQLModel table models: each field's Python type agrees with its column's SQL
type (as SQLite compiles it) and nullability, and ``app.db.tables`` exposes each
model's table under the table's name."""

from __future__ import annotations

import types
import typing

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlmodel import SQLModel

from app.db import models, tables

MODELS: list[type[SQLModel]] = [getattr(models, name) for name in models.__all__
                                if name.endswith("Row")]
PYTHON_TYPE = {sa.String: str, sa.Text: str, sa.Integer: int, sa.BigInteger: int,
               sa.Boolean: bool}


def _python_type(column: sa.Column[object]) -> type:
    impl = column.type.dialect_impl(sqlite.dialect())
    for sql_type, python_type in PYTHON_TYPE.items():
        if isinstance(impl, sql_type):
            return python_type
    raise AssertionError(f"{column} has an unexpected type {column.type!r}")


def test_every_application_table_has_a_model() -> None:
    assert sorted(models.table_of(m).name for m in MODELS) == sorted(tables.metadata.tables)
    assert len(MODELS) == 20  # 16, trunk_epochs (0008), api_tokens (0009), github_deliveries
    # (0010), queue_freezes (0011)
    for model in MODELS:
        table = models.table_of(model)
        assert getattr(tables, table.name) is table


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_field_types_match_the_columns(model: type[SQLModel]) -> None:
    table = models.table_of(model)
    hints = typing.get_type_hints(model)
    assert list(model.model_fields) == [c.name for c in table.columns]
    for column in table.columns:
        hint = hints[column.name]
        args = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
        # an autoincrement id is None until the database assigns it, yet NOT NULL
        serial = column.primary_key and column.autoincrement is True
        assert (type(None) in args) == (bool(column.nullable) or serial), column
        assert args - {type(None)} == {_python_type(column)}, column
