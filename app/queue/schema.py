"""Tables of the durable queue (SQLAlchemy Core), used by the migrations.

The queue's own SQL (``app/queue/sql.py``) names these tables and columns directly.

- ``queue_messages``: every published message, kept after it is consumed (until
  garbage collection) so that a duplicate publish is recognised. Dead letters are
  messages of the ``{topic}_dlq`` topic that also record the failure. A message is
  *settled* once no group has a delivery of it left; *parked* messages (failures
  nobody will consume) stay unsettled until an operator requeues or discards them.
- ``queue_deliveries``: one row per (consumer group, message) still to be settled;
  its ``id`` orders a partition. Acked deliveries are deleted.
- ``queue_pauses``: paused consumers (``partition_key = ''``) or partitions.
- ``queue_members``: one row per member id: its current generation (bumped at each
  start), heartbeat and clean stop. A delivery in flight records its holder
  (``leased_by``: the member id, else the process's ``host:pid``) and the holder's
  ``lease_generation``; ``resumes`` counts how often a restart of its holder took it
  back (``app/queue/members.py``).
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

queue_messages = sa.Table(
    "queue_messages",
    metadata,
    sa.Column("seq", _BigId, primary_key=True, autoincrement=True),
    sa.Column("topic", sa.String(255), nullable=False),
    sa.Column("partition_key", sa.String(255), nullable=False),
    sa.Column("message_id", sa.String(255), nullable=False),
    sa.Column("source_group", sa.String(255), nullable=False, server_default=""),
    sa.Column("payload", sa.Text(), nullable=False),
    sa.Column("metadata", sa.Text(), nullable=False, server_default="{}"),
    sa.Column("published_at_ms", sa.BigInteger(), nullable=False),
    sa.Column("settled_at_ms", sa.BigInteger(), nullable=True),
    sa.Column("parked", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("original_topic", sa.String(255), nullable=True),
    sa.Column("failed_at_ms", sa.BigInteger(), nullable=True),
    sa.Column("failure_count", sa.Integer(), nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Column("failure_detail", sa.Text(), nullable=True),
    sa.UniqueConstraint(
        "topic", "partition_key", "message_id", "source_group", name="uq_queue_messages_identity"
    ),
    sa.Index("ix_queue_messages_settled", "settled_at_ms"),
    sa.Index("ix_queue_messages_topic_seq", "topic", "seq"),
    sqlite_autoincrement=True,
)

queue_deliveries = sa.Table(
    "queue_deliveries",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("consumer_group", sa.String(255), nullable=False),
    sa.Column("topic", sa.String(255), nullable=False),
    sa.Column("partition_key", sa.String(255), nullable=False),
    sa.Column(
        "message_seq",
        sa.BigInteger(),
        sa.ForeignKey("queue_messages.seq", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("available_at_ms", sa.BigInteger(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("held", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("lease_token", sa.String(64), nullable=True),
    sa.Column("leased_by", sa.String(255), nullable=True),
    sa.Column("lease_generation", sa.BigInteger(), nullable=True),
    sa.Column("resumes", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
    sa.UniqueConstraint("consumer_group", "message_seq", name="uq_queue_deliveries_group_msg"),
    sa.Index("ix_queue_deliveries_partition", "consumer_group", "topic", "partition_key", "id"),
    sa.Index("ix_queue_deliveries_available", "consumer_group", "topic", "available_at_ms"),
    sa.Index("ix_queue_deliveries_message", "message_seq"),
    sqlite_autoincrement=True,
)

queue_pauses = sa.Table(
    "queue_pauses",
    metadata,
    sa.Column("consumer_group", sa.String(255), primary_key=True),
    sa.Column("topic", sa.String(255), primary_key=True),
    sa.Column("partition_key", sa.String(255), primary_key=True),
    sa.Column("paused_at_ms", sa.BigInteger(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False, server_default=""),
)

queue_members = sa.Table(
    "queue_members",
    metadata,
    sa.Column("member_id", sa.String(255), primary_key=True),
    sa.Column("generation", sa.BigInteger(), nullable=False),
    sa.Column("incarnation", sa.String(255), nullable=False, server_default=""),
    sa.Column("started_at_ms", sa.BigInteger(), nullable=False),
    sa.Column("heartbeat_at_ms", sa.BigInteger(), nullable=False),
    sa.Column("stopped_at_ms", sa.BigInteger(), nullable=True),
)
