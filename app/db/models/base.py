"""What every table model shares: the one ``MetaData`` (SQLModel's, with the naming
convention the migrations were written with), the column sizes, and helpers that
spell a column's exact SQL type, nullability and server default.

The naming convention is set here, before any model is declared, because a
constraint takes its name when its table is built.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

metadata = SQLModel.metadata
metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

Q = 100  # queue name length
ID = 200  # request / batch / build / path ids
URI = 1024
PATH_ID = 64  # a speculation path's id (a digest)
STATE = 30  # a state / status name
SHA = 64  # a git object id (sha1 hex is 40; sha256 is 64)

# An autoincrement id: BIGINT on PostgreSQL, INTEGER (the rowid alias) on SQLite.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def pk(length: int) -> Any:
    """A ``VARCHAR(length)`` part of the primary key."""
    return Field(primary_key=True, sa_type=sa.String(length))


def string(length: int, *, server_default: str | None = None) -> Any:
    """A ``VARCHAR(length) NOT NULL``, with that server default if one is given."""
    if server_default is None:
        return Field(sa_type=sa.String(length))
    return Field(default=server_default, sa_type=sa.String(length),
                 sa_column_kwargs={"server_default": server_default})


def text(*, server_default: str | None = None) -> Any:
    """A ``TEXT NOT NULL`` (JSON columns, ``*_json``, are text too), with that server
    default if one is given."""
    if server_default is None:
        return Field(sa_type=sa.Text)
    return Field(default=server_default, sa_type=sa.Text,
                 sa_column_kwargs={"server_default": server_default})


def millis() -> Any:
    """A ``BIGINT NOT NULL`` epoch-milliseconds timestamp (``*_ms``)."""
    return Field(sa_type=sa.BigInteger)


def integer(*, server_default: int | None = None) -> Any:
    """An ``INTEGER NOT NULL``, with that server default if one is given."""
    if server_default is None:
        return Field(sa_type=sa.Integer)
    return Field(default=server_default, sa_type=sa.Integer,
                 sa_column_kwargs={"server_default": str(server_default)})


def serial_id() -> Any:
    """An autoincrement primary key: ``None`` until the database assigns it."""
    return Field(default=None, primary_key=True, sa_type=BigId,
                 sa_column_kwargs={"autoincrement": True})


def table_of(model: type[SQLModel]) -> sa.Table:
    """The Core ``Table`` a model maps to (what the repositories' statements use)."""
    table = model.__table__  # type: ignore[attr-defined]
    assert isinstance(table, sa.Table)
    return table
