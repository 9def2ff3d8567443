"""queue members: a claim records its holder's generation; a restart resumes its claims

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('queue_members',
    sa.Column('member_id', sa.String(length=255), nullable=False),
    sa.Column('generation', sa.BigInteger(), nullable=False),
    sa.Column('incarnation', sa.String(length=255), server_default='', nullable=False),
    sa.Column('started_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('heartbeat_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('stopped_at_ms', sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint('member_id', name=op.f('pk_queue_members'))
    )
    # Adding columns needs no table rebuild on SQLite (plain ALTER TABLE ADD COLUMN).
    with op.batch_alter_table('queue_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lease_generation', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('resumes', sa.Integer(), server_default='0',
                                      nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('queue_deliveries', schema=None) as batch_op:
        batch_op.drop_column('resumes')
        batch_op.drop_column('lease_generation')

    op.drop_table('queue_members')
