"""Database schema of the service: API keys, budget grants, the append-only ledger, idempotency records.

SQLAlchemy 2 Core tables, so the same code runs on SQLite (the embedded default, WAL mode, every write
transaction opened with ``BEGIN IMMEDIATE``) and on PostgreSQL (several replicas sharing one ledger; a
reservation is a conditional ``UPDATE`` of the per-principal row, which row-locks it, see
:mod:`privalign.service.store`).

Tables:

* ``principals``: one row per budget holder; the lock row of every reservation. It caches the running
  totals (``spent_*``, ``reserved_*``, ``limit_*``) that are always updated in the same transaction as
  the ledger row that changes them, so they are *derivable from rows* (:func:`derive_totals` recomputes
  them; the tests check equality).
* ``api_keys``: key id, salt and salted HMAC-SHA256 of the secret (never the secret), accounting mode,
  revocation time. The key id is the principal.
* ``budget_grants``: append-only; the budget limit of a principal is the sum of its grants (creation and
  top-ups).
* ``ledger``: append-only; one row per action on a reservation (``reserve``, ``settle``, ``cancel``,
  ``reconcile``) with who, when, the event JSON, the reserved and the realized cost.
* ``idempotency``: the stored answer of a request with an ``Idempotency-Key`` header.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import Engine

__all__ = [
    "metadata",
    "principals",
    "api_keys",
    "budget_grants",
    "ledger",
    "idempotency",
    "make_engine",
    "create_schema",
    "derive_totals",
    "now",
]

metadata = MetaData()

principals = Table(
    "principals",
    metadata,
    Column("principal", String(64), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("limit_epsilon", Float, nullable=False, default=0.0),
    Column("limit_delta", Float, nullable=False, default=0.0),
    Column("spent_epsilon", Float, nullable=False, default=0.0),
    Column("spent_delta", Float, nullable=False, default=0.0),
    Column("reserved_epsilon", Float, nullable=False, default=0.0),
    Column("reserved_delta", Float, nullable=False, default=0.0),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(64), primary_key=True),  # == principal
    Column("name", String(200), nullable=False, default=""),
    Column("salt", String(64), nullable=False),
    Column("secret_hash", String(128), nullable=False),
    Column("accounting", String(16), nullable=False),  # pure | zcdp | ex-post
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
)

budget_grants = Table(
    "budget_grants",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("principal", String(64), nullable=False, index=True),
    Column("created_at", Float, nullable=False),
    Column("epsilon", Float, nullable=False),  # in the principal's accounting unit (ε, or ρ for zCDP)
    Column("delta", Float, nullable=False),
    Column("note", String(200), nullable=False, default=""),
)

ledger = Table(
    "ledger",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("reservation_id", String(64), nullable=False),
    Column("principal", String(64), nullable=False),
    Column("action", String(16), nullable=False),  # reserve | settle | cancel | reconcile
    Column("created_at", Float, nullable=False),
    Column("owner", String(64), nullable=False, default=""),  # process instance that reserved
    Column("event", Text, nullable=True),  # JSON of the privacy event (worst case / realized)
    Column("reserved_epsilon", Float, nullable=False, default=0.0),
    Column("reserved_delta", Float, nullable=False, default=0.0),
    Column("realized_epsilon", Float, nullable=True),
    Column("realized_delta", Float, nullable=True),
    Column("detail", Text, nullable=True),
    # Set to reservation_id on settle/cancel/reconcile rows, NULL on reserve rows: the unique index makes
    # a second closing row of a reservation impossible, whatever the race.
    Column("closes", String(64), nullable=True, unique=True),
    UniqueConstraint("reservation_id", "action", name="uq_ledger_reservation_action"),
    Index("ix_ledger_principal_id", "principal", "id"),
)

idempotency = Table(
    "idempotency",
    metadata,
    Column("principal", String(64), primary_key=True),
    Column("idem_key", String(200), primary_key=True),
    Column("request_hash", String(64), nullable=False),
    Column("status", String(16), nullable=False),  # pending | done
    Column("reservation_id", String(64), nullable=True),
    Column("status_code", Integer, nullable=True),
    Column("response", Text, nullable=True),
    Column("created_at", Float, nullable=False),
)


def now() -> float:
    """Wall-clock time in seconds (UTC epoch), the timestamp stored in every row."""
    return time.time()


def make_engine(url: str, *, schema: str | None = None, pool_size: int = 10, echo: bool = False) -> Engine:
    """Create an engine for ``url`` with the service's transaction discipline.

    * SQLite: WAL journal, ``busy_timeout`` 10 s, foreign-key pragma, and ``BEGIN IMMEDIATE`` for every
      transaction, so a check-and-reserve holds the write lock from its first read.
    * PostgreSQL (``postgresql+psycopg://…``): ``READ COMMITTED``; the store's hot path runs single
      statements on autocommit connections and relies on the row lock of its conditional ``UPDATE`` (and
      on ``SELECT … FOR UPDATE`` on its slower refusal path); ``schema`` (optional) sets the
      ``search_path`` (the tests use one schema per run).

    Args:
      url: SQLAlchemy database URL.
      schema: PostgreSQL schema to use (created by :func:`create_schema`).
      pool_size: connection pool size (PostgreSQL).
      echo: log SQL.

    Returns:
      The engine.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, echo=echo, connect_args={"timeout": 10.0, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            if ":memory:" not in url and url not in ("sqlite://", "sqlite:///"):
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=10000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    kwargs: dict[str, Any] = {"echo": echo, "pool_size": pool_size, "max_overflow": 2 * pool_size, "pool_pre_ping": False, "pool_recycle": 300}
    if schema:
        if not schema.replace("_", "").isalnum():
            raise ValueError(f"The 'schema' parameter must be alphanumeric/underscore. Got {schema!r} instead.")
        kwargs["connect_args"] = {"options": f"-csearch_path={schema}", "connect_timeout": 5}
    else:
        kwargs["connect_args"] = {"connect_timeout": 5}
    return create_engine(url, **kwargs)


def create_schema(engine: Engine, *, schema: str | None = None) -> None:
    """Create the tables (and the PostgreSQL schema) if they do not exist. Idempotent."""
    if schema and engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    metadata.create_all(engine)


def derive_totals(conn: Any, principal: str) -> dict[str, float]:
    """Recompute a principal's totals from the append-only rows alone (grants and ledger).

    A reservation is *open* if its only row is ``reserve``; *spent* is the realized cost of ``settle`` and
    ``reconcile`` rows; ``cancel`` releases the reservation.

    Returns:
      ``{"limit_epsilon", "limit_delta", "spent_epsilon", "spent_delta", "reserved_epsilon",
      "reserved_delta"}``.
    """
    lim = conn.execute(
        select(func.coalesce(func.sum(budget_grants.c.epsilon), 0.0), func.coalesce(func.sum(budget_grants.c.delta), 0.0)).where(
            budget_grants.c.principal == principal
        )
    ).one()
    spent = conn.execute(
        select(
            func.coalesce(func.sum(ledger.c.realized_epsilon), 0.0), func.coalesce(func.sum(ledger.c.realized_delta), 0.0)
        ).where(ledger.c.principal == principal, ledger.c.action.in_(("settle", "reconcile")))
    ).one()
    closed = select(ledger.c.reservation_id).where(
        ledger.c.principal == principal, ledger.c.action.in_(("settle", "cancel", "reconcile"))
    )
    res = conn.execute(
        select(
            func.coalesce(func.sum(ledger.c.reserved_epsilon), 0.0), func.coalesce(func.sum(ledger.c.reserved_delta), 0.0)
        ).where(ledger.c.principal == principal, ledger.c.action == "reserve", ledger.c.reservation_id.not_in(closed))
    ).one()
    return {
        "limit_epsilon": float(lim[0]),
        "limit_delta": float(lim[1]),
        "spent_epsilon": float(spent[0]),
        "spent_delta": float(spent[1]),
        "reserved_epsilon": float(res[0]),
        "reserved_delta": float(res[1]),
    }
