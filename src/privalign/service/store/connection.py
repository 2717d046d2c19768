"""The store's connection: the engine, transactions on the raw DBAPI connection, and group commit."""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine

from privalign.service.durability import GroupFlusher, sqlite_wal_flush
from privalign.service.store.units import Receipt

log = logging.getLogger("privalign.service")


class StoreConnection:
    """The engine of a :class:`~privalign.service.store.SQLBudgetStore`, its transactions and its durability
    (see there for the arguments)."""

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
