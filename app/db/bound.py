"""Statements built once at import, their values bound per call: building a SQLAlchemy
statement costs more than running it (a lookup by key: about 55 of its 100 us on
SQLite, 70 of 170 on PostgreSQL), while a statement object is immutable and its
compiled form cached, so sharing one between calls and tasks is safe."""

from __future__ import annotations

from typing import Any, TypeVar

import sqlalchemy as sa

S = TypeVar("S", bound=sa.Select[Any])


def where_bound(stmt: S, table: sa.Table, *equal: str, within: str | None = None) -> S:
    """``stmt`` filtered on each column named in ``equal`` being the value bound under
    its name, and on ``within`` being in the list bound under its name."""
    conditions = [table.c[name] == sa.bindparam(name) for name in equal]
    if within is not None:
        conditions.append(table.c[within].in_(sa.bindparam(within, expanding=True)))
    return stmt.where(*conditions)
