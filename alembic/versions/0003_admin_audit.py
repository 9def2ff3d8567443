"""admin audit log

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('admin_audit',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at_ms', sa.BigInteger(), nullable=False),
    sa.Column('actor', sa.String(length=100), nullable=False),
    sa.Column('action', sa.String(length=50), nullable=False),
    sa.Column('topic', sa.String(length=255), server_default='', nullable=False),
    sa.Column('message_ids_json', sa.Text(), server_default='[]', nullable=False),
    sa.Column('reason', sa.Text(), server_default='', nullable=False),
    sa.Column('result_json', sa.Text(), server_default='{}', nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_admin_audit')),
    sqlite_autoincrement=True
    )
    with op.batch_alter_table('admin_audit', schema=None) as batch_op:
        batch_op.create_index('ix_admin_audit_at', ['at_ms'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('admin_audit', schema=None) as batch_op:
        batch_op.drop_index('ix_admin_audit_at')

    op.drop_table('admin_audit')
