"""github deliveries: the X-GitHub-Delivery ids the webhook has taken

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

``github_deliveries`` holds each GitHub webhook delivery the gateway acted on, so a
redelivery (GitHub's "Redeliver" button, a retrying proxy) is acknowledged without
landing or cancelling twice.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('github_deliveries',
    sa.Column('delivery_id', sa.String(length=100), nullable=False),
    sa.Column('event', sa.String(length=50), nullable=False),
    sa.Column('received_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('outcome', sa.Text(), server_default='', nullable=False),
    sa.PrimaryKeyConstraint('delivery_id', name=op.f('pk_github_deliveries'))
    )
    with op.batch_alter_table('github_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_github_deliveries_received', ['received_at_ms'],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table('github_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_github_deliveries_received')
    op.drop_table('github_deliveries')
