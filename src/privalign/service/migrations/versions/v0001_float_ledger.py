"""The version-1 ledger: float amounts, stored answers without expiry (the schema released before issue
17). Base revision.

:func:`v1_metadata` is the one definition of this schema: this revision creates it, and the upgrade
tests build a version-1 ledger with it.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import Column, Float, Index, Integer, MetaData, String, Table, Text, UniqueConstraint

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def v1_metadata() -> MetaData:
    """The version-1 tables (the first released ``privalign/service/db.py`` schema)."""
    m = MetaData()
    amounts = (
        "limit_epsilon",
        "limit_delta",
        "spent_epsilon",
        "spent_delta",
        "reserved_epsilon",
        "reserved_delta",
    )
    Table(
        "principals",
        m,
        Column("principal", String(64), primary_key=True),
        Column("created_at", Float, nullable=False),
        *[Column(c, Float, nullable=False, default=0.0) for c in amounts],
    )
    Table(
        "api_keys",
        m,
        Column("key_id", String(64), primary_key=True),
        Column("name", String(200), nullable=False, default=""),
        Column("salt", String(64), nullable=False),
        Column("secret_hash", String(128), nullable=False),
        Column("accounting", String(16), nullable=False),
        Column("created_at", Float, nullable=False),
        Column("revoked_at", Float, nullable=True),
    )
    Table(
        "budget_grants",
        m,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("principal", String(64), nullable=False, index=True),
        Column("created_at", Float, nullable=False),
        Column("epsilon", Float, nullable=False),
        Column("delta", Float, nullable=False),
        Column("note", String(200), nullable=False, default=""),
    )
    Table(
        "ledger",
        m,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("reservation_id", String(64), nullable=False),
        Column("principal", String(64), nullable=False),
        Column("action", String(16), nullable=False),
        Column("created_at", Float, nullable=False),
        Column("owner", String(64), nullable=False, default=""),
        Column("event", Text, nullable=True),
        Column("reserved_epsilon", Float, nullable=False, default=0.0),
        Column("reserved_delta", Float, nullable=False, default=0.0),
        Column("realized_epsilon", Float, nullable=True),
        Column("realized_delta", Float, nullable=True),
        Column("detail", Text, nullable=True),
        Column("closes", String(64), nullable=True, unique=True),
        UniqueConstraint("reservation_id", "action", name="uq_ledger_reservation_action"),
        Index("ix_ledger_principal_id", "principal", "id"),
    )
    Table(
        "idempotency",
        m,
        Column("principal", String(64), primary_key=True),
        Column("idem_key", String(200), primary_key=True),
        Column("request_hash", String(64), nullable=False),
        Column("status", String(16), nullable=False),
        Column("reservation_id", String(64), nullable=True),
        Column("status_code", Integer, nullable=True),
        Column("response", Text, nullable=True),
        Column("created_at", Float, nullable=False),
    )
    return m


def upgrade() -> None:
    v1_metadata().create_all(op.get_bind())


def downgrade() -> None:
    v1_metadata().drop_all(op.get_bind())
