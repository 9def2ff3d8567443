"""batch claims: one batch per batching intent of a request

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('batch_claims',
    sa.Column('queue', sa.String(length=100), nullable=False),
    sa.Column('request_id', sa.String(length=200), nullable=False),
    sa.Column('cause', sa.String(length=100), nullable=False),
    sa.Column('batch_id', sa.String(length=200), nullable=False),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('queue', 'request_id', 'cause', name=op.f('pk_batch_claims'))
    )


def downgrade() -> None:
    op.drop_table('batch_claims')
