"""build detail: what a build's runner last said of it; build runs by path

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

``builds`` gains ``detail``, the runner's last words on the build (e.g. the
``github_checks`` runner's ``no_ci_started: none of the required checks ...``), so the
speculate stage can say why a path's builds ended when it fails the batch. Existing
builds keep an empty detail. ``build_runs`` gains the index ``ix_build_runs_path``
(queue, path, attempt): a GitHub check webhook names a build by its branch
``sq/<queue>/<path>-<attempt>`` and wakes its runner's next poll.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('detail', sa.Text(), server_default='',
                                      nullable=False))
    op.create_index('ix_build_runs_path', 'build_runs', ['queue', 'path_id', 'attempt'],
                    unique=False)


def downgrade() -> None:
    op.drop_index('ix_build_runs_path', table_name='build_runs')
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.drop_column('detail')
