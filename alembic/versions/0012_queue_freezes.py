"""queue freezes: each merge queue's manual freeze

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

``queue_freezes`` holds the freeze a queue owner set with ``POST
/api/v1/queues/{queue}/freeze`` (``app/domain/freeze.py``), so every process of a
deployment sees it; scheduled windows are computed from ``queues.yaml``, not stored.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('queue_freezes',
    sa.Column('queue', sa.String(length=100), nullable=False),
    sa.Column('frozen', sa.Integer(), nullable=False),
    sa.Column('reason', sa.Text(), server_default='', nullable=False),
    sa.Column('frozen_by', sa.String(length=100), server_default='', nullable=False),
    sa.Column('since_ms', sa.BigInteger(), nullable=False),
    sa.Column('until_ms', sa.BigInteger(), nullable=False),
    sa.Column('allow_builds', sa.Integer(), nullable=False),
    sa.Column('allow_hotfix', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('updated_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('updated_by', sa.String(length=100), server_default='', nullable=False),
    sa.PrimaryKeyConstraint('queue', name=op.f('pk_queue_freezes'))
    )


def downgrade() -> None:
    op.drop_table('queue_freezes')
