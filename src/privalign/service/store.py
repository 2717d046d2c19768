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
  principal is an API key that is not revoked (the service's key cache relies on it). The reserving
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
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from sqlalchemy import delete, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from privalign.errors import BudgetExhaustedError, PrivacyParameterError, ReservationError
from privalign.service import db
from privalign.service.durability import GroupFlusher, Ticket, sqlite_wal_flush

__all__ = [
    "SQLBudgetStore",
    "Receipt",
    "ActiveKeyCheckFailed",
    "IdempotencyConflict",
    "IdempotencyMismatch",
]

EPS, DLT = db.EPS_SCALE, db.DELTA_SCALE

log = logging.getLogger("privalign.service")


@dataclass(frozen=True)
class Receipt:
    """A reservation written to the ledger.

    Attributes:
      reservation_id: the ledger's reservation id.
      principal: who pays.
      cost: the reserved cost in integer units ``(a, b)``.
      totals: the principal's totals in integer units right after the reservation (this reservation
        included): ``limit_*``, ``spent_*``, ``reserved_*``.
      ticket: with group commit, the flush that makes the reservation durable
        (:meth:`SQLBudgetStore.wait_durable`); ``None`` when the reservation was durable (or not meant to
        be) when the receipt was made.
    """

    reservation_id: str
    principal: str
    cost: tuple[int, int]
    totals: dict[str, int]
    ticket: Ticket | None = field(default=None, compare=False, repr=False)

    def remaining_after(self, charged: tuple[int, int]) -> tuple[int, int]:
        """What is left (units) once this reservation is settled at ``charged``, counting other requests
        as they stood when this one reserved. Never negative."""
        t = self.totals
        a = t["limit_epsilon"] - t["spent_epsilon"] - t["reserved_epsilon"] + self.cost[0] - charged[0]
        b = t["limit_delta"] - t["spent_delta"] - t["reserved_delta"] + self.cost[1] - charged[1]
        return max(0, a), max(0, b)


class IdempotencyConflict(Exception):
    """An attempt with this Idempotency-Key is in progress or was interrupted.

    ``charged``: whether that attempt holds a reservation (``True``: a retry with this key is never run;
    ``False``: it holds nothing yet, a later retry may run; ``None``: unknown, treated as charged)."""

    def __init__(self, message: str, *, charged: bool | None = None) -> None:
        super().__init__(message)
        self.charged = charged


class IdempotencyMismatch(Exception):
    """This Idempotency-Key was used with a different request."""


_IN_PROGRESS = (
    "A request with this Idempotency-Key is in progress and holds no charge yet; retry in a few seconds. "
    "Nothing was charged for this one."
)


def cost_units(cost: Sequence[float], name: str = "cost") -> tuple[int, int]:
    """A cost pair ``(a, b)`` (floats) → integer units, rounded **up**."""
    a, b = _check_cost(cost, name)
    return db.units_up(a, EPS), db.units_up(b, DLT)


def limit_units(limit: Sequence[float] | None) -> tuple[int, int] | None:
    """A limit pair → integer units, rounded **down** (``None`` stays ``None``: the granted limit)."""
    if limit is None:
        return None
    la, lb = float(limit[0]), float(limit[1])
    if math.isnan(la) or math.isnan(lb) or la < 0 or lb < 0:
        raise PrivacyParameterError(
            f"The 'limit' parameter must be a pair of non-negative numbers. Got {limit!r} instead."
        )
    cap = db.MAX_UNITS
    return (
        cap if math.isinf(la) else min(cap, db.units_down(min(la, cap / EPS), EPS)),
        cap if math.isinf(lb) else min(cap, db.units_down(min(lb, cap / DLT), DLT)),
    )


_CLOSING = ("settle", "cancel", "reconcile")


class ActiveKeyCheckFailed(Exception):
    """A reservation with ``require_active=True`` wrote nothing: the key is unknown or revoked, or the
    cost does not fit the (possibly stale) limit. Nothing was charged; the caller authenticates the key
    from the database and decides again."""


def _check_cost(cost: Sequence[float], name: str) -> tuple[float, float]:
    if len(cost) != 2:
        raise PrivacyParameterError(f"The '{name}' parameter must be a pair (a, b). Got {cost!r} instead.")
    if any(isinstance(v, bool) for v in cost):
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a pair of numbers, not bools. Got {cost!r} instead."
        )
    a, b = float(cost[0]), float(cost[1])
    for v in (a, b):
        if math.isnan(v) or v < 0 or math.isinf(v):
            raise PrivacyParameterError(
                f"The '{name}' parameter must be a pair of finite non-negative floats. Got {cost!r} instead."
            )
    return a, b


class SQLBudgetStore:
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

    def __init__(
        self, engine: Engine, *, owner: str | None = None, durable: bool = True, group_commit: bool = True
    ) -> None:
        self.engine = engine
        self.durable = bool(durable)
        self.owner = owner or uuid.uuid4().hex
        self._pg = engine.dialect.name == "postgresql"
        self._columns: dict[str, tuple[str, ...]] = {}
        self.flusher: GroupFlusher | None = None
        self._group_lock = threading.Lock()
        self._group_decided = not (self.durable and group_commit)
        if not self._group_decided and not self._pg:
            path = engine.url.database or ""
            if path and path != ":memory:" and not path.startswith("file:"):
                self.flusher = GroupFlusher(sqlite_wal_flush(os.path.abspath(path)))
            self._group_decided = True

    @property
    def group_commit(self) -> bool:
        """Whether durable reserves are flushed by group commit (decided at the first reserve on
        PostgreSQL)."""
        self._decide_group_commit()
        return self.flusher is not None

    def _decide_group_commit(self) -> None:
        """PostgreSQL: group commit needs ``pg_logical_emit_message`` (executable by every role by
        default); probed once, in a transaction that is rolled back."""
        if self._group_decided:
            return
        with self._group_lock:
            if self._group_decided:
                return
            raw = self.engine.raw_connection()
            try:
                cur = raw.cursor()
                cur.execute("SELECT pg_logical_emit_message(true, 'privalign', 'probe')")
                raw.rollback()
                self.flusher = GroupFlusher(self._pg_flush)
            except self.engine.dialect.dbapi.ProgrammingError as exc:  # type: ignore[union-attr]  # permission denied
                raw.rollback()
                log.warning(
                    "group commit is off: pg_logical_emit_message is not available (%s); every reserve "
                    "waits for its own flush",
                    str(exc).splitlines()[0],
                )
            finally:
                raw.close()
            self._group_decided = True

    _PG_FLUSH = (
        "SELECT pg_logical_emit_message(true, 'privalign', 'flush'), "
        "ARRAY(SELECT reservation_id FROM ledger "
        "WHERE reservation_id = ANY(%(ids)s) AND action = 'reserve'), "
        "set_config('synchronous_commit', 'on', true)"
    )

    def _pg_flush(self, rids: list[str]) -> set[str]:
        """One autocommit statement committed with ``synchronous_commit = on`` that writes WAL (a
        transactional message, so it has a transaction id and a commit record the server must flush),
        and reads which of ``rids`` it can see. Returns the ids it cannot see (lost)."""
        with self._tx() as cur:
            cur.execute(self._PG_FLUSH, {"ids": list(rids)})
            seen = set(cur.fetchone()[1])
        return set(rids) - seen

    def wait_durable(self, receipt: Receipt, timeout: float | None = None) -> None:
        """Return once ``receipt``'s reservation is on disk (at once if it already was).

        Raises:
          DurabilityError: the flush failed, the reservation was lost, or ``timeout`` seconds passed. The
            reservation may or may not be durable: treat it as charged and release nothing.
        """
        if receipt.ticket is not None and self.flusher is not None:
            self.flusher.wait(receipt.ticket, timeout)

    def close(self) -> None:
        """Stop the flusher thread (after flushing what is queued)."""
        if self.flusher is not None:
            self.flusher.close()

    # -- helpers ------------------------------------------------------------------------------
    # The hot path (reserve, settle, cancel, totals, authentication) talks to the DBAPI connection
    # directly, with SQL written once and translated to the driver's parameter style: SQLAlchemy's
    # statement machinery cost several CPU milliseconds per request (benchmarks/bench_service_select.py).
    # Admin paths use Core.
    _SQL = {
        "lock": (
            "SELECT limit_epsilon, limit_delta, spent_epsilon, spent_delta, reserved_epsilon, reserved_delta "
            "FROM principals WHERE principal = :p"
        ),
        "lock_pg": (
            "SELECT limit_epsilon, limit_delta, spent_epsilon, spent_delta, reserved_epsilon, reserved_delta "
            "FROM principals WHERE principal = :p FOR UPDATE"
        ),
        "new": (
            "INSERT INTO principals (principal, created_at, limit_epsilon, limit_delta, spent_epsilon, "
            "spent_delta, reserved_epsilon, reserved_delta) VALUES (:p, :t, 0, 0, 0, 0, 0, 0) "
            "ON CONFLICT DO NOTHING"
        ),
        "ledger": (
            "INSERT INTO ledger (reservation_id, principal, action, created_at, owner, event, "
            "reserved_epsilon, reserved_delta, realized_epsilon, realized_delta, detail, closes) "
            "VALUES (:rid, :p, :a, :t, :o, :e, :ra, :rb, :sa, :sb, :d, :c)"
        ),
        "add_reserved": "UPDATE principals SET reserved_epsilon = reserved_epsilon + :a, "
        "reserved_delta = reserved_delta + :b WHERE principal = :p",
        "close": (
            "UPDATE principals SET reserved_epsilon = reserved_epsilon - :ra, "
            "reserved_delta = reserved_delta - :rb, "
            "spent_epsilon = spent_epsilon + :sa, spent_delta = spent_delta + :sb WHERE principal = :p"
        ),
        "res": (
            "SELECT principal, reserved_epsilon, reserved_delta FROM ledger "
            "WHERE reservation_id = :rid AND action = 'reserve'"
        ),
        "closed": "SELECT action FROM ledger WHERE closes = :rid",
        "key": "SELECT revoked_at FROM api_keys WHERE key_id = :p",
    }
    _TOTALS = (
        "limit_epsilon",
        "limit_delta",
        "spent_epsilon",
        "spent_delta",
        "reserved_epsilon",
        "reserved_delta",
    )

    # PostgreSQL: one statement per action. The effective limit is the granted limit (no caller limit),
    # or min(caller's limit, granted limit) when the principal has a grant, exactly as in the SQLite path;
    # all amounts are exact bigint units. ``set_config(..., true)`` sets synchronous_commit for this
    # statement's own (autocommit) transaction only.
    _PG_RESERVE = (
        "WITH p AS (UPDATE principals SET reserved_epsilon = reserved_epsilon + %(a)s, "
        "reserved_delta = reserved_delta + %(b)s "
        "WHERE principal = %(p)s "
        "AND spent_epsilon + reserved_epsilon + %(a)s <= "
        "CASE WHEN CAST(%(la)s AS BIGINT) IS NULL THEN limit_epsilon "
        "WHEN limit_epsilon > 0 OR limit_delta > 0 THEN LEAST(CAST(%(la)s AS BIGINT), limit_epsilon) "
        "ELSE CAST(%(la)s AS BIGINT) END "
        "AND spent_delta + reserved_delta + %(b)s <= "
        "CASE WHEN CAST(%(lb)s AS BIGINT) IS NULL THEN limit_delta "
        "WHEN limit_epsilon > 0 OR limit_delta > 0 THEN LEAST(CAST(%(lb)s AS BIGINT), limit_delta) "
        "ELSE CAST(%(lb)s AS BIGINT) END "
        "{active}RETURNING principal, limit_epsilon, limit_delta, spent_epsilon, spent_delta, "
        "reserved_epsilon, reserved_delta), "
        "l AS (INSERT INTO ledger (reservation_id, principal, action, created_at, owner, event, "
        "reserved_epsilon, reserved_delta, realized_epsilon, realized_delta, detail, closes) "
        "SELECT %(rid)s, principal, 'reserve', %(t)s, %(o)s, %(e)s, %(a)s, %(b)s, NULL, NULL, NULL, NULL "
        "FROM p RETURNING id) "
        "SELECT p.limit_epsilon, p.limit_delta, p.spent_epsilon, p.spent_delta, p.reserved_epsilon, "
        "p.reserved_delta, "
        "set_config('synchronous_commit', %(sync)s, true) FROM p, l"
    )
    _PG_RESERVE_SQL = {
        False: _PG_RESERVE.format(active=""),
        True: _PG_RESERVE.format(
            active="AND EXISTS (SELECT 1 FROM api_keys WHERE key_id = %(p)s AND revoked_at IS NULL) "
        ),
    }
    # {realized}: the realized cost columns of the closing row; {check}: settle's realized ≤ reserved.
    _PG_CLOSE = (
        "WITH r AS (SELECT principal, reserved_epsilon, reserved_delta FROM ledger "
        "WHERE reservation_id = %(rid)s AND action = 'reserve'), "
        "c AS (INSERT INTO ledger (reservation_id, principal, action, created_at, owner, event, "
        "reserved_epsilon, reserved_delta, realized_epsilon, realized_delta, detail, closes) "
        "SELECT %(rid)s, principal, %(act)s, %(t)s, %(o)s, %(e)s, reserved_epsilon, reserved_delta, "
        "{realized}, %(d)s, %(rid)s "
        "FROM r{check} ON CONFLICT DO NOTHING "
        "RETURNING principal, reserved_epsilon, reserved_delta, COALESCE(realized_epsilon, 0) AS sa, "
        "COALESCE(realized_delta, 0) AS sb), "
        "u AS (UPDATE principals SET reserved_epsilon = principals.reserved_epsilon - c.reserved_epsilon, "
        "reserved_delta = principals.reserved_delta - c.reserved_delta, "
        "spent_epsilon = principals.spent_epsilon + c.sa, "
        "spent_delta = principals.spent_delta + c.sb FROM c WHERE principals.principal = c.principal "
        "RETURNING principals.limit_epsilon, principals.limit_delta, principals.spent_epsilon, "
        "principals.spent_delta, "
        "principals.reserved_epsilon, principals.reserved_delta) "
        "SELECT u.*, set_config('synchronous_commit', %(sync)s, true) FROM u"
    )
    _PG_CLOSE_SQL = {
        "settle": _PG_CLOSE.format(
            realized="%(sa)s, %(sb)s", check=" WHERE %(sa)s <= reserved_epsilon AND %(sb)s <= reserved_delta"
        ),
        "cancel": _PG_CLOSE.format(realized="NULL, NULL", check=""),
        "reconcile": _PG_CLOSE.format(realized="reserved_epsilon, reserved_delta", check=""),
    }

    def _sql(self, name: str) -> str:
        s = self._SQL[name]
        return re.sub(r":([a-z]+)", r"%(\1)s", s) if self._pg else s

    @contextmanager
    def _tx(self, *, write: bool = True, durable: bool = False):
        """SQLite: a DBAPI cursor in one ``BEGIN IMMEDIATE`` transaction (``write``), flushed to disk on
        commit if ``durable`` (``synchronous=FULL``, else ``NORMAL``).

        PostgreSQL: a cursor on an **autocommit** connection: every statement is its own transaction, in
        one round trip; ``durable`` is ignored (each writing statement sets ``synchronous_commit`` itself).
        The uncommon multi-statement paths (a refusal, a close that wrote nothing) open an explicit
        transaction with ``cur.connection.transaction()`` or run independent reads. The connection goes
        back to the pool with autocommit off, as SQLAlchemy Core expects.
        """
        raw = self.engine.raw_connection()
        try:
            if self._pg:
                dc: Any = raw.driver_connection  # the psycopg connection (typed Optional by SQLAlchemy)
                dc.autocommit = True
                try:
                    cur = raw.cursor()
                    yield cur
                    cur.close()
                finally:
                    try:
                        dc.autocommit = False  # the pool's other users (SQLAlchemy Core) expect transactions
                    except Exception:  # e.g. the connection broke: never return it to the pool
                        raw.invalidate()
                return
            cur = raw.cursor()
            if write:
                cur.execute("PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=NORMAL")
                cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                if write:
                    raw.rollback()
                raise
            if write:
                raw.commit()
            cur.close()
        finally:
            raw.close()

    def ping(self) -> str:
        """One trivial round trip (liveness/readiness); returns the dialect name. Raises on a database
        error."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
            conn.rollback()
        return self.engine.dialect.name

    def query_one(self, sql: str, params: dict) -> dict | None:
        """Run one read-only statement (``:name`` parameters) on the raw connection; first row as a dict.

        One round trip on PostgreSQL (autocommit), no transaction on SQLite."""
        if self._pg:
            sql = re.sub(r":([a-z_]+)", r"%(\1)s", sql)
        with self._tx(write=False) as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
            if row is None:
                return None
            cols = self._columns.get(sql)
            if cols is None:  # a statement's result columns never change: read them once
                cols = self._columns[sql] = tuple(d[0] for d in cur.description)
        return dict(zip(cols, row))

    def _one(self, cur: Any, name: str, params: dict) -> tuple | None:
        cur.execute(self._sql(name), params)
        return cur.fetchone()

    @overload
    def _lock_principal(self, cur: Any, principal: str, *, create: Literal[True]) -> dict: ...
    @overload
    def _lock_principal(self, cur: Any, principal: str, *, create: bool) -> dict | None: ...

    def _lock_principal(self, cur: Any, principal: str, *, create: bool) -> dict | None:
        """The principal's cached totals under the row lock; with ``create``, the row is inserted first if
        missing (so the result is never ``None``)."""
        q = "lock_pg" if self._pg else "lock"
        row = self._one(cur, q, {"p": principal})
        if row is None and create:
            cur.execute(self._sql("new"), {"p": principal, "t": db.now()})
            row = self._one(cur, q, {"p": principal})
        return None if row is None else dict(zip(self._TOTALS, (int(v) for v in row)))

    @staticmethod
    def _exhausted(
        principal: str, row: dict, ca: int, cb: int, lim: tuple[int, int] | None
    ) -> BudgetExhaustedError | None:
        """The refusal for ``row`` (cached totals, units) and a request of ``(ca, cb)`` units under limit
        ``lim`` (units; ``None``: the granted limit), or ``None`` if it fits."""
        if lim is None:
            la, lb = row["limit_epsilon"], row["limit_delta"]
        else:
            la, lb = lim
            if row["limit_epsilon"] > 0 or row["limit_delta"] > 0:  # granted budget (grants are positive)
                la, lb = min(la, row["limit_epsilon"]), min(lb, row["limit_delta"])
        used_a = row["spent_epsilon"] + row["reserved_epsilon"]
        used_b = row["spent_delta"] + row["reserved_delta"]
        if used_a + ca > la or used_b + cb > lb:
            remaining = {
                "primary": db.from_units(max(0, la - used_a), EPS),
                "delta": db.from_units(max(0, lb - used_b), DLT),
            }
            return BudgetExhaustedError(
                f"Reserving cost {(db.from_units(ca, EPS), db.from_units(cb, DLT))} for principal "
                f"{principal!r} would exceed its budget {(db.from_units(la, EPS), db.from_units(lb, DLT))}; "
                f"remaining {remaining}. Nothing was charged.",
                remaining=remaining,
            )
        return None

    # -- BudgetStore protocol -----------------------------------------------------------------
    def try_reserve(
        self,
        principal: str,
        cost: tuple[float, float],
        limit: tuple[float, float] | None,
        *,
        event: dict | None = None,
    ) -> str:
        """The ``BudgetStore`` protocol: :meth:`reserve`, returning the reservation id."""
        return self.reserve(principal, cost, limit, event=event).reservation_id

    def reserve(
        self,
        principal: str,
        cost: tuple[float, float],
        limit: tuple[float, float] | None = None,
        *,
        event: dict | None = None,
        require_active: bool = False,
        wait: bool = True,
        background: bool = True,
        reservation_id: str | None = None,
    ) -> Receipt:
        """Atomically check ``spent + reserved + cost ≤ limit`` (exact integer units) and record a
        reservation.

        PostgreSQL: one statement (one round trip) when the principal exists and the cost fits. Otherwise
        (a refusal, or the first reservation of a principal without a row) the decision is taken again
        in a second transaction under ``SELECT … FOR UPDATE`` (a few more round trips, only then). SQLite:
        one ``BEGIN IMMEDIATE`` transaction. When the store is ``durable``, the reservation is on disk when
        this returns.

        Args:
          principal: who pays (the API key id in the service).
          cost: worst-case cost ``(a, b)`` to reserve (rounded up to the unit).
          limit: the caller's budget ``(a, b)`` (rounded down to the unit); the granted budget, if any,
            caps it further. ``None``: the granted budget alone.
          event: optional JSON-able worst-case event, stored on the ledger row.
          require_active: also require, in the same statement (PostgreSQL) or transaction (SQLite), that
            the principal is an API key that exists and is not revoked; raise
            :class:`ActiveKeyCheckFailed` instead of deciding a refusal. The service uses it for a key
            whose secret it checked against a remembered hash.
          wait: with group commit, return only once the reservation is durable (default). ``False``:
            return as soon as it is committed (visible to every other reservation, so the budget check is
            unchanged) with the flush under way; the caller must call :meth:`wait_durable` on the receipt
            before it releases anything that depends on the reservation.
          background: with ``wait=False``: start the flush now in the flusher's thread, to overlap the
            caller's next steps (worth it when they wait on I/O, e.g. a generator; a CPU-bound next step
            holds the GIL and delays that thread by up to the interpreter's switch interval, 5 ms).
            ``False``: the flush runs when the caller waits (:meth:`wait_durable`), in the caller's
            thread, shared with every reservation committed by then.
          reservation_id: the id to record (default: a fresh random one). A caller that chooses it can
            tell, after a failure, whether the reservation was written (:meth:`cancel` it: an unknown id
            raises :class:`ReservationError`).

        Returns:
          A :class:`Receipt` with the principal's totals right after this reservation.

        Raises:
          BudgetExhaustedError: the reservation would exceed the limit (``remaining`` has keys
            ``"primary"`` and ``"delta"``); nothing was written.
          ActiveKeyCheckFailed: only with ``require_active``: the key is unknown or revoked or the cost
            does not fit (no second, locking attempt is made then); nothing was written.
          PrivacyParameterError: a malformed cost or limit.
        """
        ca, cb = cost_units(cost, "cost")
        lim = limit_units(limit)
        rid = reservation_id or uuid.uuid4().hex
        ev = json.dumps(event) if event is not None else None
        self._decide_group_commit()
        flusher = self.flusher
        if self._pg:
            params = {
                "p": principal,
                "a": ca,
                "b": cb,
                "la": None if lim is None else lim[0],
                "lb": None if lim is None else lim[1],
                "rid": rid,
                "t": db.now(),
                "o": self.owner,
                "e": ev,
                "sync": "on" if self.durable and flusher is None else "off",
            }
            with self._tx() as cur:
                cur.execute(self._PG_RESERVE_SQL[bool(require_active)], params)
                done = cur.fetchone()
                if done is not None:
                    return self._receipt(
                        rid,
                        principal,
                        (ca, cb),
                        dict(zip(self._TOTALS, (int(v) for v in done[:6]))),
                        wait,
                        background,
                    )
                if require_active:
                    raise ActiveKeyCheckFailed(
                        f"Reservation for key {principal!r} not confirmed; nothing was charged."
                    )
                # Refused, or no principal row yet: decide again under the row lock (a few more round
                # trips, only on this path). This also names the remaining budget in the refusal.
                with cur.connection.transaction():
                    row = self._lock_principal(cur, principal, create=True)
                    refusal = self._exhausted(principal, row, ca, cb, lim)
                    if refusal is not None:
                        raise refusal
                    self._insert_reserve(cur, principal, rid, ca, cb, ev)
                    cur.execute("SELECT set_config('synchronous_commit', %(s)s, true)", {"s": params["sync"]})
            return self._receipt(rid, principal, (ca, cb), self._after_reserve(row, ca, cb), wait, background)
        with self._tx(durable=self.durable and flusher is None) as cur:
            if require_active:
                key = self._one(cur, "key", {"p": principal})
                locked = (
                    self._lock_principal(cur, principal, create=False)
                    if key is not None and key[0] is None
                    else None
                )
                if locked is None or self._exhausted(principal, locked, ca, cb, lim) is not None:
                    raise ActiveKeyCheckFailed(
                        f"Reservation for key {principal!r} not confirmed; nothing was charged."
                    )
                row = locked
            else:
                row = self._lock_principal(cur, principal, create=True)
                refusal = self._exhausted(principal, row, ca, cb, lim)
                if refusal is not None:
                    raise refusal
            self._insert_reserve(cur, principal, rid, ca, cb, ev)
        return self._receipt(rid, principal, (ca, cb), self._after_reserve(row, ca, cb), wait, background)

    def _receipt(
        self, rid: str, principal: str, cost: tuple[int, int], totals: dict, wait: bool, background: bool
    ) -> Receipt:
        """The receipt of a **committed** reservation; with group commit, its flush is queued here (and
        waited for if ``wait``)."""
        if self.flusher is None:
            return Receipt(rid, principal, cost, totals)
        # Background: the flusher's thread starts the flush now, to overlap the caller's next steps;
        # otherwise the (first) waiter flushes itself, with no thread hand-over, unless a flush is running.
        receipt = Receipt(
            rid, principal, cost, totals, self.flusher.submit(rid, background=background and not wait)
        )
        if wait:
            self.wait_durable(receipt)
        return receipt

    @staticmethod
    def _after_reserve(row: dict, ca: int, cb: int) -> dict:
        """The totals row read under the lock before the reservation, with the reservation added (as the
        ``add_reserved`` statement computes it)."""
        out = dict(row)
        out["reserved_epsilon"] = row["reserved_epsilon"] + ca
        out["reserved_delta"] = row["reserved_delta"] + cb
        return out

    def _insert_reserve(self, cur: Any, principal: str, rid: str, ca: int, cb: int, ev: str | None) -> None:
        """The reserve's ledger row and the matching change of the cached totals (caller holds the lock)."""
        cur.execute(
            self._sql("ledger"),
            {
                "rid": rid,
                "p": principal,
                "a": "reserve",
                "t": db.now(),
                "o": self.owner,
                "e": ev,
                "ra": ca,
                "rb": cb,
                "sa": None,
                "sb": None,
                "d": None,
                "c": None,
            },
        )
        cur.execute(self._sql("add_reserved"), {"a": ca, "b": cb, "p": principal})

    def _close(
        self,
        reservation_id: str,
        action: str,
        cost: tuple[float, float] | None,
        event: dict | None,
        detail: str | None,
        *,
        units: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        if action == "settle":
            sa, sb = units if units is not None else cost_units(cost, "cost")  # type: ignore[arg-type]
        else:
            sa, sb = None, None
        ev = json.dumps(event) if event is not None else None
        if self._pg:
            with self._tx() as cur:
                cur.execute(
                    self._PG_CLOSE_SQL[action],
                    {
                        "rid": reservation_id,
                        "act": action,
                        "t": db.now(),
                        "o": self.owner,
                        "e": ev,
                        "sa": sa,
                        "sb": sb,
                        "d": detail,
                        "sync": "off",  # a lost close is reconciled at the reserved cost (fail closed)
                    },
                )
                row = cur.fetchone()
                if row is not None:
                    return dict(zip(self._TOTALS, (int(v) for v in row[:6])))
                # Nothing written: say why (unknown id, already closed, or cost above the reservation).
                res = self._one(cur, "res", {"rid": reservation_id})
                closed = self._one(cur, "closed", {"rid": reservation_id})
            self._close_error(reservation_id, action, res, closed, sa, sb)
            raise ReservationError(
                f"Reservation {reservation_id!r} could not be {action}d."
            )  # pragma: no cover
        with self._tx() as cur:
            res = self._one(cur, "res", {"rid": reservation_id})
            closed = self._one(cur, "closed", {"rid": reservation_id})
            self._close_error(reservation_id, action, res, closed, sa, sb)
            assert res is not None  # _close_error raised otherwise
            principal, ra, rb = res
            if action == "reconcile":
                sa, sb = ra, rb
            try:
                # The unique index on ``closes`` refuses a concurrent second close of the same reservation.
                cur.execute(
                    self._sql("ledger"),
                    {
                        "rid": reservation_id,
                        "p": principal,
                        "a": action,
                        "t": db.now(),
                        "o": self.owner,
                        "e": ev,
                        "ra": ra,
                        "rb": rb,
                        "sa": sa,
                        "sb": sb,
                        "d": detail,
                        "c": reservation_id,
                    },
                )
            except self.engine.dialect.dbapi.IntegrityError:  # type: ignore[union-attr]  # a connected engine has its DBAPI
                raise ReservationError(
                    f"Reservation {reservation_id!r} is already closed; it cannot be {action}d."
                ) from None
            cur.execute(
                self._sql("close"), {"ra": ra, "rb": rb, "sa": sa or 0, "sb": sb or 0, "p": principal}
            )
            totals = self._lock_principal(cur, principal, create=False)
            assert totals is not None  # the reservation's principal row exists (foreign key)
            return totals

    @staticmethod
    def _close_error(
        reservation_id: str,
        action: str,
        res: tuple | None,
        closed: tuple | None,
        sa: int | None,
        sb: int | None,
    ) -> None:
        """Raise the ReservationError that explains why ``action`` cannot close the reservation, if any."""
        if res is None:
            raise ReservationError(f"Unknown reservation id {reservation_id!r}.")
        if closed is not None:
            raise ReservationError(
                f"Reservation {reservation_id!r} is already closed ({closed[0]}); it cannot be {action}d."
            )
        _, ra, rb = res
        if action == "settle" and (sa > ra or sb > rb):
            raise ReservationError(
                f"The realized cost {(sa, sb)} exceeds the reserved cost {(ra, rb)} (units) of reservation "
                f"{reservation_id!r}."
            )

    def settle(
        self,
        reservation_id: str,
        cost: tuple[float, float] | None = None,
        *,
        event: dict | None = None,
        units: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """Charge the realized ``cost`` (≤ the reserved cost; rounded up to the unit, or given exactly as
        ``units``) and release the rest. Returns the principal's totals after the settle (units).

        One statement on PostgreSQL; it does not wait for a disk flush (see the module docstring).

        Raises:
          ReservationError: unknown id, already closed (settled, cancelled, reconciled), or cost above
            the reservation. Nothing is written then.
        """
        return self._close(reservation_id, "settle", cost, event, None, units=units)

    def cancel(self, reservation_id: str) -> dict[str, int]:
        """Release a reservation whose mechanism never touched private data.

        Raises:
          ReservationError: unknown or already closed.
        """
        return self._close(reservation_id, "cancel", None, None, None)

    def reconcile(
        self, reservation_id: str, *, detail: str = "reconciled after an interrupted request"
    ) -> dict[str, int]:
        """Charge an open reservation at its reserved (worst-case) cost: the fail-closed rule."""
        return self._close(reservation_id, "reconcile", None, None, detail)

    def totals(self, principal: str) -> tuple[tuple[float, float], tuple[float, float]]:
        """``(spent, reserved)`` of ``principal``, each a pair of floats; zeros for an unknown principal."""
        row = self.snapshot(principal)
        if row is None:
            return (0.0, 0.0), (0.0, 0.0)
        return (row["spent_epsilon"], row["spent_delta"]), (row["reserved_epsilon"], row["reserved_delta"])

    # -- service extensions -------------------------------------------------------------------
    def grant(
        self, principal: str, epsilon: float, delta: float, *, note: str = "", conn: Any = None
    ) -> None:
        """Append a budget grant (creation or top-up) and raise the principal's limit (rounded down to
        the unit)."""
        ua, ub = db.units_down(float(epsilon), EPS), db.units_down(float(delta), DLT)
        if conn is None:
            with self.engine.begin() as c:
                return self.grant(principal, epsilon, delta, note=note, conn=c)
        conn.execute(text(self._SQL["new"]), {"p": principal, "t": db.now()})
        conn.execute(text(self._SQL["lock_pg" if self._pg else "lock"]), {"p": principal})
        conn.execute(
            db.budget_grants.insert().values(
                principal=principal, created_at=db.now(), epsilon=ua, delta=ub, note=note
            )
        )
        conn.execute(
            update(db.principals)
            .where(db.principals.c.principal == principal)
            .values(
                limit_epsilon=db.principals.c.limit_epsilon + ua,
                limit_delta=db.principals.c.limit_delta + ub,
            )
        )
        return None

    def snapshot(self, principal: str, *, units: bool = False) -> dict[str, Any] | None:
        """The cached totals row (limit, spent, reserved) of ``principal``, or ``None``: floats (ε, δ), or
        the exact integer units if ``units``."""
        with self._tx(write=False) as cur:
            row = self._one(cur, "lock", {"p": principal})
        if row is None:
            return None
        out = dict(zip(self._TOTALS, (int(v) for v in row)))
        return out if units else db.units_to_floats(out)

    def open_reservations(self, *, older_than_s: float = 0.0, principal: str | None = None) -> list[str]:
        """Ids of reservations with no settle/cancel/reconcile row, created more than ``older_than_s`` ago."""
        closed = select(db.ledger.c.reservation_id).where(db.ledger.c.action.in_(_CLOSING))
        q = select(db.ledger.c.reservation_id).where(
            db.ledger.c.action == "reserve",
            db.ledger.c.created_at <= db.now() - older_than_s,
            db.ledger.c.reservation_id.not_in(closed),
        )
        if principal is not None:
            q = q.where(db.ledger.c.principal == principal)
        with self.engine.connect() as conn:
            ids = [r[0] for r in conn.execute(q)]
            conn.rollback()
        return ids

    def reconcile_stale(self, *, older_than_s: float) -> list[str]:
        """Reconcile every open reservation older than ``older_than_s`` (charged at its reserved cost).

        Run at start-up and periodically; ``older_than_s`` must exceed the longest a live request can hold
        a reservation (the request timeout), so replicas never reconcile each other's live requests.

        Returns:
          The reconciled reservation ids.
        """
        done = []
        for rid in self.open_reservations(older_than_s=older_than_s):
            try:
                self.reconcile(rid)
                done.append(rid)
            except ReservationError:  # closed concurrently by its owner or another replica
                pass
        return done

    def ledger_rows(self, principal: str, *, limit: int = 100) -> list[dict[str, Any]]:
        """The latest ``limit`` ledger rows of ``principal`` (newest first), event JSON decoded."""
        q = (
            select(db.ledger)
            .where(db.ledger.c.principal == principal)
            .order_by(db.ledger.c.id.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(q).mappings()]
            conn.rollback()
        for r in rows:
            r.pop("owner", None)
            if r.get("event"):
                r["event"] = json.loads(r["event"])
            for k in ("reserved_epsilon", "realized_epsilon"):
                r[k] = None if r[k] is None else db.from_units(r[k], EPS)
            for k in ("reserved_delta", "realized_delta"):
                r[k] = None if r[k] is None else db.from_units(r[k], DLT)
        return rows

    # -- idempotency --------------------------------------------------------------------------
    def idempotency_begin(
        self,
        principal: str,
        idem_key: str,
        request_hash: str,
        *,
        ttl_s: float,
        reservation_id: str | None = None,
        stale_after_s: float | None = None,
    ) -> tuple[int, str] | None:
        """Start an attempt of a request carrying an ``Idempotency-Key``.

        Args:
          reservation_id: the id the attempt will reserve under (recorded on the pending row, so that a
            later retry can tell from the ledger whether the attempt holds a charge).
          stale_after_s: a pending attempt older than this that holds no reservation (never reserved, or
            cancelled) is dead (the service passes ``privacy.reconcile_after_s``, after which it also
            charges open reservations as abandoned): this attempt takes its key over. ``None``: never.

        Returns:
          ``(status_code, response JSON text)`` of a completed, unexpired attempt with the same key and
          request; ``None`` when a pending attempt was recorded (the caller runs the request). An expired
          row is replaced.

        Raises:
          IdempotencyConflict: an attempt with this key is in progress or was interrupted; its
            ``charged`` says whether it holds a reservation (read from the ledger).
          IdempotencyMismatch: this key was used with a different request.
        """
        t = db.now()
        tbl = db.idempotency
        cond = (tbl.c.principal == principal) & (tbl.c.idem_key == idem_key)
        pending = {
            "status": "pending",
            "reservation_id": reservation_id,
            "created_at": t,
            "expires_at": t + ttl_s,
        }
        with self.engine.begin() as conn:
            row = conn.execute(select(tbl).where(cond)).mappings().first()
            if (
                row is not None
                and row["expires_at"] is not None
                and row["expires_at"] <= t
                and row["status"] == "done"
            ):
                conn.execute(delete(tbl).where(cond))
                row = None
            if row is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            tbl.insert().values(
                                principal=principal, idem_key=idem_key, request_hash=request_hash, **pending
                            )
                        )
                    return None
                except IntegrityError:
                    raise IdempotencyConflict(_IN_PROGRESS, charged=False) from None
        if row["request_hash"] != request_hash:
            raise IdempotencyMismatch("This Idempotency-Key was used with a different request body.")
        if row["status"] == "done":
            return int(row["status_code"]), row["response"]
        charged = self._attempt_charged(row["reservation_id"])
        if charged is False and stale_after_s is not None and row["created_at"] <= t - stale_after_s:
            with self.engine.begin() as conn:  # take the dead attempt's key over (once, whatever the race)
                res = conn.execute(
                    update(tbl)
                    .where(cond, tbl.c.status == "pending", tbl.c.created_at == row["created_at"])
                    .values(**pending)
                )
            if res.rowcount == 1:
                return None
        if charged is False:
            raise IdempotencyConflict(_IN_PROGRESS, charged=False)
        raise IdempotencyConflict(
            "A request with this Idempotency-Key "
            + (
                "reserved its budget and was not answered (it is in progress, or it was interrupted): it "
                "holds a charge, at most its reserved cost"
                if charged
                else "is in progress or was interrupted; it may hold a charge, at most its reserved cost"
            )
            + ". It is not run again: send a new request with a new Idempotency-Key.",
            charged=charged,
        )

    def _attempt_charged(self, reservation_id: str | None) -> bool | None:
        """Whether the attempt that reserves under ``reservation_id`` holds a charge: its reservation is
        written and not cancelled. ``None`` when no id was recorded (unknown)."""
        if reservation_id is None:
            return None
        led = db.ledger
        with self.engine.connect() as conn:
            actions = set(
                conn.execute(select(led.c.action).where(led.c.reservation_id == reservation_id)).scalars()
            )
        return "reserve" in actions and "cancel" not in actions

    def idempotency_finish(
        self,
        principal: str,
        idem_key: str,
        *,
        status_code: int | None,
        response: str | None,
        reservation_id: str | None,
        ttl_s: float,
        attempt: str | None = None,
    ) -> None:
        """Store the answer of an attempt (``response`` JSON text), or, with ``response=None``, drop its
        pending row (a refusal that charged nothing: the client may retry with the same key).
        ``attempt``: the reservation id the attempt began with; only its own row is changed (not one a
        later attempt took over)."""
        tbl = db.idempotency
        cond = (tbl.c.principal == principal) & (tbl.c.idem_key == idem_key)
        if attempt is not None:
            cond = cond & (tbl.c.reservation_id == attempt)
        with self.engine.begin() as conn:
            if response is None:
                conn.execute(delete(tbl).where(cond & (tbl.c.status == "pending")))
            else:
                conn.execute(
                    update(tbl)
                    .where(cond)
                    .values(
                        status="done",
                        status_code=status_code,
                        response=response,
                        reservation_id=reservation_id,
                        expires_at=db.now() + float(ttl_s),
                    )
                )

    def purge_expired_answers(self) -> int:
        """Delete idempotency rows whose ``expires_at`` has passed: stored answers, and pending rows of
        interrupted attempts (answered 409 until then). Returns the number of rows deleted."""
        tbl = db.idempotency
        with self.engine.begin() as conn:
            res = conn.execute(delete(tbl).where(tbl.c.expires_at.is_not(None), tbl.c.expires_at <= db.now()))
        return int(res.rowcount or 0)
