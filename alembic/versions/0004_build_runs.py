"""build runs of the command and webhook build runners

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('build_runs',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('queue', sa.String(length=100), nullable=False),
    sa.Column('runner', sa.String(length=30), nullable=False),
    sa.Column('batch_id', sa.String(length=200), nullable=False),
    sa.Column('path_id', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=30), nullable=False),
    sa.Column('owner', sa.String(length=200), server_default='', nullable=False),
    sa.Column('owner_group', sa.String(length=1024), server_default='', nullable=False),
    sa.Column('detail', sa.Text(), server_default='', nullable=False),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('log_url', sa.Text(), server_default='', nullable=False),
    sa.Column('pid', sa.Integer(), nullable=True),
    sa.Column('heartbeat_ms', sa.BigInteger(), nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('log', sa.Text(), server_default='', nullable=False),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('updated_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_build_runs'))
    )
    with op.batch_alter_table('build_runs', schema=None) as batch_op:
        batch_op.create_index('ix_build_runs_owner', ['owner', 'status'], unique=False)
        batch_op.create_index('ix_build_runs_owner_group', ['owner_group', 'status'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('build_runs', schema=None) as batch_op:
        batch_op.drop_index('ix_build_runs_owner_group')
        batch_op.drop_index('ix_build_runs_owner')

    op.drop_table('build_runs')
