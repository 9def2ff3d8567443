"""second chance: a batch minted for a request whose batch of one failed

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07

``batches.chance``: 1 for a batch that gives a request its second chance after its
batch of one failed its builds (``app/domain/second_chance.py``), 0 otherwise (every
existing row).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Adding a column needs no table rebuild on SQLite (plain ALTER TABLE ADD COLUMN).
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.add_column(sa.Column('chance', sa.Integer(), server_default='0',
                                      nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_column('chance')
