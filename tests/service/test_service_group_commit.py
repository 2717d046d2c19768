"""Group commit (``[database] group_commit``, on by default with ``sync = "full"``): reservations are
committed at once and flushed to disk together in the background. The guarantees checked here, on SQLite
and PostgreSQL, with the real app on uvicorn:

* no answer leaves before the flush that covers its reservation has completed (the flush is slowed down
  so that an answer sent before it would arrive first);
* concurrent requests on one key never overspend, and each refused request writes nothing;
* a flush that fails releases nothing: 503, charged at the reserved cost, ``x-should-retry: false``.

The crash tests (kill -9 during scoring and after the answer, ``test_service_replicas.py``) run with
group commit on, as the default configuration.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

import httpx
import pytest
from test_service_http import _cfg

from conftest import serve_in_thread
from privalign.service import db
from privalign.service.app import create_app
from privalign.service.durability import DurabilityError, GroupFlusher
from privalign.service.keys import create_key


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def svc_any(request, tmp_path, reward_model, upstream):
    cfg = _cfg(tmp_path, reward_model, upstream)
    if request.param == "postgres":
        url, schema = request.getfixturevalue("pg_schema")
        cfg = replace(cfg, database=replace(cfg.database, url=url, schema=schema))
    app = create_app(cfg)
    state = app.state.service
    assert state.store.group_commit  # the default with sync = "full"
    with serve_in_thread(app) as url:
        yield url, state
    state.store.close()


def _slow_flush(state, delay_s: float, done_at: dict, fail: bool = False):
    real = state.store.flusher._flush

    def flush(items):
        time.sleep(delay_s)
        if fail:
            raise OSError("simulated I/O error on fsync")
        out = real(items)
        t = time.monotonic()
        for rid in items:
            done_at[rid] = t
        return out

    state.store.flusher._flush = flush


@pytest.mark.parametrize("endpoint", ["/v1/select", "/v1/chat/completions"])
def test_no_answer_before_its_reservation_is_on_disk_and_no_overspend(svc_any, endpoint):
    """/v1/select flushes at the gate (in the request's thread); a chat completion starts the flush in the
    background before generating. Either way no answer arrives before its flush completed."""
    url, state = svc_any
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    done_at: dict[str, float] = {}
    _slow_flush(state, 0.15, done_at)
    h = {"Authorization": f"Bearer {token}"}
    if endpoint == "/v1/select":
        body = {
            "prompt": "p",
            "candidates": ["a kind reply", "a rude reply", "meh"],
            "privacy": {"epsilon": 0.1},
        }
    else:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "privacy": {"epsilon": 0.1, "n": 3},
        }
    results: list[tuple[int, dict, float]] = []
    lock = threading.Lock()

    def client():
        with httpx.Client(timeout=30) as c:
            for _ in range(2):
                r = c.post(url + endpoint, headers=h, json=body)
                t = time.monotonic()
                with lock:
                    results.append((r.status_code, r.json(), t))

    ts = [threading.Thread(target=client) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    codes = sorted(c for c, _, _ in results)
    assert codes == [200] * 10 + [429] * 6, codes  # a budget of 1.0 at ε = 0.1: exactly ten answers
    for code, js, t_recv in results:
        if code == 200:
            rid = js["privacy"]["reservation_id"]
            assert rid in done_at and done_at[rid] <= t_recv, (rid, done_at.get(rid), t_recv)
    fl = state.store.flusher
    assert fl.items == 10 and fl.flushes < fl.items  # ten reservations, fewer flushes: they were grouped
    assert state.wait_settled(key_id, timeout=10)
    exact = state.store.snapshot(key_id, units=True)
    assert exact["spent_epsilon"] == exact["limit_epsilon"] == db.EPS_SCALE and exact["reserved_epsilon"] == 0
    with state.engine.connect() as conn:
        assert db.derive_totals(conn, key_id, units=True) == exact
    actions = [r["action"] for r in state.store.ledger_rows(key_id)]
    assert sorted(actions) == ["reserve"] * 10 + ["settle"] * 10  # refusals wrote nothing


def test_a_failed_flush_releases_nothing_and_stays_charged(svc_any):
    url, state = svc_any
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    _slow_flush(state, 0.0, {}, fail=True)
    r = httpx.post(
        url + "/v1/select",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
        json={"prompt": "p", "candidates": ["a kind reply", "a rude reply"], "privacy": {"epsilon": 0.2}},
    )
    assert r.status_code == 503 and r.headers["x-should-retry"] == "false"
    js = r.json()
    assert js["error"]["charged"] is True and "index" not in js and "text" not in js
    assert "a kind reply" not in r.text and "a rude reply" not in r.text
    exact = state.store.snapshot(key_id, units=True)  # the reservation stays: charged at its reserved cost
    assert exact["reserved_epsilon"] == 200_000_000 and exact["spent_epsilon"] == 0
    assert state.store.open_reservations(principal=key_id) != []


def test_flusher_groups_items_committed_before_the_flush_began():
    """A flush covers exactly the items handed over before it started; items handed over during a flush
    wait for the next one; an exception fails its whole batch and only that batch."""
    batches: list[list[int]] = []
    gate = threading.Event()

    def flush(items):
        batches.append(list(items))
        if len(batches) == 1:
            gate.wait(5)
        if 99 in items:
            raise OSError("disk gone")
        return {3} if 3 in items else ()

    fl = GroupFlusher(flush)
    t1 = fl.submit(1)  # flushed by the background thread
    while not batches:
        time.sleep(0.001)
    later = [fl.submit(i) for i in (2, 3, 4)]  # arrive while the first flush is running
    assert not later[0].done.is_set()
    gate.set()
    fl.wait(t1, 5)
    fl.wait(later[0], 5)
    with pytest.raises(DurabilityError, match="lost"):
        fl.wait(later[1], 5)  # the flush could not confirm item 3
    fl.wait(later[2], 5)
    assert batches == [[1], [2, 3, 4]]
    with pytest.raises(DurabilityError, match="disk gone"):
        fl.wait(fl.submit(99), 5)
    fl.wait(fl.submit(5), 5)  # the next batch is unaffected
    # Leader/follower: without the background thread, the waiter flushes what is queued itself.
    queued = [fl.submit(i, background=False) for i in (6, 7)]
    assert not any(t.done.is_set() for t in queued)
    fl.wait(queued[1], 5)
    assert batches[-1] == [6, 7] and queued[0].done.is_set()
    fl.close()
    with pytest.raises(DurabilityError):
        fl.submit(8)


@pytest.mark.postgres
def test_postgres_flush_reports_reservations_it_cannot_see(pg_schema):
    """The PostgreSQL flush statement names the reservations of its batch that are not in the ledger (a
    reserve lost when the server crashed and recovered before the flush): their requests fail."""
    from privalign.service.store import SQLBudgetStore

    url, schema = pg_schema
    eng = db.make_engine(url, schema=schema)
    db.create_schema(eng, schema=schema)
    store = SQLBudgetStore(eng)
    assert store.group_commit
    store.grant("k", 1.0, 0.0)
    rid = store.reserve("k", (0.1, 0.0)).reservation_id
    assert store._pg_flush([rid, "lost-in-a-crash"]) == {"lost-in-a-crash"}
    receipt = store.reserve("k", (0.1, 0.0), wait=False)
    store.flusher._flush = lambda items: (
        store._pg_flush(list(items) + ["x"]) - {"x"} | {receipt.reservation_id}
    )
    with pytest.raises(DurabilityError, match="lost before it reached the disk"):
        store.wait_durable(receipt, timeout=5)
    store.close()
    eng.dispose()


def test_sqlite_flush_syncs_the_wal_or_else_the_database_file(tmp_path, monkeypatch):
    import privalign.service.durability as dur

    synced: list[str] = []
    monkeypatch.setattr(dur.os, "fdatasync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    path = str(tmp_path / "ledger.db")
    open(path, "wb").close()
    flush = dur.sqlite_wal_flush(path)
    flush(["r"])  # no -wal file (checkpointed and removed): the database file is synced
    open(path + "-wal", "wb").close()
    flush(["r"])
    assert synced == [path, path + "-wal"]
