"""Upgrade of a version-1 ledger (float amounts, stored answers without expiry) to version 2 (integer
units, expiring answers), on SQLite and PostgreSQL: nothing lost, nothing rounded in the holder's favour."""

from __future__ import annotations

import json
import time

import pytest
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
    inspect,
    select,
)

from privalign.service import db
from privalign.service.keys import _hash, authenticate
from privalign.service.store import SQLBudgetStore


def _v1_metadata() -> MetaData:
    """The schema as released before issue 17 (privalign/service/db.py at that commit)."""
    m = MetaData()
    Table("principals", m, Column("principal", String(64), primary_key=True), Column("created_at", Float, nullable=False),
          *[Column(c, Float, nullable=False, default=0.0) for c in ("limit_epsilon", "limit_delta", "spent_epsilon", "spent_delta",
                                                                    "reserved_epsilon", "reserved_delta")])
    Table("api_keys", m, Column("key_id", String(64), primary_key=True), Column("name", String(200), nullable=False, default=""),
          Column("salt", String(64), nullable=False), Column("secret_hash", String(128), nullable=False),
          Column("accounting", String(16), nullable=False), Column("created_at", Float, nullable=False),
          Column("revoked_at", Float, nullable=True))
    Table("budget_grants", m, Column("id", Integer, primary_key=True, autoincrement=True),
          Column("principal", String(64), nullable=False, index=True), Column("created_at", Float, nullable=False),
          Column("epsilon", Float, nullable=False), Column("delta", Float, nullable=False),
          Column("note", String(200), nullable=False, default=""))
    Table("ledger", m, Column("id", Integer, primary_key=True, autoincrement=True), Column("reservation_id", String(64), nullable=False),
          Column("principal", String(64), nullable=False), Column("action", String(16), nullable=False),
          Column("created_at", Float, nullable=False), Column("owner", String(64), nullable=False, default=""),
          Column("event", Text, nullable=True), Column("reserved_epsilon", Float, nullable=False, default=0.0),
          Column("reserved_delta", Float, nullable=False, default=0.0), Column("realized_epsilon", Float, nullable=True),
          Column("realized_delta", Float, nullable=True), Column("detail", Text, nullable=True),
          Column("closes", String(64), nullable=True, unique=True),
          UniqueConstraint("reservation_id", "action", name="uq_ledger_reservation_action"),
          Index("ix_ledger_principal_id", "principal", "id"))
    Table("idempotency", m, Column("principal", String(64), primary_key=True), Column("idem_key", String(200), primary_key=True),
          Column("request_hash", String(64), nullable=False), Column("status", String(16), nullable=False),
          Column("reservation_id", String(64), nullable=True), Column("status_code", Integer, nullable=True),
          Column("response", Text, nullable=True), Column("created_at", Float, nullable=False))
    return m


def _fill_v1(engine) -> dict:
    m = _v1_metadata()
    m.create_all(engine)
    t = m.tables
    now = time.time()
    salt = "ab" * 16
    with engine.begin() as conn:
        conn.execute(t["api_keys"].insert().values(key_id="k1", name="alice", salt=salt, secret_hash=_hash(salt, "s3cret"),
                                                   accounting="ex-post", created_at=now, revoked_at=None))
        conn.execute(t["budget_grants"].insert(), [
            {"principal": "k1", "created_at": now, "epsilon": 2.0, "delta": 1e-6, "note": "create"},
            {"principal": "k1", "created_at": now, "epsilon": 0.1, "delta": 0.0, "note": "top-up"},
        ])
        rows = []
        for i in range(3):  # three settled requests at ε = 0.1 (realized 0.07), δ charged as reserved
            rows.append({"reservation_id": f"r{i}", "principal": "k1", "action": "reserve", "created_at": now, "owner": "o",
                         "event": json.dumps({"epsilon": 0.1}), "reserved_epsilon": 0.1, "reserved_delta": 1e-8,
                         "realized_epsilon": None, "realized_delta": None, "detail": None, "closes": None})
            rows.append({"reservation_id": f"r{i}", "principal": "k1", "action": "settle", "created_at": now, "owner": "o",
                         "event": None, "reserved_epsilon": 0.1, "reserved_delta": 1e-8, "realized_epsilon": 0.07,
                         "realized_delta": 1e-8, "detail": None, "closes": f"r{i}"})
        rows.append({"reservation_id": "open", "principal": "k1", "action": "reserve", "created_at": now - 1000, "owner": "o",
                     "event": None, "reserved_epsilon": 0.3, "reserved_delta": 0.0, "realized_epsilon": None,
                     "realized_delta": None, "detail": None, "closes": None})
        conn.execute(t["ledger"].insert(), rows)
        spent_e = 0.07 + 0.07 + 0.07
        conn.execute(t["principals"].insert().values(principal="k1", created_at=now, limit_epsilon=2.0 + 0.1, limit_delta=1e-6,
                                                     spent_epsilon=spent_e, spent_delta=3e-8, reserved_epsilon=0.3, reserved_delta=0.0))
        conn.execute(t["idempotency"].insert().values(principal="k1", idem_key="i1", request_hash="h", status="done",
                                                      reservation_id="r0", status_code=200, response='{"ok": 1}', created_at=now - 10))
    return {"now": now}


def _check_upgraded(engine, schema=None) -> None:
    db.create_schema(engine, schema=schema)  # the upgrade
    db.create_schema(engine, schema=schema)  # idempotent
    cols = {c["name"]: c for c in inspect(engine).get_columns("ledger", schema=schema)}
    assert "INT" in str(cols["reserved_epsilon"]["type"]).upper()
    with engine.connect() as conn:
        assert conn.execute(select(db.schema_version.c.version)).scalar_one() == db.SCHEMA_VERSION
        exact = db.derive_totals(conn, "k1", units=True)
        idem = conn.execute(select(db.idempotency)).mappings().one()
    # Grants round down from the decimal the operator wrote; charges round up from the stored float
    # (0.07 is stored as 0.07000000000000000666…, 1e-8 as 1.0000000000000000209…e-8): one unit each.
    assert exact == {
        "limit_epsilon": 2_100_000_000, "limit_delta": 1_000_000_000_000,
        "spent_epsilon": 3 * 70_000_001, "spent_delta": 3 * 10_000_000_001,
        "reserved_epsilon": 300_000_000, "reserved_delta": 0,
    }
    store = SQLBudgetStore(engine)
    assert store.snapshot("k1", units=True) == exact  # cached totals recomputed from the converted rows
    assert idem["response"] == '{"ok": 1}' and idem["expires_at"] == pytest.approx(idem["created_at"] + db.MIGRATED_IDEMPOTENCY_TTL_S)
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
    assert r.remaining_after(r.cost) == (89_999_997 - 15 * 100_000_001 + 1_500_000_000 - 80_000_001, 1_000_000_000_000 - 30_000_000_003)


def test_v1_ledger_upgrades_in_place_sqlite(tmp_path):
    eng = db.make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    _fill_v1(eng)
    _check_upgraded(eng)


@pytest.mark.postgres
def test_v1_ledger_upgrades_in_place_postgres(pg_schema):
    url, schema = pg_schema
    eng = db.make_engine(url, schema=schema)
    _fill_v1(eng)
    _check_upgraded(eng, schema)
