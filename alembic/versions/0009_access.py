"""access: API tokens; who submitted each request

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

``api_tokens`` holds each token's label, scopes, queues and the scrypt hash of its
secret. ``request_summaries`` gains ``submitted_by`` (the actor; "" for requests
accepted before this revision) and an index for the per-actor quotas.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.String(length=12), nullable=False),
    sa.Column('label', sa.String(length=100), nullable=False),
    sa.Column('scopes_json', sa.Text(), nullable=False),
    sa.Column('queues_json', sa.Text(), server_default='null', nullable=False),
    sa.Column('secret_hash', sa.String(length=200), nullable=False),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.Column('created_by', sa.String(length=100), server_default='', nullable=False),
    sa.Column('expires_at_ms', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('last_used_at_ms', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('revoked_at_ms', sa.BigInteger(), server_default='0', nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens'))
    )
    with op.batch_alter_table('request_summaries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('submitted_by', sa.String(length=100),
                                      server_default='', nullable=False))
        batch_op.create_index('ix_request_summaries_actor',
                              ['queue', 'submitted_by', 'received_at_ms'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('request_summaries', schema=None) as batch_op:
        batch_op.drop_index('ix_request_summaries_actor')
        batch_op.drop_column('submitted_by')
    op.drop_table('api_tokens')
