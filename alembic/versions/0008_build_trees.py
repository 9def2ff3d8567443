"""exact trees: what each build tested; the trunk's epochs (moves outside the queue)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

``builds`` gains the tested base tip, commit, tree and changes, and the trunk epoch it
was triggered in; ``build_runs`` the runner's record of the same (``tested_json``).
``trunk_epochs`` has one row per move of a target outside the queue the merger found.
Existing builds keep empty values: they recorded no tree.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('base_sha', sa.String(length=64), server_default='',
                                      nullable=False))
        batch_op.add_column(sa.Column('commit_sha', sa.String(length=64), server_default='',
                                      nullable=False))
        batch_op.add_column(sa.Column('tree_sha', sa.String(length=64), server_default='',
                                      nullable=False))
        batch_op.add_column(sa.Column('changes_json', sa.Text(), server_default='[]',
                                      nullable=False))
        batch_op.add_column(sa.Column('epoch', sa.Integer(), server_default='0',
                                      nullable=False))
    with op.batch_alter_table('build_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tested_json', sa.Text(), server_default='',
                                      nullable=False))
    op.create_table('trunk_epochs',
    sa.Column('queue', sa.String(length=100), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('tip_sha', sa.String(length=64), nullable=False),
    sa.Column('batch_id', sa.String(length=200), server_default='', nullable=False),
    sa.Column('rebuilt', sa.Integer(), server_default='0', nullable=False),
    sa.Column('outside', sa.Boolean(), server_default=sa.true(), nullable=False),
    sa.Column('detected_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('queue', 'epoch', name=op.f('pk_trunk_epochs'))
    )


def downgrade() -> None:
    op.drop_table('trunk_epochs')
    with op.batch_alter_table('build_runs', schema=None) as batch_op:
        batch_op.drop_column('tested_json')
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.drop_column('epoch')
        batch_op.drop_column('changes_json')
        batch_op.drop_column('tree_sha')
        batch_op.drop_column('commit_sha')
        batch_op.drop_column('base_sha')
