"""Real processes: OpenAI client against `privalign serve` on PostgreSQL, 64 concurrent clients on one key
across 2 replicas sharing PostgreSQL, and kill -9 between reserve and settle."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from svc_components import candidates_for

from conftest import write_config
from privalign.service import db
from privalign.service.keys import create_key
from privalign.service.store import SQLBudgetStore


def _metric(base: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(base + "/metrics").text.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m:
            total += float(m.group(2))
    return total


def _config(
    tmp_path, name, database, reward_model, *, upstream=None, scorer=None, timeout=20.0, reconcile=60.0
):
    rm = {"kind": "linear", "path": str(reward_model)} if scorer is None else {"kind": "python", **scorer}
    gen = (
        {"kind": "upstream", "base_url": upstream, "model": "m", "timeout_s": 5.0}
        if upstream
        else {"kind": "none"}
    )
    return write_config(
        tmp_path / name,
        {
            "database": database,
            # 64 concurrent requests on one key test the ledger's locks: no per-key concurrency limit
            "limits": {"max_n": 16, "request_timeout_s": timeout, "key_concurrency": 0},
            "privacy": {
                "allowed_methods": ["privbon"],
                "default_epsilon": 0.0625,
                "reconcile_after_s": reconcile,
            },
            "reward_model": rm,
            "generator": gen,
        },
    )


@pytest.mark.postgres
@pytest.mark.slow
def test_two_replicas_on_postgres_never_overspend(
    tmp_path, reward_model, upstream, pg_schema, server_process
):
    url, schema = pg_schema
    cfg = _config(tmp_path, "pg.toml", {"url": url, "schema": schema}, reward_model, upstream=upstream)
    a = server_process(cfg).start()
    b = server_process(cfg).start()
    engine = db.make_engine(url, schema=schema)
    # End to end with the OpenAI client on PostgreSQL.
    _, tok0 = create_key(engine, budget_epsilon=1.0)
    client = openai.OpenAI(base_url=a.url + "/v1", api_key=tok0, max_retries=0)
    resp = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hello"}],
        extra_body={"privacy": {"epsilon": 0.5, "n": 5}},
    )
    assert resp.choices[0].message.content in candidates_for("hello", 5)
    assert resp.model_extra["privacy"]["remaining"]["epsilon"] == pytest.approx(0.5)

    # 64 concurrent clients x 2 requests on ONE key, alternating between the two replicas.
    key_id, tok = create_key(engine, budget_epsilon=1.0)  # 16 requests of ε = 1/16 fit exactly
    calls_before = _metric(a.url, "privalign_scorer_calls_total") + _metric(
        b.url, "privalign_scorer_calls_total"
    )
    barrier = threading.Barrier(64)

    def client_job(i: int) -> list[int]:
        base = (a.url, b.url)[i % 2]
        with httpx.Client(timeout=60.0) as c:
            barrier.wait()
            return [
                c.post(
                    base + "/v1/select",
                    headers={"Authorization": f"Bearer {tok}"},
                    json={
                        "prompt": f"q{i}",
                        "candidates": ["a kind reply", "a rude reply", "plain"],
                        "privacy": {"epsilon": 0.0625},
                    },
                ).status_code
                for _ in range(2)
            ]

    with ThreadPoolExecutor(64) as ex:
        codes = [c for r in ex.map(client_job, range(64)) for c in r]
    ok, refused = codes.count(200), codes.count(429)
    assert ok + refused == 128, sorted(set(codes))
    # Settles are written after the answers; GET /v1/budget on each replica waits for its pending ones.
    for base in (a.url, b.url):
        assert (
            httpx.get(base + "/v1/budget", headers={"Authorization": f"Bearer {tok}"}, timeout=30).status_code
            == 200
        )
    store = SQLBudgetStore(engine)
    with engine.connect() as conn:
        derived = db.derive_totals(conn, key_id)
    assert derived["spent_epsilon"] <= 1.0 and derived["reserved_epsilon"] == 0.0  # never overspent
    assert ok == 16 and derived["spent_epsilon"] == 1.0  # and the budget is used exactly
    snap = store.snapshot(key_id)
    assert snap["spent_epsilon"] == derived["spent_epsilon"]
    rows = store.ledger_rows(key_id, limit=1000)
    assert (
        sum(r["action"] == "settle" for r in rows) == 16 and sum(r["action"] == "reserve" for r in rows) == 16
    )
    # Every refused request was refused before scoring: scorer calls == successful selections.
    calls = (
        _metric(a.url, "privalign_scorer_calls_total")
        + _metric(b.url, "privalign_scorer_calls_total")
        - calls_before
    )
    assert calls == ok
    assert _metric(a.url, "privalign_refusals_total") + _metric(b.url, "privalign_refusals_total") == refused
    engine.dispose()


def _crash_and_restart(tmp_path, reward_model, database, engine, server_process):
    marker = tmp_path / "scoring.marker"
    scorer = {
        "target": "svc_components:sleepy_scorer",
        "path": str(reward_model),
        "sleep_s": 60.0,
        "marker": str(marker),
    }
    cfg = _config(tmp_path, "crash.toml", database, reward_model, scorer=scorer, timeout=1.0, reconcile=1.0)
    key_id, tok = create_key(engine, budget_epsilon=1.0)
    srv = server_process(cfg).start()
    result: dict = {}

    def call():
        try:
            result["r"] = httpx.post(
                srv.url + "/v1/select",
                headers={"Authorization": f"Bearer {tok}", "Idempotency-Key": "k1"},
                json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.25}},
                timeout=30,
            )
        except httpx.HTTPError as exc:
            result["err"] = exc

    t = threading.Thread(target=call)
    t.start()
    deadline = time.time() + 30
    while not marker.exists():  # the scorer has started: reserved, private data touched
        assert time.time() < deadline, "scorer never started"
        time.sleep(0.02)
    srv.kill9()
    t.join(30)
    assert "err" in result  # the client got no answer, hence no selection
    store = SQLBudgetStore(engine)
    assert [r["action"] for r in store.ledger_rows(key_id)] == ["reserve"]
    spent, reserved = store.totals(key_id)
    assert spent == (0.0, 0.0) and reserved == (0.25, 0.0)  # charged while open (fail closed)
    time.sleep(1.1)  # older than reconcile_after_s
    srv2 = server_process(cfg).start()  # restart reconciles at start-up
    # A retry of the interrupted request is answered 409 and not charged a second time.
    retry = httpx.post(
        srv2.url + "/v1/select",
        headers={"Authorization": f"Bearer {tok}", "Idempotency-Key": "k1"},
        json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.25}},
        timeout=30,
    )
    assert retry.status_code == 409 and "interrupted" in retry.json()["error"]["message"]
    rows = store.ledger_rows(key_id)
    assert [r["action"] for r in rows] == ["reconcile", "reserve"]
    assert rows[0]["realized_epsilon"] == 0.25
    with engine.connect() as conn:
        derived = db.derive_totals(conn, key_id)
    assert derived["spent_epsilon"] == 0.25 and derived["reserved_epsilon"] == 0.0
    assert store.snapshot(key_id)["spent_epsilon"] == 0.25


def _crash_after_answer(tmp_path, reward_model, database, engine, server_process, hold_ledger):
    """kill -9 after the answer was sent but before its deferred settle was written: the settle is held
    back by a lock on the ledger (``hold_ledger``, taken while the reward model runs); the reservation
    stays charged at its reserved cost and the restarted service reconciles it."""
    marker = tmp_path / "scoring.marker"
    scorer = {
        "target": "svc_components:sleepy_scorer",
        "path": str(reward_model),
        "sleep_s": 1.0,
        "marker": str(marker),
    }
    cfg = _config(tmp_path, "after.toml", database, reward_model, scorer=scorer, timeout=2.0, reconcile=2.0)
    key_id, tok = create_key(engine, budget_epsilon=1.0)
    srv = server_process(cfg).start()
    result: dict = {}

    def call():
        result["r"] = httpx.post(
            srv.url + "/v1/select",
            headers={"Authorization": f"Bearer {tok}"},
            json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.25}},
            timeout=30,
        )

    t = threading.Thread(target=call)
    t.start()
    deadline = time.time() + 30
    while not marker.exists():  # reserved; the reward model is running
        assert time.time() < deadline, "scorer never started"
        time.sleep(0.02)
    with hold_ledger() as (before_kill, after_kill):
        t.join(30)
        r = result["r"]  # answered while the ledger is locked: the answer did not wait for the settle
        assert r.status_code == 200 and r.json()["privacy"]["charged"] == 0.25
        assert r.json()["privacy"]["remaining"]["epsilon"] == pytest.approx(0.75)
        before_kill()
        srv.kill9()
        after_kill()
    store = SQLBudgetStore(engine)
    assert [row["action"] for row in store.ledger_rows(key_id)] == ["reserve"]
    assert store.totals(key_id) == ((0.0, 0.0), (0.25, 0.0))  # charged while open (fail closed)
    time.sleep(2.1)  # older than reconcile_after_s
    server_process(cfg).start()  # restart reconciles at start-up
    rows = store.ledger_rows(key_id)
    assert [row["action"] for row in rows] == ["reconcile", "reserve"] and rows[0]["realized_epsilon"] == 0.25
    assert rows[1]["reservation_id"] == r.json()["privacy"]["reservation_id"]
    with engine.connect() as conn:
        derived = db.derive_totals(conn, key_id)
    assert derived["spent_epsilon"] == 0.25 and derived["reserved_epsilon"] == 0.0


@pytest.mark.slow
def test_kill_9_after_the_answer_before_the_settle_sqlite(tmp_path, reward_model, server_process):
    import sqlite3
    from contextlib import contextmanager

    path = tmp_path / "after.db"
    engine = db.make_engine(f"sqlite:///{path}")
    db.create_schema(engine)

    @contextmanager
    def hold_ledger():
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")  # the database write lock: the settle's BEGIN IMMEDIATE waits
        try:
            yield (lambda: None), (lambda: None)
        finally:
            conn.rollback()
            conn.close()

    _crash_after_answer(
        tmp_path, reward_model, {"url": f"sqlite:///{path}"}, engine, server_process, hold_ledger
    )


@pytest.mark.postgres
@pytest.mark.slow
def test_kill_9_after_the_answer_before_the_settle_postgres(
    tmp_path, reward_model, pg_schema, server_process
):
    from contextlib import contextmanager

    url, schema = pg_schema
    engine = db.make_engine(url, schema=schema)
    db.create_schema(engine, schema=schema)

    @contextmanager
    def hold_ledger():
        with engine.connect() as conn:
            conn.exec_driver_sql("LOCK TABLE ledger IN EXCLUSIVE MODE")  # inserts wait; reads do not
            blocked_sql = (
                "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
            )

            pids: list[int] = []

            def before_kill():  # the settle statement was sent after the answer and waits for the lock
                deadline = time.time() + 10
                while not pids:
                    assert time.time() < deadline, "the settle never reached the database"
                    time.sleep(0.05)
                    pids.extend(p for (p,) in conn.exec_driver_sql(blocked_sql))

            def after_kill():
                # PostgreSQL would still commit the waiting statement once the lock is released, although
                # its client is dead; terminating its backend makes the settle never commit, as when the
                # process dies before sending it.
                for pid in pids:
                    conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")

            try:
                yield before_kill, after_kill
            finally:
                conn.rollback()

    try:
        _crash_after_answer(
            tmp_path, reward_model, {"url": url, "schema": schema}, engine, server_process, hold_ledger
        )
    finally:
        engine.dispose()


@pytest.mark.slow
def test_kill_9_mid_request_stays_charged_and_is_reconciled_sqlite(tmp_path, reward_model, server_process):
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    engine = db.make_engine(url)
    db.create_schema(engine)
    _crash_and_restart(tmp_path, reward_model, {"url": url}, engine, server_process)


@pytest.mark.postgres
@pytest.mark.slow
def test_kill_9_mid_request_stays_charged_and_is_reconciled_postgres(
    tmp_path, reward_model, pg_schema, server_process
):
    url, schema = pg_schema
    engine = db.make_engine(url, schema=schema)
    db.create_schema(engine, schema=schema)
    try:
        _crash_and_restart(tmp_path, reward_model, {"url": url, "schema": schema}, engine, server_process)
    finally:
        engine.dispose()  # the fixture drops the schema afterwards
