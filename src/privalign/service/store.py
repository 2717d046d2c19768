"""``SQLBudgetStore``: the ``BudgetStore`` protocol of ``privalign.accounting.filters`` on a real database.

Reserve-before-run and settle-after-run are single transactions:

* **SQLite**: every transaction starts with ``BEGIN IMMEDIATE`` (see :func:`privalign.service.db.make_engine`),
  so the read of the balance and the write of the reservation happen under one database write lock.
* **PostgreSQL**: the principal's row is locked with ``SELECT … FOR UPDATE`` before the balance is read;
  concurrent reservations on the same principal (from any number of service processes) are serialised
  on that row, reservations on different principals do not contend.

Every change is an append-only ``ledger`` row; the cached totals on the ``principals`` row are updated in
the same transaction and are always equal to :func:`privalign.service.db.derive_totals`.

Costs are pairs ``(a, b)`` in the unit of the filter that uses the store (``(ε, δ)`` for pure and ex-post
filters, ``(ρ, 0)`` for zCDP). A reservation is refused when ``spent + reserved + cost > limit`` in either
coordinate; nothing is written then.
"""

from __future__ import annotations

import contextvars
import json
import math
import re
import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.engine import Engine

from privalign.errors import BudgetExhaustedError, PrivacyParameterError, ReservationError
from privalign.service import db

__all__ = ["SQLBudgetStore", "ledger_event", "last_totals"]

#: The event a caller (e.g. a filter invoked by the service) is reserving or settling; written on the
#: ledger row when the protocol call itself carries no event. Set with ``ledger_event.set(dict)``.
ledger_event: contextvars.ContextVar[dict | None] = contextvars.ContextVar("privalign_ledger_event", default=None)

#: The principal's totals row as committed by the last close (settle/cancel/reconcile) in this context,
#: read back inside the same transaction (saves the service a round trip for the ``remaining`` field).
last_totals: contextvars.ContextVar[dict | None] = contextvars.ContextVar("privalign_last_totals", default=None)

_CLOSING = ("settle", "cancel", "reconcile")


def _check_cost(cost: Sequence[float], name: str) -> tuple[float, float]:
    if len(cost) != 2:
        raise PrivacyParameterError(f"The '{name}' parameter must be a pair (a, b). Got {cost!r} instead.")
    a, b = float(cost[0]), float(cost[1])
    for v in (a, b):
        if math.isnan(v) or v < 0 or math.isinf(v):
            raise PrivacyParameterError(f"The '{name}' parameter must be a pair of finite non-negative floats. Got {cost!r} instead.")
    return a, b


class SQLBudgetStore:
    """A transactional, durable ``BudgetStore`` backed by SQLAlchemy (SQLite or PostgreSQL).

    Args:
      engine: from :func:`privalign.service.db.make_engine`; the tables must exist
        (:func:`privalign.service.db.create_schema`).
      owner: identifier of this process (written on reservations; used by reconciliation).
      durable_settle: flush each settle to disk before returning (default; see :meth:`_tx`). ``False``
        never waits for a flush: the ledger then survives a crash of the *service* process (the tests
        kill -9 it) but a power loss or OS crash can lose the last settled rows, i.e. charges of answers
        already released.

    The limit passed to :meth:`try_reserve` is combined with the principal's granted budget (the sum of
    its ``budget_grants`` rows) by taking the minimum, so a stale limit can only be more conservative.
    """

    def __init__(self, engine: Engine, *, owner: str | None = None, durable_settle: bool = True) -> None:
        self.engine = engine
        self.durable_settle = bool(durable_settle)
        self.owner = owner or uuid.uuid4().hex
        self._pg = engine.dialect.name == "postgresql"

    # -- helpers ------------------------------------------------------------------------------
    # The hot path (reserve, settle, cancel, totals) talks to the DBAPI connection directly, with SQL
    # written once and translated to the driver's parameter style: SQLAlchemy's statement machinery cost
    # several CPU milliseconds per request (benchmarks/bench_service_select.py). Admin paths use Core.
    _SQL = {
        "lock": "SELECT limit_epsilon, limit_delta, spent_epsilon, spent_delta, reserved_epsilon, reserved_delta "
                "FROM principals WHERE principal = :p",
        "lock_pg": "SELECT limit_epsilon, limit_delta, spent_epsilon, spent_delta, reserved_epsilon, reserved_delta "
                   "FROM principals WHERE principal = :p FOR UPDATE",
        "new": "INSERT INTO principals (principal, created_at, limit_epsilon, limit_delta, spent_epsilon, spent_delta, "
               "reserved_epsilon, reserved_delta) VALUES (:p, :t, 0, 0, 0, 0, 0, 0) ON CONFLICT DO NOTHING",
        "ledger": "INSERT INTO ledger (reservation_id, principal, action, created_at, owner, event, reserved_epsilon, "
                  "reserved_delta, realized_epsilon, realized_delta, detail, closes) VALUES (:rid, :p, :a, :t, :o, :e, "
                  ":ra, :rb, :sa, :sb, :d, :c)",
        "add_reserved": "UPDATE principals SET reserved_epsilon = reserved_epsilon + :a, "
                        "reserved_delta = reserved_delta + :b WHERE principal = :p",
        "close": "UPDATE principals SET reserved_epsilon = reserved_epsilon - :ra, reserved_delta = reserved_delta - :rb, "
                 "spent_epsilon = spent_epsilon + :sa, spent_delta = spent_delta + :sb WHERE principal = :p",
        "res": "SELECT principal, reserved_epsilon, reserved_delta FROM ledger WHERE reservation_id = :rid AND action = 'reserve'",
        "closed": "SELECT action FROM ledger WHERE closes = :rid",
    }
    _TOTALS = ("limit_epsilon", "limit_delta", "spent_epsilon", "spent_delta", "reserved_epsilon", "reserved_delta")

    def _sql(self, name: str) -> str:
        s = self._SQL[name]
        return re.sub(r":([a-z]+)", r"%(\1)s", s) if self._pg else s

    @contextmanager
    def _tx(self, *, write: bool = True, durable: bool = False):
        """A DBAPI cursor in one transaction (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: implicit BEGIN).

        Durability rule: only a **settle** is flushed to disk before it returns (``durable=True``: SQLite
        ``synchronous=FULL``, PostgreSQL ``synchronous_commit`` on). Reserve, cancel and reconcile commit
        without waiting for the flush (they are visible to every other transaction at once, so the
        budget check is unaffected). The log is sequential, so the settle's flush also makes the earlier
        reserve durable, and the service releases a selection only after settle returns: a released
        answer is therefore always durably charged. A database crash can lose only reservations whose
        answers were never released (no privacy cost), or a cancel/reconcile, which at worst reappears
        as an open reservation and is charged at its reserved cost.
        """
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            if not self._pg and write:
                cur.execute("PRAGMA synchronous=FULL" if durable else "PRAGMA synchronous=NORMAL")
                cur.execute("BEGIN IMMEDIATE")
            elif self._pg and write and not durable:
                cur.execute("SET LOCAL synchronous_commit TO OFF")
            try:
                yield cur
            except BaseException:
                raw.rollback()
                raise
            if self._pg or write:
                raw.commit()
            cur.close()
        finally:
            raw.close()

    def query_one(self, sql: str, params: dict) -> dict | None:
        """Run one read-only statement (``:name`` parameters) on the raw connection; first row as a dict."""
        if self._pg:
            sql = re.sub(r":([a-z_]+)", r"%(\1)s", sql)
        with self._tx(write=False) as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
            cols = [d[0] for d in cur.description] if cur.description else []
        return None if row is None else dict(zip(cols, row))

    def _one(self, cur: Any, name: str, params: dict) -> tuple | None:
        cur.execute(self._sql(name), params)
        return cur.fetchone()

    def _lock_principal(self, cur: Any, principal: str, *, create: bool) -> dict | None:
        q = "lock_pg" if self._pg else "lock"
        row = self._one(cur, q, {"p": principal})
        if row is None and create:
            cur.execute(self._sql("new"), {"p": principal, "t": db.now()})
            row = self._one(cur, q, {"p": principal})
        return None if row is None else dict(zip(self._TOTALS, row))

    # -- BudgetStore protocol -----------------------------------------------------------------
    def try_reserve(
        self,
        principal: str,
        cost: tuple[float, float],
        limit: tuple[float, float],
        *,
        event: dict | None = None,
    ) -> str:
        """Atomically check ``spent + reserved + cost ≤ limit`` and record a reservation.

        Args:
          principal: who pays (the API key id in the service).
          cost: worst-case cost ``(a, b)`` to reserve.
          limit: the caller's budget ``(a, b)``; the granted budget, if any, caps it further.
          event: optional JSON-able worst-case event, stored on the ledger row (default: the
            :data:`ledger_event` context variable).

        Returns:
          The reservation id.

        Raises:
          BudgetExhaustedError: the reservation would exceed the limit (``remaining`` has keys
            ``"primary"`` and ``"delta"``); nothing was written.
          PrivacyParameterError: a malformed cost or limit.
        """
        ca, cb = _check_cost(cost, "cost")
        event = event if event is not None else ledger_event.get()
        la, lb = float(limit[0]), float(limit[1])
        rid = uuid.uuid4().hex
        with self._tx() as cur:
            row = self._lock_principal(cur, principal, create=True)
            if row["limit_epsilon"] > 0 or row["limit_delta"] > 0:  # granted budget (grants are positive)
                la, lb = min(la, row["limit_epsilon"]), min(lb, row["limit_delta"])
            used_a = row["spent_epsilon"] + row["reserved_epsilon"]
            used_b = row["spent_delta"] + row["reserved_delta"]
            if used_a + ca > la or used_b + cb > lb:
                remaining = {"primary": max(0.0, la - used_a), "delta": max(0.0, lb - used_b)}
                raise BudgetExhaustedError(
                    f"Reserving cost {(ca, cb)} for principal {principal!r} would exceed its budget {(la, lb)}; "
                    f"remaining {remaining}. Nothing was charged.",
                    remaining=remaining,
                )
            cur.execute(self._sql("ledger"), {
                "rid": rid, "p": principal, "a": "reserve", "t": db.now(), "o": self.owner,
                "e": json.dumps(event) if event is not None else None, "ra": ca, "rb": cb,
                "sa": None, "sb": None, "d": None, "c": None,
            })
            cur.execute(self._sql("add_reserved"), {"a": ca, "b": cb, "p": principal})
        return rid

    def _close(self, reservation_id: str, action: str, cost: tuple[float, float] | None, event: dict | None, detail: str | None) -> None:
        if event is None and action == "settle":
            event = ledger_event.get()
        with self._tx(durable=action == "settle" and self.durable_settle) as cur:
            res = self._one(cur, "res", {"rid": reservation_id})
            if res is None:
                raise ReservationError(f"Unknown reservation id {reservation_id!r}.")
            principal, ra, rb = res
            closed = self._one(cur, "closed", {"rid": reservation_id})
            if closed is not None:
                raise ReservationError(f"Reservation {reservation_id!r} is already closed ({closed[0]}); it cannot be {action}d.")
            if action == "cancel":
                sa, sb = None, None
            elif action == "reconcile":
                sa, sb = ra, rb
            else:
                sa, sb = _check_cost(cost, "cost")  # type: ignore[arg-type]
                if sa > ra or sb > rb:
                    raise ReservationError(
                        f"The realized cost {(sa, sb)} exceeds the reserved cost {(ra, rb)} of reservation {reservation_id!r}."
                    )
            try:
                # The unique index on ``closes`` refuses a concurrent second close of the same reservation.
                cur.execute(self._sql("ledger"), {
                    "rid": reservation_id, "p": principal, "a": action, "t": db.now(), "o": self.owner,
                    "e": json.dumps(event) if event is not None else None, "ra": ra, "rb": rb,
                    "sa": sa, "sb": sb, "d": detail, "c": reservation_id,
                })
            except self.engine.dialect.dbapi.IntegrityError:
                raise ReservationError(f"Reservation {reservation_id!r} is already closed; it cannot be {action}d.") from None
            cur.execute(self._sql("close"), {"ra": ra, "rb": rb, "sa": sa or 0.0, "sb": sb or 0.0, "p": principal})
            last_totals.set(self._lock_principal(cur, principal, create=False))

    def settle(self, reservation_id: str, cost: tuple[float, float], *, event: dict | None = None) -> None:
        """Charge the realized ``cost`` (≤ the reserved cost) and release the rest.

        Raises:
          ReservationError: unknown id, already closed (settled, cancelled, reconciled), or cost above
            the reservation. Nothing is written then.
        """
        self._close(reservation_id, "settle", cost, event, None)

    def cancel(self, reservation_id: str) -> None:
        """Release a reservation whose mechanism never touched private data.

        Raises:
          ReservationError: unknown or already closed.
        """
        self._close(reservation_id, "cancel", None, None, None)

    def reconcile(self, reservation_id: str, *, detail: str = "reconciled after an interrupted request") -> None:
        """Charge an open reservation at its reserved (worst-case) cost: the fail-closed rule."""
        self._close(reservation_id, "reconcile", None, None, detail)

    def totals(self, principal: str) -> tuple[tuple[float, float], tuple[float, float]]:
        """``(spent, reserved)`` of ``principal``, each a pair; zeros for an unknown principal."""
        row = self.snapshot(principal)
        if row is None:
            return (0.0, 0.0), (0.0, 0.0)
        return (row["spent_epsilon"], row["spent_delta"]), (row["reserved_epsilon"], row["reserved_delta"])

    # -- service extensions -------------------------------------------------------------------
    def grant(self, principal: str, epsilon: float, delta: float, *, note: str = "", conn: Any = None) -> None:
        """Append a budget grant (creation or top-up) and raise the principal's limit."""
        if conn is None:
            with self.engine.begin() as c:
                return self.grant(principal, epsilon, delta, note=note, conn=c)
        conn.execute(text(self._SQL["new"]), {"p": principal, "t": db.now()})
        conn.execute(text(self._SQL["lock_pg" if self._pg else "lock"]), {"p": principal})
        conn.execute(
            db.budget_grants.insert().values(principal=principal, created_at=db.now(), epsilon=float(epsilon), delta=float(delta), note=note)
        )
        conn.execute(
            update(db.principals)
            .where(db.principals.c.principal == principal)
            .values(
                limit_epsilon=db.principals.c.limit_epsilon + float(epsilon),
                limit_delta=db.principals.c.limit_delta + float(delta),
            )
        )
        return None

    def snapshot(self, principal: str) -> dict[str, float] | None:
        """The cached totals row (limit, spent, reserved) of ``principal``, or ``None``."""
        with self._tx(write=False) as cur:
            row = self._one(cur, "lock", {"p": principal})
        return None if row is None else dict(zip(self._TOTALS, row))

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
        q = select(db.ledger).where(db.ledger.c.principal == principal).order_by(db.ledger.c.id.desc()).limit(limit)
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(q).mappings()]
            conn.rollback()
        for r in rows:
            r.pop("owner", None)
            if r.get("event"):
                r["event"] = json.loads(r["event"])
        return rows
