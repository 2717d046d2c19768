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
  revocation time, and the key's user (``user_name``, ``NULL`` for a key of its own). The budget
  principal of a key (:func:`key_principal`) is its key id when it has no user, else ``"u:" + user_name``:
  every key of a user spends from the one budget row of the user.
* ``budget_grants``: append-only; the budget limit of a principal is the sum of its grants (creation and
  top-ups).
* ``ledger``: append-only; one row per action on a reservation (``reserve``, ``settle``, ``cancel``,
  ``reconcile``) with who, when, the event JSON, the reserved and the realized cost.
* ``idempotency``: the stored answer of a request with an ``Idempotency-Key`` header, with its expiry
  time (``expires_at``); expired rows are ignored and deleted by reconciliation.
* ``privalign_schema``: the schema version (:data:`SCHEMA_VERSION`); ``alembic_version``: the Alembic
  revision. :func:`create_schema` upgrades an older ledger in place with the Alembic migrations of
  :mod:`privalign.service.migrations`.

**Amounts are integers in fixed units** (exact arithmetic, no float rounding in any sum): ε and ρ in
:data:`EPS_UNIT` = 10⁻⁹ (nano-ε), δ in :data:`DELTA_UNIT` = 10⁻¹⁸. A cost is converted by rounding **up**
to the unit (:func:`units_up`), a granted budget by rounding **down** (:func:`units_down`), so the exact
integer sums never undercount (a budget given as a float is read as the decimal it prints as: ``2.0``,
``1e-6``). The minimum non-zero charge is one unit (10⁻⁹ ε).
"""

from __future__ import annotations

import math
import os
import time
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlalchemy import (
    BigInteger,
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

from privalign.service import migrations

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
    "units_to_floats",
    "now",
    "EPS_SCALE",
    "DELTA_SCALE",
    "SCHEMA_VERSION",
    "units_up",
    "units_down",
    "from_units",
    "key_principal",
    "USER_PREFIX",
]

#: Units per ε (or ρ): amounts are stored as integers of 10⁻⁹ ε.
EPS_SCALE = 10**9
#: Units per δ: integers of 10⁻¹⁸.
DELTA_SCALE = 10**18
#: Largest amount a column may hold (int64 with room for the sum spent + reserved + cost in a check).
MAX_UNITS = 2**61
#: Version 1: float amounts, no ``expires_at``; version 2: integer units, idempotency expiry; version 3:
#: ``api_keys.user_name`` (budgets shared by the keys of a user).
SCHEMA_VERSION = 3
#: Principal of a user's shared budget: this prefix and the user name (a key id is 16 hex digits, so the
#: two never collide).
USER_PREFIX = "u:"


def key_principal(key_id: str, user_name: str | None) -> str:
    """The budget principal of a key: its own id, or its user's shared budget ``"u:" + user_name``."""
    return key_id if user_name is None else USER_PREFIX + user_name


def _exact(x: float | int | Fraction | Decimal) -> Fraction:
    if isinstance(x, bool):
        raise TypeError(f"An amount must be a number, not a bool. Got {x!r} instead.")
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError(f"An amount must be finite. Got {x!r} instead.")
    return Fraction(x)


def units_up(x: float | int | Fraction | Decimal, scale: int) -> int:
    """The smallest integer number of units ≥ ``x`` (exact; a cost is never rounded down)."""
    q = _exact(x) * scale
    n = -((-q.numerator) // q.denominator)
    if n < 0 or n > MAX_UNITS:
        raise ValueError(f"Amount {x!r} is outside [0, {MAX_UNITS / scale:g}].")
    return int(n)


def units_down(x: float | int | Fraction | Decimal, scale: int) -> int:
    """The largest integer number of units ≤ ``x`` (a granted budget is never rounded up). A float is read
    as the shortest decimal that round-trips it (``1e-6`` is the budget 10⁻⁶ the operator wrote, not the
    binary float just below it)."""
    if isinstance(x, float):
        _exact(x)
        x = Decimal(repr(x))
    q = _exact(x) * scale
    n = q.numerator // q.denominator
    if n < 0 or n > MAX_UNITS:
        raise ValueError(f"Amount {x!r} is outside [0, {MAX_UNITS / scale:g}].")
    return int(n)


def from_units(n: int | None, scale: int) -> float:
    """Units as a float (for JSON answers; the ledger keeps the exact integers)."""
    return 0.0 if n is None else int(n) / scale


metadata = MetaData()

principals = Table(
    "principals",
    metadata,
    Column("principal", String(64), primary_key=True),
    Column("created_at", Float, nullable=False),
    # integer units (EPS_SCALE / DELTA_SCALE)
    Column("limit_epsilon", BigInteger, nullable=False, default=0),
    Column("limit_delta", BigInteger, nullable=False, default=0),
    Column("spent_epsilon", BigInteger, nullable=False, default=0),
    Column("spent_delta", BigInteger, nullable=False, default=0),
    Column("reserved_epsilon", BigInteger, nullable=False, default=0),
    Column("reserved_delta", BigInteger, nullable=False, default=0),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(64), primary_key=True),  # the principal when user_name is NULL
    Column("name", String(200), nullable=False, default=""),
    Column("salt", String(64), nullable=False),
    Column("secret_hash", String(128), nullable=False),
    Column("accounting", String(16), nullable=False),  # pure | zcdp | ex-post
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
    # the user whose shared budget the key spends (principal "u:" + user_name); NULL: the key's own budget
    Column("user_name", String(60), nullable=True),
)

budget_grants = Table(
    "budget_grants",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("principal", String(64), nullable=False, index=True),
    Column("created_at", Float, nullable=False),
    Column("epsilon", BigInteger, nullable=False),  # units of the principal's accounting (ε, or ρ for zCDP)
    Column("delta", BigInteger, nullable=False),
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
    Column("reserved_epsilon", BigInteger, nullable=False, default=0),
    Column("reserved_delta", BigInteger, nullable=False, default=0),
    Column("realized_epsilon", BigInteger, nullable=True),
    Column("realized_delta", BigInteger, nullable=True),
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
    Column("expires_at", Float, nullable=True),  # stored answers are ignored after, and purged
)

schema_version = Table(
    "privalign_schema",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
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
        _private_file(url)
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
    kwargs: dict[str, Any] = {
        "echo": echo,
        "pool_size": pool_size,
        "max_overflow": 2 * pool_size,
        "pool_pre_ping": False,
        "pool_recycle": 300,
    }
    if schema:
        if not schema.replace("_", "").isalnum():
            raise ValueError(
                f"The 'schema' parameter must be alphanumeric/underscore. Got {schema!r} instead."
            )
        kwargs["connect_args"] = {"options": f"-csearch_path={schema}", "connect_timeout": 5}
    else:
        kwargs["connect_args"] = {"connect_timeout": 5}
    return create_engine(url, **kwargs)


def _private_file(url: str) -> None:
    """Create a SQLite database file readable by its owner only (mode 0600) before SQLite opens it; an
    existing file is tightened to 0600. SQLite creates its ``-wal`` and ``-shm`` files with the mode of
    the database file. The ledger holds stored answers of Idempotency-Key requests (until they expire)."""
    path = url.split("///", 1)[1] if "///" in url else ""
    path = path.split("?", 1)[0]
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"cannot open the SQLite database {path!r} ({exc.strerror}); check the "
            "database URL (--db or [database].url)",
        ) from None
    os.close(fd)
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o600)
    for suffix in ("-wal", "-shm", "-journal"):
        if os.path.exists(path + suffix) and os.stat(path + suffix).st_mode & 0o077:
            os.chmod(path + suffix, 0o600)


def create_schema(engine: Engine, *, schema: str | None = None) -> None:
    """Create the tables (and the PostgreSQL schema) if they do not exist, or upgrade an older ledger in
    place, with the Alembic migrations shipped in :mod:`privalign.service.migrations` (a fresh database
    is created from :data:`metadata` and stamped with the newest revision). Idempotent; safe for replicas
    starting together: it runs in one transaction under a lock (PostgreSQL: a transaction-level advisory
    lock; SQLite: ``BEGIN IMMEDIATE``)."""
    if schema and engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(72177301)")
        if migrations.is_empty(conn, schema=schema or None):
            metadata.create_all(conn)
            conn.execute(schema_version.insert().values(id=1, version=SCHEMA_VERSION))
            migrations.stamp_head(conn)
        else:
            migrations.upgrade(conn, schema=schema or None)


#: Stored answers of a version-1 ledger (which had no expiry) expire this long after their creation
#: (revision ``0002``).
MIGRATED_IDEMPOTENCY_TTL_S = 86400.0


def derive_totals(conn: Any, principal: str, *, units: bool = False) -> dict[str, Any]:
    """Recompute a principal's totals from the append-only rows alone (grants and ledger).

    A reservation is *open* if its only row is ``reserve``; *spent* is the realized cost of ``settle`` and
    ``reconcile`` rows; ``cancel`` releases the reservation.

    Returns:
      ``{"limit_epsilon", "limit_delta", "spent_epsilon", "spent_delta", "reserved_epsilon",
      "reserved_delta"}``: exact integer units if ``units``, else floats (ε, δ).
    """
    lim = conn.execute(
        select(
            func.coalesce(func.sum(budget_grants.c.epsilon), 0),
            func.coalesce(func.sum(budget_grants.c.delta), 0),
        ).where(budget_grants.c.principal == principal)
    ).one()
    spent = conn.execute(
        select(
            func.coalesce(func.sum(ledger.c.realized_epsilon), 0),
            func.coalesce(func.sum(ledger.c.realized_delta), 0),
        ).where(ledger.c.principal == principal, ledger.c.action.in_(("settle", "reconcile")))
    ).one()
    closed = select(ledger.c.reservation_id).where(
        ledger.c.principal == principal, ledger.c.action.in_(("settle", "cancel", "reconcile"))
    )
    res = conn.execute(
        select(
            func.coalesce(func.sum(ledger.c.reserved_epsilon), 0),
            func.coalesce(func.sum(ledger.c.reserved_delta), 0),
        ).where(
            ledger.c.principal == principal,
            ledger.c.action == "reserve",
            ledger.c.reservation_id.not_in(closed),
        )
    ).one()
    out = {
        "limit_epsilon": int(lim[0]),
        "limit_delta": int(lim[1]),
        "spent_epsilon": int(spent[0]),
        "spent_delta": int(spent[1]),
        "reserved_epsilon": int(res[0]),
        "reserved_delta": int(res[1]),
    }
    return out if units else units_to_floats(out)


def units_to_floats(row: dict[str, int]) -> dict[str, float]:
    """A totals dict in units → ε/δ floats (``*_delta`` keys use :data:`DELTA_SCALE`)."""
    return {k: from_units(v, DELTA_SCALE if k.endswith("delta") else EPS_SCALE) for k, v in row.items()}
