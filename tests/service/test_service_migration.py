"""Upgrade of a version-1 ledger (float amounts, stored answers without expiry) to version 2 (integer
units, expiring answers), on SQLite and PostgreSQL: nothing lost, nothing rounded in the holder's favour."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import inspect, select

from privalign.service import db, migrations
from privalign.service.keys import _hash, authenticate
from privalign.service.migrations.versions.v0001_float_ledger import v1_metadata
from privalign.service.store import SQLBudgetStore


def _fill_v1(engine, *, via_alembic: bool = False) -> dict:
    """Fill a version-1 ledger: created as released (``v1_metadata``, no Alembic table), or by Alembic's
    base revision ``0001`` (then stamped ``0001``)."""
    m = v1_metadata()
    if via_alembic:
        from alembic import command

        with engine.begin() as conn:
            command.upgrade(migrations.alembic_config(conn), "0001")
            assert migrations.current_revision(conn) == "0001"
    else:
        m.create_all(engine)
    t = m.tables
    now = time.time()
    salt = "ab" * 16
    with engine.begin() as conn:
        conn.execute(
            t["api_keys"]
            .insert()
            .values(
                key_id="k1",
                name="alice",
                salt=salt,
                secret_hash=_hash(salt, "s3cret"),
                accounting="ex-post",
                created_at=now,
                revoked_at=None,
            )
        )
        conn.execute(
            t["budget_grants"].insert(),
            [
                {"principal": "k1", "created_at": now, "epsilon": 2.0, "delta": 1e-6, "note": "create"},
                {"principal": "k1", "created_at": now, "epsilon": 0.1, "delta": 0.0, "note": "top-up"},
            ],
        )
        rows = []
        for i in range(3):  # three settled requests at ε = 0.1 (realized 0.07), δ charged as reserved
            rows.append(
                {
                    "reservation_id": f"r{i}",
                    "principal": "k1",
                    "action": "reserve",
                    "created_at": now,
                    "owner": "o",
                    "event": json.dumps({"epsilon": 0.1}),
                    "reserved_epsilon": 0.1,
                    "reserved_delta": 1e-8,
                    "realized_epsilon": None,
                    "realized_delta": None,
                    "detail": None,
                    "closes": None,
                }
            )
            rows.append(
                {
                    "reservation_id": f"r{i}",
                    "principal": "k1",
                    "action": "settle",
                    "created_at": now,
                    "owner": "o",
                    "event": None,
                    "reserved_epsilon": 0.1,
                    "reserved_delta": 1e-8,
                    "realized_epsilon": 0.07,
                    "realized_delta": 1e-8,
                    "detail": None,
                    "closes": f"r{i}",
                }
            )
        rows.append(
            {
                "reservation_id": "open",
                "principal": "k1",
                "action": "reserve",
                "created_at": now - 1000,
                "owner": "o",
                "event": None,
                "reserved_epsilon": 0.3,
                "reserved_delta": 0.0,
                "realized_epsilon": None,
                "realized_delta": None,
                "detail": None,
                "closes": None,
            }
        )
        conn.execute(t["ledger"].insert(), rows)
        spent_e = 0.07 + 0.07 + 0.07
        conn.execute(
            t["principals"]
            .insert()
            .values(
                principal="k1",
                created_at=now,
                limit_epsilon=2.0 + 0.1,
                limit_delta=1e-6,
                spent_epsilon=spent_e,
                spent_delta=3e-8,
                reserved_epsilon=0.3,
                reserved_delta=0.0,
            )
        )
        conn.execute(
            t["idempotency"]
            .insert()
            .values(
                principal="k1",
                idem_key="i1",
                request_hash="h",
                status="done",
                reservation_id="r0",
                status_code=200,
                response='{"ok": 1}',
                created_at=now - 10,
            )
        )
    return {"now": now}


def _check_upgraded(engine, schema=None) -> None:
    db.create_schema(engine, schema=schema)  # the upgrade
    db.create_schema(engine, schema=schema)  # idempotent
    insp = inspect(engine)
    for table, col in (
        ("ledger", "reserved_epsilon"),
        ("ledger", "realized_delta"),
        ("budget_grants", "epsilon"),
        ("principals", "spent_delta"),
    ):
        cols = {c["name"]: c for c in insp.get_columns(table, schema=schema)}
        assert "INT" in str(cols[col]["type"]).upper(), (table, col, cols[col]["type"])
    # The upgraded schema has what a fresh one has: the same tables, columns, unique constraints.
    assert set(insp.get_table_names(schema=schema)) >= set(db.metadata.tables) | {"alembic_version"}
    for name, table in db.metadata.tables.items():
        assert {c["name"] for c in insp.get_columns(name, schema=schema)} == {
            c.name for c in table.columns
        }, name
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("ledger", schema=schema)}
    uniques |= {tuple(ix["column_names"]) for ix in insp.get_indexes("ledger", schema=schema) if ix["unique"]}
    assert {("reservation_id", "action"), ("closes",)} <= uniques, uniques
    with engine.connect() as conn:
        assert conn.execute(select(db.schema_version.c.version)).scalar_one() == db.SCHEMA_VERSION
        assert migrations.current_revision(conn) == migrations.HEAD
        exact = db.derive_totals(conn, "k1", units=True)
        idem = conn.execute(select(db.idempotency)).mappings().one()
    # Grants round down from the decimal the operator wrote; charges round up from the stored float
    # (0.07 is stored as 0.07000000000000000666…, 1e-8 as 1.0000000000000000209…e-8): one unit each.
    assert exact == {
        "limit_epsilon": 2_100_000_000,
        "limit_delta": 1_000_000_000_000,
        "spent_epsilon": 3 * 70_000_001,
        "spent_delta": 3 * 10_000_000_001,
        "reserved_epsilon": 300_000_000,
        "reserved_delta": 0,
    }
    store = SQLBudgetStore(engine)
    assert store.snapshot("k1", units=True) == exact  # cached totals recomputed from the converted rows
    assert idem["response"] == '{"ok": 1}' and idem["expires_at"] == pytest.approx(
        idem["created_at"] + db.MIGRATED_IDEMPOTENCY_TTL_S
    )
    assert [r["action"] for r in store.ledger_rows("k1")].count("settle") == 3
    # The key still authenticates; the open reservation is still open and reconciled at its cost.
    key = authenticate(store, "pa_k1_s3cret")
    assert key is not None and key.limit == (2.1, 1e-6)
    assert store.reconcile_stale(older_than_s=60.0) == ["open"]
    assert store.snapshot("k1", units=True)["spent_epsilon"] == 210_000_003 + 300_000_000
    # And the ledger goes on exactly: 89_999_997 units are left. A cost given as a float rounds up from
    # its exact binary value (0.1 → 100_000_001 units, 0.08 → 80_000_001; the service runs PrivBoN at an
    # ε whose exact value is a whole number of units, so it charges 0.1 as 100_000_000).
    from privalign.errors import BudgetExhaustedError

    for _ in range(15):
        store.reserve("k1", (0.1, 0.0))
    with pytest.raises(BudgetExhaustedError):
        store.reserve("k1", (0.09, 0.0))
    r = store.reserve("k1", (0.08, 0.0))
    assert r.cost == (80_000_001, 0)
    assert r.remaining_after(r.cost) == (
        89_999_997 - 15 * 100_000_001 + 1_500_000_000 - 80_000_001,
        1_000_000_000_000 - 30_000_000_003,
    )


@pytest.mark.parametrize("via_alembic", [False, True], ids=["released-v1", "alembic-0001"])
def test_v1_ledger_upgrades_in_place_sqlite(tmp_path, via_alembic):
    eng = db.make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    _fill_v1(eng, via_alembic=via_alembic)
    _check_upgraded(eng)


@pytest.mark.postgres
@pytest.mark.parametrize("via_alembic", [False, True], ids=["released-v1", "alembic-0001"])
def test_v1_ledger_upgrades_in_place_postgres(pg_schema, via_alembic):
    url, schema = pg_schema
    eng = db.make_engine(url, schema=schema)
    if via_alembic:
        with eng.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    _fill_v1(eng, via_alembic=via_alembic)
    _check_upgraded(eng, schema)


def _pre_alembic_v2(engine) -> None:
    """A version-2 ledger created before Alembic: the current tables and the version row, no
    ``alembic_version`` (and no ``api_keys.user_name``, added by revision ``0003``)."""
    db.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE api_keys DROP COLUMN user_name")
        conn.execute(db.schema_version.insert().values(id=1, version=2))


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_fresh_and_pre_alembic_v2_databases_are_stamped(request, tmp_path, backend):
    if backend == "sqlite":
        fresh, old, schema, schema2 = (
            (db.make_engine(f"sqlite:///{tmp_path / n}") for n in ("fresh.db", "v2.db")),
            None,
            None,
            None,
        )
        fresh, old = fresh
    else:
        url, schema = request.getfixturevalue("pg_schema")
        schema2 = schema + "b"
        fresh, old = db.make_engine(url, schema=schema), db.make_engine(url, schema=schema2)
        for eng, sch in ((fresh, schema), (old, schema2)):
            with eng.begin() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{sch}"')
    try:
        db.create_schema(fresh, schema=schema)
        _pre_alembic_v2(old)
        SQLBudgetStore(old).grant("k", 1.0, 0.0)
        db.create_schema(old, schema=schema2)
        for eng in (fresh, old):
            with eng.connect() as conn:
                assert migrations.current_revision(conn) == migrations.HEAD
                assert conn.execute(select(db.schema_version.c.version)).scalar_one() == db.SCHEMA_VERSION
        assert SQLBudgetStore(old).snapshot("k", units=True)["limit_epsilon"] == db.EPS_SCALE  # untouched
    finally:
        if backend == "postgres":
            with old.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema2}" CASCADE')
        fresh.dispose()
        old.dispose()
