"""priority: a request's priority, a batch's priority and the batches it overtook

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

``requests.priority``, ``request_summaries.priority`` and ``batches.priority`` (``normal``, ``high``, ``hotfix``; every
existing row is ``normal``) and ``batches.overtakes_json``: the conflicting batches of a
lower priority, not yet merging, that a batch went ahead of (``[]`` for existing rows).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Adding columns needs no table rebuild on SQLite (plain ALTER TABLE ADD COLUMN).
    with op.batch_alter_table('requests', schema=None) as batch_op:
        batch_op.add_column(sa.Column('priority', sa.String(length=30),
                                      server_default='normal', nullable=False))
    with op.batch_alter_table('request_summaries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('priority', sa.String(length=30),
                                      server_default='normal', nullable=False))
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.add_column(sa.Column('priority', sa.String(length=30),
                                      server_default='normal', nullable=False))
        batch_op.add_column(sa.Column('overtakes_json', sa.Text(), server_default='[]',
                                      nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_column('overtakes_json')
        batch_op.drop_column('priority')
    with op.batch_alter_table('request_summaries', schema=None) as batch_op:
        batch_op.drop_column('priority')
    with op.batch_alter_table('requests', schema=None) as batch_op:
        batch_op.drop_column('priority')
