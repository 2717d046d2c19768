"""``SQLBudgetStore``: the ``BudgetStore`` protocol of ``privalign.accounting.filters`` on a real database.

Reserve-before-run and settle-after-run are single transactions:

* **PostgreSQL**: each of reserve, settle, cancel and reconcile is **one SQL statement**, sent in one round
  trip on an autocommit connection (so it is its own transaction: no ``BEGIN``/``COMMIT`` round trips).
  The reserve is a conditional ``UPDATE principals … WHERE spent + reserved + cost ≤ limit`` whose
  ``RETURNING`` feeds the ``INSERT`` of the ledger row in a data-modifying CTE. Under ``READ COMMITTED`` an
  ``UPDATE`` that finds the row locked by a concurrent transaction waits for it and re-evaluates its
  ``WHERE`` on the newest committed version, so concurrent reservations on the same principal (from any
  number of service processes) are serialised on that row and the check always sees every committed
  reservation; reservations on different principals do not contend. A closing action inserts its ledger
  row (``ON CONFLICT DO NOTHING`` on the unique ``closes`` index) and updates the principal's totals from
  that row's ``RETURNING``, again in one statement. psycopg prepares each statement on its connection
  after a few executions. With ``require_active=True`` the reserving ``UPDATE`` also requires that the
  API key named by ``active_key`` (default: the principal) is not revoked (the service's key cache relies
  on it; a key of a user names itself while its user's budget is the principal). The reserving
  statement returns the principal's totals after the reservation (:class:`Receipt`).
* **SQLite**: every transaction starts with ``BEGIN IMMEDIATE`` (see
  :func:`privalign.service.db.make_engine`), so the read of the balance and the write of the reservation
  happen under one database write lock. SQLite runs in-process, so several statements per transaction cost
  no round trips.

Durability (``durable=True``, the default; ``[database] sync = "full"``): the **reserve** is flushed to
disk before :meth:`SQLBudgetStore.try_reserve` returns. With group commit (``group_commit=True``, the
default) the reserve commits without waiting and a shared flush (:mod:`privalign.service.durability`)
makes it durable; ``reserve(..., wait=False)`` returns before that flush, and the caller must call
:meth:`SQLBudgetStore.wait_durable` before it releases anything (the service does so at its gate, before
any answer). Without group commit the reserve's own commit waits (PostgreSQL ``synchronous_commit = on``,
SQLite ``synchronous = FULL``). Settle, cancel and
reconcile commit without waiting for the flush: losing one of them in a database crash leaves the
reservation open, and reconciliation then charges it at its reserved cost, which is at least the realized
cost (fail closed). See :meth:`SQLBudgetStore.try_reserve`.

Every change is an append-only ``ledger`` row; the cached totals on the ``principals`` row are updated in
the same transaction (on PostgreSQL: the same statement) and are always equal to
:func:`privalign.service.db.derive_totals`.

Costs are pairs ``(a, b)`` in the unit of the filter that uses the store (``(ε, δ)`` for pure and ex-post
filters, ``(ρ, 0)`` for zCDP). The store keeps them as **exact integers** of
:data:`privalign.service.db.EPS_SCALE` / :data:`~privalign.service.db.DELTA_SCALE` units: a cost is rounded
up to the unit, a limit down, and every sum and comparison is exact (a budget of 2.0 holds exactly twenty
charges of 0.1). The minimum non-zero charge is one unit (10⁻⁹ ε). A reservation is refused when
``spent + reserved + cost > limit`` in either coordinate; nothing is written then.

Every operation returns what the caller needs (no context variables): :meth:`SQLBudgetStore.reserve`
returns a :class:`Receipt` with the principal's totals right after the reservation, read by the reserving
statement itself (PostgreSQL) or under the same write lock (SQLite); the closing operations return the
totals after the close.

Layout: :mod:`~privalign.service.store.connection` (the engine, transactions on the raw DBAPI connection,
group commit), :mod:`~privalign.service.store.ledger` (reserve, settle, cancel, reconcile, grants, totals),
:mod:`~privalign.service.store.idempotency` (stored answers; shares only the engine with the ledger) and
:mod:`~privalign.service.store.units` (integer units, :class:`Receipt`); :class:`SQLBudgetStore` combines
them.
"""

from __future__ import annotations

from privalign.service.store.idempotency import IdempotencyConflict, IdempotencyMismatch, IdempotentAnswers
from privalign.service.store.ledger import ActiveKeyCheckFailed, LedgerStore
from privalign.service.store.units import Receipt, cost_units, limit_units

__all__ = [
    "SQLBudgetStore",
    "Receipt",
    "ActiveKeyCheckFailed",
    "IdempotencyConflict",
    "IdempotencyMismatch",
    "cost_units",
    "limit_units",
]


class SQLBudgetStore(LedgerStore, IdempotentAnswers):
    """A transactional, durable ``BudgetStore`` backed by SQLAlchemy (SQLite or PostgreSQL).

    Args:
      engine: from :func:`privalign.service.db.make_engine`; the tables must exist
        (:func:`privalign.service.db.create_schema`).
      owner: identifier of this process (written on reservations; used by reconciliation).
      durable: flush each **reserve** to disk before :meth:`try_reserve` returns (default). Settle,
        cancel and reconcile never wait for a flush (a lost close is charged at the reserved cost by
        reconciliation: fail closed). ``False`` never waits for a flush: the ledger then survives a crash
        of the *service* process (the tests kill -9 it) but a power loss or OS crash can lose the last
        rows, reservations and charges of answers already released included.
      group_commit: with ``durable``, commit each reserve without waiting for the flush and make it
        durable by a shared flush (:mod:`privalign.service.durability`): one flush for every reserve
        committed before it began, run by a background thread. :meth:`reserve` still returns only once
        its reservation is durable, unless called with ``wait=False``: then the caller must call
        :meth:`wait_durable` before it releases anything that depends on the reservation. ``False``: the
        reserve's own commit waits for the flush (SQLite ``synchronous=FULL``, PostgreSQL
        ``synchronous_commit = on``). Group commit is off for an in-memory SQLite database and, on
        PostgreSQL, if the role may not call ``pg_logical_emit_message`` (checked once, logged).

    The limit passed to :meth:`try_reserve` is combined with the principal's granted budget (the sum of
    its ``budget_grants`` rows) by taking the minimum, so a stale limit can only be more conservative.
    """
