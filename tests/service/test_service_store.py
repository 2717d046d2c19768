"""SQLBudgetStore: the BudgetStore protocol on SQLite and PostgreSQL; ledger rows explain the totals."""

from __future__ import annotations

import math
import os
import threading

import pytest
from sqlalchemy import event

from privalign.errors import BudgetExhaustedError, PrivacyParameterError, ReservationError
from privalign.service import db
from privalign.service.keys import create_key, revoke_key
from privalign.service.store import ActiveKeyCheckFailed, SQLBudgetStore


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
    # The ledger keeps exact integer units: the cached totals equal the rows' sums exactly.
    with store.engine.connect() as conn:
        assert store.snapshot(principal, units=True) == db.derive_totals(conn, principal, units=True)


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


@pytest.mark.parametrize("group", [True, False])
def test_store_concurrent_reservations_sqlite(tmp_path, group):
    _race(SQLBudgetStore(_sqlite(tmp_path), group_commit=group), threads=8, per_thread=6)


@pytest.mark.postgres
def test_store_protocol_postgres(pg_schema):
    _protocol(SQLBudgetStore(_pg(pg_schema)))


@pytest.mark.postgres
@pytest.mark.parametrize("group", [True, False])
def test_store_concurrent_reservations_postgres(pg_schema, group):
    _race(SQLBudgetStore(_pg(pg_schema), group_commit=group), threads=8, per_thread=6)


def test_ledger_is_append_only_and_sqlite_is_wal(tmp_path):
    eng = _sqlite(tmp_path)
    store = SQLBudgetStore(eng)
    rid = store.try_reserve("p", (0.1, 0.0), (1.0, 0.0))
    store.settle(rid, (0.05, 0.0))
    with eng.connect() as conn:
        mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        n = conn.exec_driver_sql("SELECT count(*) FROM ledger").scalar()
    assert mode == "wal" and n == 2  # one reserve row, one settle row; nothing updated in place


def _durability_scenario(store: SQLBudgetStore) -> list[str]:
    """reserve+settle, reserve+cancel, reserve+reconcile, a first reservation of a principal without a row
    (the locking path on PostgreSQL), and a refusal (writes nothing). Returns the actions in order."""
    store.grant("k", 1.0, 0.0)
    store.settle(store.try_reserve("k", (0.1, 0.0), (1.0, 0.0)), (0.05, 0.0))
    store.cancel(store.try_reserve("k", (0.1, 0.0), (1.0, 0.0)))
    store.reconcile(store.try_reserve("k", (0.1, 0.0), (1.0, 0.0)))
    store.try_reserve("fresh", (0.1, 0.0), (1.0, 0.0))
    with pytest.raises(BudgetExhaustedError):
        store.try_reserve("k", (0.9, 0.0), (1.0, 0.0))
    return ["reserve", "settle", "reserve", "cancel", "reserve", "reconcile", "reserve"]


@pytest.mark.postgres
@pytest.mark.parametrize(("durable", "group"), [(True, False), (False, False), (True, True)])
def test_postgres_commit_modes_reserve_flushed_closes_not(pg_schema, durable, group):
    """The synchronous_commit each ledger write actually commits with, read at commit time by a deferred
    trigger, with sessions that default to asynchronous commit (so only the store's own setting counts).

    Group commit: every reserve commits asynchronously, and before ``reserve`` returns a flush whose batch
    names it has completed, with the server's WAL flushed past the point where the reserve committed."""
    eng = _pg(pg_schema)

    @event.listens_for(eng, "connect")
    def _async_by_default(dbapi_conn, _record):
        with dbapi_conn.cursor() as cur:
            cur.execute("SET synchronous_commit TO off")
        dbapi_conn.commit()

    eng.dispose()  # drop the connection create_schema opened before the listener existed
    with eng.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE commit_modes (id serial PRIMARY KEY, action text, mode text, rid text, lsn pg_lsn)"
        )
        conn.exec_driver_sql(
            "CREATE FUNCTION record_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO commit_modes (action, mode, rid, lsn) "
            "VALUES (NEW.action, current_setting('synchronous_commit'), "
            "NEW.reservation_id, pg_current_wal_insert_lsn()); RETURN NULL; END $$"
        )
        conn.exec_driver_sql(
            "CREATE CONSTRAINT TRIGGER ledger_commit_mode AFTER INSERT ON ledger "
            "DEFERRABLE INITIALLY DEFERRED "
            "FOR EACH ROW EXECUTE FUNCTION record_commit_mode()"
        )
    store = SQLBudgetStore(eng, durable=durable, group_commit=group)
    assert store.group_commit is (durable and group)
    flushed: list[tuple[list[str], str]] = []  # (batch, WAL flush LSN right after the flush)
    if store.group_commit:
        real = store.flusher._flush

        def spy(items):
            failed = real(items)
            with eng.connect() as c:
                flushed.append(
                    (list(items), c.exec_driver_sql("SELECT pg_current_wal_flush_lsn()::text").scalar())
                )
            return failed

        store.flusher._flush = spy
    expected_actions = _durability_scenario(store)
    with eng.connect() as conn:
        got = [
            tuple(r)
            for r in conn.exec_driver_sql("SELECT action, mode, rid, lsn::text FROM commit_modes ORDER BY id")
        ]
    reserve_mode = "on" if durable and not group else "off"
    assert [g[:2] for g in got] == [(a, reserve_mode if a == "reserve" else "off") for a in expected_actions]
    if store.group_commit:
        reserves = [(rid, lsn) for a, _, rid, lsn in got if a == "reserve"]
        assert [b for b, _ in flushed] == [[rid] for rid, _ in reserves]  # one flush per (sequential) reserve
        with eng.connect() as conn:
            for (rid, lsn), (_, flush_lsn) in zip(reserves, flushed):
                assert conn.exec_driver_sql(f"SELECT '{flush_lsn}'::pg_lsn > '{lsn}'::pg_lsn").scalar(), (
                    rid,
                    lsn,
                    flush_lsn,
                )
    else:
        assert store.flusher is None
    for p in ("k", "fresh"):
        _check_derivable(store, p)
    store.close()
    eng.dispose()


@pytest.mark.parametrize(("durable", "group"), [(True, False), (False, False), (True, True)])
def test_sqlite_commit_modes_reserve_flushed_closes_not(tmp_path, monkeypatch, durable, group):
    """The PRAGMA synchronous in force when each ledger row is written (FULL = flushed on commit).

    Group commit: every reserve commits with NORMAL (no flush), then the ``-wal`` file is fdatasynced before
    ``reserve`` returns, and no ledger write comes between the commit and that fsync."""
    eng = _sqlite(tmp_path)
    trail: list[str] = []  # statements and fsyncs, in order

    @event.listens_for(eng, "connect")
    def _trace(dbapi_conn, _record):
        dbapi_conn.set_trace_callback(trail.append)

    eng.dispose()
    import privalign.service.durability as dur

    real_sync = dur.os.fdatasync

    def fdatasync(fd):
        trail.append("FSYNC " + os.readlink(f"/proc/self/fd/{fd}"))
        real_sync(fd)

    monkeypatch.setattr(dur.os, "fdatasync", fdatasync)
    store = SQLBudgetStore(eng, durable=durable, group_commit=group)
    assert store.group_commit is (durable and group)
    expected_actions = _durability_scenario(store)
    modes, current = [], None
    for st in trail:
        if st.startswith("PRAGMA synchronous="):
            current = st.split("=", 1)[1]
        elif st.startswith("INSERT INTO ledger"):
            modes.append(current)
    reserve_mode = "FULL" if durable and not group else "NORMAL"
    assert modes == [reserve_mode if a == "reserve" else "NORMAL" for a in expected_actions]
    wal = str(tmp_path / "ledger.db") + "-wal"
    fsyncs = [i for i, st in enumerate(trail) if st.startswith("FSYNC")]
    if store.group_commit:
        assert all(trail[i] == "FSYNC " + wal for i in fsyncs)
        inserts = [i for i, st in enumerate(trail) if st.startswith("INSERT INTO ledger")]
        reserve_at = [i for i, a in zip(inserts, expected_actions) if a == "reserve"]
        assert len(fsyncs) == len(reserve_at)
        for i, f in zip(reserve_at, fsyncs):
            commit = next(j for j in range(i, len(trail)) if trail[j] == "COMMIT")
            assert commit < f and not any(st.startswith("INSERT") for st in trail[commit:f])
    else:
        assert fsyncs == [] and store.flusher is None
    for p in ("k", "fresh"):
        _check_derivable(store, p)
    store.close()


def _active_key_checks(store: SQLBudgetStore) -> None:
    """With require_active=True the reserving statement/transaction also checks the key; any failure
    raises ActiveKeyCheckFailed and writes nothing (no principal row is created either)."""
    eng = store.engine
    live, _ = create_key(eng, budget_epsilon=1.0)
    gone, _ = create_key(eng, budget_epsilon=1.0)
    revoke_key(eng, gone)
    rid = store.reserve(live, (0.5, 0.0), (1.0, 0.0), require_active=True).reservation_id
    for principal, cost, limit in (
        (gone, (0.1, 0.0), (1.0, 0.0)),  # revoked
        ("no-such-key", (0.1, 0.0), (1.0, 0.0)),  # unknown: no row is created
        (live, (0.6, 0.0), (1.0, 0.0)),  # does not fit
        (live, (0.6, 0.0), None),  # does not fit the grant
        (live, (0.2, 0.0), (0.6, 0.0)),
    ):  # fits the grant, not a stale lower limit
        with pytest.raises(ActiveKeyCheckFailed):
            store.reserve(principal, cost, limit, require_active=True)
    assert store.snapshot("no-such-key") is None
    assert [r["action"] for r in store.ledger_rows(live)] == ["reserve"] and store.ledger_rows(gone) == []
    with pytest.raises(BudgetExhaustedError):  # without the flag: the ordinary refusal
        store.try_reserve(live, (0.6, 0.0), (1.0, 0.0))
    store.settle(rid, (0.5, 0.0))
    for p in (live, gone):
        _check_derivable(store, p)


def test_reserve_requiring_an_active_key_sqlite(tmp_path):
    _active_key_checks(SQLBudgetStore(_sqlite(tmp_path)))


@pytest.mark.postgres
def test_reserve_requiring_an_active_key_postgres(pg_schema):
    _active_key_checks(SQLBudgetStore(_pg(pg_schema)))


def _reserve_totals(store: SQLBudgetStore) -> None:
    """Every successful reservation (one-statement path, first reservation of a principal without a row,
    the active-key path) returns a receipt with the principal's totals right after it (exact units), this
    reservation included, equal to the committed row; every close returns the totals after it."""
    eng = store.engine
    key, _ = create_key(eng, budget_epsilon=1.0)
    r0 = store.reserve("fresh", (0.25, 1e-7), (1.0, 1e-6))  # no principal row yet: the locking path
    assert r0.totals == store.snapshot("fresh", units=True)
    assert r0.totals["reserved_epsilon"] == 250_000_000 and r0.totals["reserved_delta"] == 100_000_000_000
    assert r0.cost == (250_000_000, 100_000_000_000)
    after = store.settle(r0.reservation_id, (0.125, 1e-7))
    assert after == store.snapshot("fresh", units=True) and after["spent_epsilon"] == 125_000_000
    r = store.reserve("fresh", (0.5, 0.0), (1.0, 1e-6))
    assert r.totals == store.snapshot("fresh", units=True)
    assert r.totals["spent_epsilon"] == 125_000_000 and r.totals["reserved_epsilon"] == 500_000_000
    r1 = store.reserve(key, (0.25, 0.0))  # no caller limit: the granted budget
    assert r1.totals == store.snapshot(key, units=True) and r1.totals["limit_epsilon"] == 1_000_000_000
    r2 = store.reserve(key, (0.5, 0.0), (1.0, 0.0), require_active=True)
    assert r2.totals == store.snapshot(key, units=True) and r2.totals["reserved_epsilon"] == 750_000_000
    # Settled at 0.1, r2 leaves 1.0 - 0.25 (r1, open) - 0.1 = 0.65, exactly.
    assert r2.remaining_after((100_000_000, 0)) == (650_000_000, 0)
    with pytest.raises(ActiveKeyCheckFailed):
        store.reserve(key, (0.5, 0.0), (1.0, 0.0), require_active=True)
    store.reserve(key, (0.125, 0.0), (1.0, 0.0))
    with pytest.raises(BudgetExhaustedError):
        store.reserve(key, (0.5, 0.0), (1.0, 0.0))
    assert store.cancel(r2.reservation_id) == store.snapshot(key, units=True)
    store.settle(r1.reservation_id, (0.25, 0.0))
    for p in ("fresh", key):
        _check_derivable(store, p)


def test_reserve_returns_the_totals_sqlite(tmp_path):
    _reserve_totals(SQLBudgetStore(_sqlite(tmp_path)))


@pytest.mark.postgres
def test_reserve_returns_the_totals_postgres(pg_schema):
    _reserve_totals(SQLBudgetStore(_pg(pg_schema)))
