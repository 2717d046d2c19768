"""SQLBudgetStore: the BudgetStore protocol on SQLite and PostgreSQL; ledger rows explain the totals."""

from __future__ import annotations

import math
import threading

import pytest

from privalign.errors import BudgetExhaustedError, PrivacyParameterError, ReservationError
from privalign.service import db
from privalign.service.store import SQLBudgetStore


def _sqlite(tmp_path):
    eng = db.make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    db.create_schema(eng)
    return eng


def _pg(pg_schema):
    url, schema = pg_schema
    eng = db.make_engine(url, schema=schema)
    db.create_schema(eng, schema=schema)
    return eng


def _check_derivable(store: SQLBudgetStore, principal: str) -> None:
    snap = store.snapshot(principal)
    with store.engine.connect() as conn:
        derived = db.derive_totals(conn, principal)
    for k, v in derived.items():
        assert math.isclose(snap[k], v, rel_tol=1e-12, abs_tol=1e-12), (k, snap[k], v)


def _protocol(store: SQLBudgetStore) -> None:
    lim = (1.0, 1e-5)
    r1 = store.try_reserve("alice", (0.4, 1e-6), lim, event={"kind": "pure_dp", "epsilon": 0.4})
    r2 = store.try_reserve("alice", (0.4, 0.0), lim)
    with pytest.raises(BudgetExhaustedError) as ei:
        store.try_reserve("alice", (0.3, 0.0), lim)
    assert ei.value.remaining["primary"] == pytest.approx(0.2)
    spent, reserved = store.totals("alice")
    assert spent == (0.0, 0.0) and reserved == pytest.approx((0.8, 1e-6))
    with pytest.raises(ReservationError, match="exceeds the reserved"):
        store.settle(r1, (0.5, 0.0))
    store.settle(r1, (0.1, 1e-6))
    with pytest.raises(ReservationError, match="already closed"):
        store.settle(r1, (0.1, 0.0))
    with pytest.raises(ReservationError, match="already closed"):
        store.cancel(r1)
    store.cancel(r2)
    with pytest.raises(ReservationError, match="Unknown"):
        store.cancel("nope")
    spent, reserved = store.totals("alice")
    assert spent == pytest.approx((0.1, 1e-6)) and reserved == (0.0, 0.0)
    # Other principals are independent; grants cap the limit passed by a caller.
    store.grant("bob", 0.5, 0.0)
    with pytest.raises(BudgetExhaustedError):
        store.try_reserve("bob", (0.6, 0.0), (10.0, 0.0))
    r3 = store.try_reserve("bob", (0.5, 0.0), (10.0, 0.0))
    # Reconciliation charges an open reservation at its reserved cost (fail closed).
    assert store.open_reservations(principal="bob") == [r3]
    assert store.reconcile_stale(older_than_s=0.0) == [r3]
    assert store.totals("bob")[0] == (0.5, 0.0)
    with pytest.raises(PrivacyParameterError):
        store.try_reserve("bob", (-1.0, 0.0), (1.0, 0.0))
    with pytest.raises(PrivacyParameterError):
        store.try_reserve("bob", (float("nan"), 0.0), (1.0, 0.0))
    actions = [r["action"] for r in store.ledger_rows("bob")]
    assert actions == ["reconcile", "reserve"]
    for p in ("alice", "bob"):
        _check_derivable(store, p)


def _race(store: SQLBudgetStore, threads: int, per_thread: int) -> None:
    store.grant("race", 1.0, 0.0)
    ok, refused = [], []

    def worker():
        for _ in range(per_thread):
            try:
                rid = store.try_reserve("race", (0.03, 0.0), (1.0, 0.0))
                ok.append(rid)
                store.settle(rid, (0.03, 0.0))
            except BudgetExhaustedError:
                refused.append(1)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    spent, reserved = store.totals("race")
    assert len(ok) == 33 and len(refused) == threads * per_thread - 33  # floor(1/0.03) = 33
    assert spent[0] <= 1.0 and reserved == (0.0, 0.0)
    _check_derivable(store, "race")


def test_store_protocol_sqlite(tmp_path):
    _protocol(SQLBudgetStore(_sqlite(tmp_path)))


def test_store_concurrent_reservations_sqlite(tmp_path):
    _race(SQLBudgetStore(_sqlite(tmp_path)), threads=8, per_thread=6)


@pytest.mark.postgres
def test_store_protocol_postgres(pg_schema):
    _protocol(SQLBudgetStore(_pg(pg_schema)))


@pytest.mark.postgres
def test_store_concurrent_reservations_postgres(pg_schema):
    _race(SQLBudgetStore(_pg(pg_schema)), threads=8, per_thread=6)


def test_ledger_is_append_only_and_sqlite_is_wal(tmp_path):
    eng = _sqlite(tmp_path)
    store = SQLBudgetStore(eng)
    rid = store.try_reserve("p", (0.1, 0.0), (1.0, 0.0))
    store.settle(rid, (0.05, 0.0))
    with eng.connect() as conn:
        mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        n = conn.exec_driver_sql("SELECT count(*) FROM ledger").scalar()
    assert mode == "wal" and n == 2  # one reserve row, one settle row; nothing updated in place
