"""The ledger: reserve, settle, cancel, reconcile, grants and totals (see the package docstring)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Literal, overload

from sqlalchemy import select, text, update

from privalign.errors import BudgetExhaustedError, ReservationError
from privalign.service import db
from privalign.service.store.connection import StoreConnection
from privalign.service.store.units import DLT, EPS, Receipt, cost_units, limit_units

_CLOSING = ("settle", "cancel", "reconcile")


class ActiveKeyCheckFailed(Exception):
    """A reservation with ``require_active=True`` wrote nothing: the key is unknown or revoked, or the
    cost does not fit the (possibly stale) limit. Nothing was charged; the caller authenticates the key
    from the database and decides again."""


class LedgerStore(StoreConnection):
    """The ledger operations of :class:`~privalign.service.store.SQLBudgetStore`."""

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
            active="AND EXISTS (SELECT 1 FROM api_keys WHERE key_id = %(k)s AND revoked_at IS NULL) "
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
        active_key: str | None = None,
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
          principal: who pays (in the service: the key id, or ``"u:" + user`` for a key of a user).
          cost: worst-case cost ``(a, b)`` to reserve (rounded up to the unit).
          limit: the caller's budget ``(a, b)`` (rounded down to the unit); the granted budget, if any,
            caps it further. ``None``: the granted budget alone.
          event: optional JSON-able worst-case event, stored on the ledger row.
          require_active: also require, in the same statement (PostgreSQL) or transaction (SQLite), that
            the API key ``active_key`` exists and is not revoked; raise :class:`ActiveKeyCheckFailed`
            instead of deciding a refusal. The service uses it for a key whose secret it checked against
            a remembered hash.
          active_key: the key that ``require_active`` checks (default: ``principal``, a key with a budget
            of its own); a key of a user names itself here and its user's budget as ``principal``, so a
            revoked key of a user cannot spend while the user's other keys can.
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
                "k": active_key or principal,
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
                        f"Reservation for key {active_key or principal!r} not confirmed; nothing was charged."
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
                key = self._one(cur, "key", {"p": active_key or principal})
                locked = (
                    self._lock_principal(cur, principal, create=False)
                    if key is not None and key[0] is None
                    else None
                )
                if locked is None or self._exhausted(principal, locked, ca, cb, lim) is not None:
                    raise ActiveKeyCheckFailed(
                        f"Reservation for key {active_key or principal!r} not confirmed; nothing was charged."
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
        self.lock_principal_row(conn, principal)
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

    def lock_principal_row(self, conn: Any, principal: str) -> None:
        """On a SQLAlchemy connection in a transaction: create ``principal``'s row if missing and lock it
        until the transaction ends (PostgreSQL ``SELECT … FOR UPDATE``; a SQLite transaction holds the
        database write lock from its ``BEGIN IMMEDIATE``). Admin paths (grants, key creation)."""
        conn.execute(text(self._SQL["new"]), {"p": principal, "t": db.now()})
        conn.execute(text(self._SQL["lock_pg" if self._pg else "lock"]), {"p": principal})

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
