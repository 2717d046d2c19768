"""Exact integer units and expiring stored answers (float sums drifted, and stored answers never expired).

* Every amount becomes an integer of units (ε, ρ: 10⁻⁹; δ: 10⁻¹⁸), on the conservative side: grants
  round **down** (from the decimal the float prints as), reserved and realized costs round **up** from
  their exact binary value (realized ≤ reserved is preserved: rounding up is monotone).
* The cached totals of ``principals`` are recomputed from the converted rows (so they equal
  :func:`privalign.service.db.derive_totals`).
* ``idempotency.expires_at`` is added: stored answers expire ``MIGRATED_IDEMPOTENCY_TTL_S`` after their
  creation.
* The ``privalign_schema`` table records version 2.

Column types change with ``batch_alter_table`` (SQLite: copy-and-recreate; PostgreSQL: ``ALTER COLUMN …
TYPE BIGINT``); the exact values are computed in Python from the float values read before, and written by
primary key.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from privalign.service.db import DELTA_SCALE, EPS_SCALE, MIGRATED_IDEMPOTENCY_TTL_S, units_down, units_up

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_AMOUNTS = {
    "principals": (
        "limit_epsilon",
        "limit_delta",
        "spent_epsilon",
        "spent_delta",
        "reserved_epsilon",
        "reserved_delta",
    ),
    "budget_grants": ("epsilon", "delta"),
    "ledger": ("reserved_epsilon", "reserved_delta", "realized_epsilon", "realized_delta"),
}


def _scale(col: str) -> int:
    return DELTA_SCALE if col.endswith("delta") else EPS_SCALE


def _to_bigint(table: str, nullable: dict[str, bool]) -> None:
    with op.batch_alter_table(table, recreate="auto") as b:
        for col in _AMOUNTS[table]:
            b.alter_column(
                col,
                type_=sa.BigInteger(),
                existing_type=sa.Float(),
                existing_nullable=nullable.get(col, False),
                postgresql_using=f"CAST({col} AS BIGINT)",
            )


def upgrade() -> None:
    conn = op.get_bind()
    grants = conn.execute(sa.text("SELECT id, epsilon, delta FROM budget_grants")).all()
    ledger = conn.execute(
        sa.text("SELECT id, reserved_epsilon, reserved_delta, realized_epsilon, realized_delta FROM ledger")
    ).all()
    _to_bigint("budget_grants", {})
    _to_bigint("ledger", {"realized_epsilon": True, "realized_delta": True})
    _to_bigint("principals", {})
    if grants:
        conn.execute(
            sa.text("UPDATE budget_grants SET epsilon = :e, delta = :d WHERE id = :i"),
            [
                {"i": i, "e": units_down(float(e), EPS_SCALE), "d": units_down(float(d), DELTA_SCALE)}
                for i, e, d in grants
            ],
        )

    def up(x, scale):
        return None if x is None else units_up(float(x), scale)

    if ledger:
        conn.execute(
            sa.text(
                "UPDATE ledger SET reserved_epsilon = :ra, reserved_delta = :rb, realized_epsilon = :sa, "
                "realized_delta = :sb WHERE id = :i"
            ),
            [
                {
                    "i": i,
                    "ra": up(ra or 0.0, EPS_SCALE),
                    "rb": up(rb or 0.0, DELTA_SCALE),
                    "sa": up(sa_, EPS_SCALE),
                    "sb": up(sb, DELTA_SCALE),
                }
                for i, ra, rb, sa_, sb in ledger
            ],
        )
    # The cached totals, recomputed from the converted rows (as db.derive_totals does).
    conn.execute(
        sa.text(
            "UPDATE principals SET "
            "limit_epsilon = (SELECT COALESCE(SUM(g.epsilon), 0) FROM budget_grants g "
            "WHERE g.principal = principals.principal), "
            "limit_delta = (SELECT COALESCE(SUM(g.delta), 0) FROM budget_grants g "
            "WHERE g.principal = principals.principal), "
            "spent_epsilon = (SELECT COALESCE(SUM(l.realized_epsilon), 0) FROM ledger l "
            "WHERE l.principal = principals.principal "
            "AND l.action IN ('settle', 'reconcile')), "
            "spent_delta = (SELECT COALESCE(SUM(l.realized_delta), 0) FROM ledger l "
            "WHERE l.principal = principals.principal "
            "AND l.action IN ('settle', 'reconcile')), "
            "reserved_epsilon = (SELECT COALESCE(SUM(l.reserved_epsilon), 0) FROM ledger l "
            "WHERE l.principal = principals.principal "
            "AND l.action = 'reserve' AND l.reservation_id NOT IN (SELECT c.reservation_id FROM ledger c "
            "WHERE c.principal = principals.principal AND c.action IN ('settle', 'cancel', 'reconcile'))), "
            "reserved_delta = (SELECT COALESCE(SUM(l.reserved_delta), 0) FROM ledger l "
            "WHERE l.principal = principals.principal "
            "AND l.action = 'reserve' AND l.reservation_id NOT IN (SELECT c.reservation_id FROM ledger c "
            "WHERE c.principal = principals.principal AND c.action IN ('settle', 'cancel', 'reconcile')))"
        )
    )
    with op.batch_alter_table("idempotency") as b:
        b.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
    conn.execute(
        sa.text("UPDATE idempotency SET expires_at = created_at + :ttl"), {"ttl": MIGRATED_IDEMPOTENCY_TTL_S}
    )
    op.create_table(
        "privalign_schema",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    conn.execute(sa.text("INSERT INTO privalign_schema (id, version) VALUES (1, 2)"))


def downgrade() -> None:
    raise NotImplementedError(
        "privalign does not downgrade a ledger to float amounts (it would round charges in the "
        "holder's favour); restore a backup taken before the upgrade instead"
    )
