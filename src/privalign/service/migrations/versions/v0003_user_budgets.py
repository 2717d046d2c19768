"""Budgets shared by the keys of a user: ``api_keys.user_name``.

* ``api_keys.user_name`` (nullable) is added. Every existing key gets ``NULL``: it keeps its own budget
  (its principal stays its key id; no grant, ledger row or cached total changes).
* The ``privalign_schema`` table records version 3.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as b:
        b.add_column(sa.Column("user_name", sa.String(60), nullable=True))
    op.get_bind().execute(sa.text("UPDATE privalign_schema SET version = 3 WHERE id = 1"))


def downgrade() -> None:
    raise NotImplementedError(
        "privalign does not downgrade a ledger that may hold shared user budgets (the keys of a user would "
        "each lose the budget they spent from); restore a backup taken before the upgrade instead"
    )
