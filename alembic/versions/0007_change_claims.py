"""change claims and idempotency keys of land requests; landed commits of batches

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

Existing requests are backfilled: each change of a request that is neither ``error``
nor ``cancelled`` (nor a hidden ``accepting`` receipt) is claimed by the oldest such
request carrying it, ``landed`` ones as landed (their commit is unknown: "").
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.domain.change_uri import parse_change_uri
from app.domain.errors import ValidationError

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('change_claims',
    sa.Column('queue', sa.String(length=100), nullable=False),
    sa.Column('change_key', sa.String(length=1024), nullable=False),
    sa.Column('request_id', sa.String(length=200), nullable=False),
    sa.Column('change_uri', sa.String(length=1024), nullable=False),
    sa.Column('state', sa.String(length=10), nullable=False),
    sa.Column('landed_commit', sa.String(length=64), server_default='', nullable=False),
    sa.Column('claimed_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('queue', 'change_key', name=op.f('pk_change_claims'))
    )
    with op.batch_alter_table('change_claims', schema=None) as batch_op:
        batch_op.create_index('ix_change_claims_owner', ['queue', 'request_id'], unique=False)

    op.create_table('idempotency_keys',
    sa.Column('queue', sa.String(length=100), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('request_id', sa.String(length=200), nullable=False),
    sa.Column('body_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at_ms', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('queue', 'key', name=op.f('pk_idempotency_keys'))
    )
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.add_column(sa.Column('landed_json', sa.Text(), server_default='{}',
                                      nullable=False))
    _backfill_claims()


def _backfill_claims() -> None:
    summaries = sa.table(
        'request_summaries', sa.column('queue'), sa.column('request_id'),
        sa.column('change_uris_json'), sa.column('status'), sa.column('received_at_ms'),
    )
    rows = op.get_bind().execute(
        sa.select(summaries)
        .where(summaries.c.status.notin_(['accepting', 'error', 'cancelled']))
        .order_by(summaries.c.received_at_ms, summaries.c.request_id)
    ).all()
    claims: dict[tuple[str, str], dict[str, object]] = {}
    for r in rows:
        for uri in json.loads(r.change_uris_json or '[]'):
            try:
                key = parse_change_uri(uri).identity
            except ValidationError:
                continue  # not a URI the gateway accepts today: nothing to claim
            claims.setdefault((r.queue, key), {
                'queue': r.queue, 'change_key': key, 'request_id': r.request_id,
                'change_uri': uri, 'state': 'landed' if r.status == 'landed' else 'live',
                'landed_commit': '', 'claimed_at_ms': r.received_at_ms,
            })
    if claims:
        table = sa.table('change_claims', *(sa.column(c) for c in (
            'queue', 'change_key', 'request_id', 'change_uri', 'state', 'landed_commit',
            'claimed_at_ms')))
        op.bulk_insert(table, list(claims.values()))


def downgrade() -> None:
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_column('landed_json')
    op.drop_table('idempotency_keys')
    with op.batch_alter_table('change_claims', schema=None) as batch_op:
        batch_op.drop_index('ix_change_claims_owner')
    op.drop_table('change_claims')
