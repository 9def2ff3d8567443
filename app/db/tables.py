"""Application tables (SQLModel). The queue's tables live in ``app/queue/schema.py``.

Both metadata objects are handed to Alembic (``alembic/env.py``).
"""

from __future__ import annotations

from sqlmodel import SQLModel

metadata = SQLModel.metadata
