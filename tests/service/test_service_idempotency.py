"""Idempotency that tells the truth: a database failure at the reserve never locks an
``Idempotency-Key`` behind a false "stays charged" 409, a 409 says whether the attempt holds a charge, and
no request body (lone surrogates in fields the schema accepts unchecked included) makes the idempotent
path answer 5xx. On SQLite and on PostgreSQL; the reserve is made to fail by a trigger on the ledger."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from test_service_http import _cfg

from conftest import serve_in_thread
from privalign.service import db
from privalign.service.app import create_app
from privalign.service.keys import create_key

BACKENDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]


def _app(tmp_path, reward_model, upstream, backend, request, **limits):
    cfg = _cfg(tmp_path, reward_model, upstream)
    if backend == "postgres":
        url, schema = request.getfixturevalue("pg_schema")
        cfg = replace(cfg, database=replace(cfg.database, url=url, schema=schema))
    if limits:
        cfg = replace(cfg, limits=replace(cfg.limits, **limits))
    return create_app(cfg)


def _totals(state, key_id):
    with state.engine.connect() as conn:
        return db.derive_totals(conn, key_id, units=True)


_SQLITE_TRIGGER = (
    "CREATE TRIGGER fail_reserve BEFORE INSERT ON ledger WHEN NEW.action = 'reserve' "
    "BEGIN SELECT RAISE(ABORT, 'injected reserve failure'); END"
)
_PG_TRIGGER = (
    "CREATE FUNCTION fail_reserve() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.action = 'reserve' THEN RAISE EXCEPTION 'injected reserve failure'; END IF; RETURN NEW; END $$; "
    "CREATE TRIGGER fail_reserve BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION fail_reserve()"
)


def _break_reserve(state, on: bool) -> None:
    """Make every reserve fail (a trigger aborts the ledger insert), or repair it."""
    pg = state.engine.dialect.name == "postgresql"
    with state.engine.begin() as conn:
        if on:
            conn.exec_driver_sql(_PG_TRIGGER if pg else _SQLITE_TRIGGER)
        else:
            conn.exec_driver_sql("DROP TRIGGER fail_reserve" + (" ON ledger" if pg else ""))
            if pg:
                conn.exec_driver_sql("DROP FUNCTION fail_reserve()")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reserve_that_fails_does_not_lock_the_idempotency_key(
    tmp_path, reward_model, upstream, backend, request
):
    app = _app(tmp_path, reward_model, upstream, backend, request)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    body = {"prompt": "p", "candidates": ["x", "y", "z"], "privacy": {"epsilon": 0.4}}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "privacy": {"epsilon": 0.3}}
    with serve_in_thread(app) as url:
        before = _totals(state, key_id)
        _break_reserve(state, True)
        for path, payload, ik in (("/v1/select", body, "k-sel"), ("/v1/chat/completions", chat, "k-chat")):
            h = {"Authorization": f"Bearer {token}", "Idempotency-Key": ik}
            rs = [httpx.post(url + path, headers=h, json=payload) for _ in range(2)]
            assert [r.status_code for r in rs] == [503, 503], rs[1].text  # the retry: no false 409
            for r in rs:
                err = r.json()["error"]
                assert "nothing was charged" in err["message"] and "charged" not in err, err
                assert r.headers.get("x-should-retry") != "false"
            assert _totals(state, key_id) == before
        with state.engine.connect() as conn:  # no pending attempt is left behind
            assert conn.execute(db.idempotency.select()).first() is None
        _break_reserve(state, False)
        r1 = httpx.post(
            url + "/v1/select",
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "k-sel"},
            json=body,
        )
        assert r1.status_code == 200, r1.text
        r2 = httpx.post(
            url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "k-chat"},
            json=chat,
        )
        assert r2.status_code == 200, r2.text
        assert state.wait_settled(timeout=10)
        t = _totals(state, key_id)
        assert t["spent_epsilon"] - before["spent_epsilon"] == 700_000_000 and t["reserved_epsilon"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pending_attempt_answers_409_only_with_what_it_holds(
    tmp_path, reward_model, upstream, backend, request
):
    """A pending row left by an attempt that never reserved (a crash, or a database that failed while
    the row was being cleared) is answered 409 "nothing charged yet" while the attempt may still be
    running, then taken over after ``privacy.reconcile_after_s``; an attempt that holds a reservation is
    answered 409 "holds a charge"."""
    app = _app(tmp_path, reward_model, upstream, backend, request)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    body = {"prompt": "p", "candidates": ["x", "y"], "privacy": {"epsilon": 0.25}}
    h = {"Authorization": f"Bearer {token}", "Idempotency-Key": "k1"}
    with serve_in_thread(app) as url:
        # Learn the request hash the service computes, then leave a pending row of a dead attempt that
        # never reserved (reservation id "dead").
        assert httpx.post(url + "/v1/select", headers=h, json=body).status_code == 200
        with state.engine.begin() as conn:
            row = conn.execute(db.idempotency.select()).mappings().one()
            conn.execute(
                db.idempotency.update().values(
                    status="pending", reservation_id="dead", response=None, status_code=None
                )
            )
        spent = _totals(state, key_id)["spent_epsilon"]
        r = httpx.post(url + "/v1/select", headers=h, json=body)
        assert r.status_code == 409 and "holds no charge" in r.json()["error"]["message"], r.text
        _in_progress(r)
        # Older than reconcile_after_s: the attempt is dead; the retry takes the key over and is answered.
        with state.engine.begin() as conn:
            conn.execute(db.idempotency.update().values(created_at=row["created_at"] - 3600.0))
        r = httpx.post(url + "/v1/select", headers=h, json=body)
        assert r.status_code == 200 and "idempotent-replayed" not in r.headers, r.text
        assert state.wait_settled(timeout=10)
        assert _totals(state, key_id)["spent_epsilon"] == spent + 250_000_000
        # An attempt whose reservation stands (here: settled, its answer lost) holds a charge: 409, no retry.
        rid = r.json()["privacy"]["reservation_id"]
        with state.engine.begin() as conn:
            conn.execute(
                db.idempotency.update().values(
                    status="pending",
                    reservation_id=rid,
                    response=None,
                    status_code=None,
                    created_at=row["created_at"] - 3600.0,
                )
            )
        r = httpx.post(url + "/v1/select", headers=h, json=body)
        assert r.status_code == 409 and r.headers.get("x-should-retry") == "false", r.text
        err = r.json()["error"]
        assert "holds a charge" in err["message"] and "new Idempotency-Key" in err["message"], err
        assert err["code"] == "idempotency_answer_lost" and err["param"] == "Idempotency-Key", err


#: (path, raw JSON, statuses allowed): a lone surrogate (an escape JSON accepts, UTF-8 cannot encode) where
#: the schema does not check text: an extra key's value inside a chat message (ChatMessage keeps extra
#: keys), ``stream_options`` (a free dict: 200 today; a stricter stream_options check may refuse it,
#: 400), an ignored top-level key; a surrogate as a key name is refused by the schema (400).
_SURROGATE_BODIES = [
    (
        "/v1/chat/completions",
        '{"model": "m", "messages": [{"role": "user", "content": "hi", "x": "\\ud800"}], '
        '"privacy": {"epsilon": 0.01}}',
        {200},
    ),
    (
        "/v1/chat/completions",
        '{"model": "m", "messages": [{"role": "user", "content": "hi", "x": [{"y": "a\\udfffb"}]}], '
        '"privacy": {"epsilon": 0.01}}',
        {200},
    ),
    (
        "/v1/chat/completions",
        '{"model": "m", "messages": [{"role": "user", "content": "hi", "\\udfff": 1}], '
        '"privacy": {"epsilon": 0.01}}',
        {400},
    ),
    (
        "/v1/chat/completions",
        '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, '
        '"stream_options": {"include_usage": true, "x": "\\ud800"}, "privacy": {"epsilon": 0.01}}',
        {200, 400},
    ),
    (
        "/v1/completions",
        '{"model": "m", "prompt": "hi", "stream": true, "stream_options": {"x": ["\\ude00x"]}, '
        '"privacy": {"epsilon": 0.01}}',
        {200, 400},
    ),
    (
        "/v1/completions",
        '{"model": "m", "prompt": "hi", "zzz": "\\ud800", "privacy": {"epsilon": 0.01}}',
        {200},
    ),
    # nested past pydantic's serialization depth (re-encoding the parsed body would fail here too)
    (
        "/v1/chat/completions",
        '{"model": "m", "messages": [{"role": "user", "content": "hi", "x": '
        + "[" * 300
        + "]" * 300
        + '}], "privacy": {"epsilon": 0.01}}',
        {200},
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_lone_surrogates_in_unchecked_fields_never_5xx_with_an_idempotency_key(
    tmp_path, reward_model, upstream, backend, request
):
    app = _app(tmp_path, reward_model, upstream, backend, request)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=10.0)
    with serve_in_thread(app) as url, httpx.Client(timeout=30) as client:
        for i, (path, raw, allowed) in enumerate(_SURROGATE_BODIES):
            codes = []
            for idem in (None, f"s{i}"):
                h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                if idem:
                    h["Idempotency-Key"] = idem
                assert state.wait_settled(timeout=10)
                before = _totals(state, key_id)
                r = client.post(url + path, content=raw.encode("ascii"), headers=h)
                codes.append(r.status_code)
                assert r.status_code in allowed, (raw[:200], idem, r.status_code, r.text)
                assert state.wait_settled(timeout=10)
                if r.status_code != 200:
                    assert _totals(state, key_id) == before
                    continue
                if idem:  # the same bytes again: the stored answer, not charged again
                    before = _totals(state, key_id)
                    again = client.post(url + path, content=raw.encode("ascii"), headers=h)
                    assert again.status_code == 200 and again.headers.get("idempotent-replayed") == "true"
                    assert again.content == r.content and _totals(state, key_id) == before
            assert codes[0] == codes[1], (raw[:200], codes)
        # A different body under the same key is a mismatch (422), never a 5xx.
        other = _SURROGATE_BODIES[0][1].replace("\\ud800", "\\ud801")
        h = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Idempotency-Key": "s0"}
        r = client.post(url + "/v1/chat/completions", content=other.encode("ascii"), headers=h)
        assert r.status_code == 422 and r.json()["error"]["code"] == "idempotency_key_reused", r.text


# ------------------------------------------------------------------------------------------------
# Issue 36, item 5: a duplicate of a running attempt is told to retry and then gets the replay; a
# delivered answer stays reachable when its settle, or its storage, fails; a charged error is the key's
# answer. Budget: one key is charged once, and only with an answer (or its charged error).
# ------------------------------------------------------------------------------------------------


def _trigger(state, name: str, on: bool, *, table: str, sqlite_when: str, pg_if: str) -> None:
    """Make writes to ``table`` that match the condition fail (a trigger raises), or repair them."""
    pg = state.engine.dialect.name == "postgresql"
    op = "UPDATE" if table == "idempotency" else "INSERT"
    with state.engine.begin() as conn:
        if not on:
            conn.exec_driver_sql(f"DROP TRIGGER {name}" + (f" ON {table}" if pg else ""))
            if pg:
                conn.exec_driver_sql(f"DROP FUNCTION {name}()")
        elif pg:
            conn.exec_driver_sql(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF {pg_if} THEN RAISE EXCEPTION 'injected {name}'; END IF; RETURN NEW; END $$; "
                f"CREATE TRIGGER {name} BEFORE {op} ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()"
            )
        else:
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE {op} ON {table} WHEN {sqlite_when} "
                f"BEGIN SELECT RAISE(ABORT, 'injected {name}'); END"
            )


def _break_settle(state, on: bool) -> None:
    _trigger(
        state,
        "fail_settle",
        on,
        table="ledger",
        sqlite_when="NEW.action = 'settle'",
        pg_if="NEW.action = 'settle'",
    )


def _break_store(state, on: bool) -> None:
    """Make storing an answer (the pending row's update to ``done``) fail."""
    _trigger(
        state,
        "fail_store",
        on,
        table="idempotency",
        sqlite_when="NEW.status = 'done'",
        pg_if="NEW.status = 'done'",
    )


def _in_progress(r: httpx.Response) -> None:
    assert r.status_code == 409, r.text
    assert r.headers.get("x-should-retry") == "true" and int(r.headers["retry-after"]) >= 1, r.text
    err = r.json()["error"]
    assert err.get("code") == "idempotency_in_progress" and err["type"] == "conflict_error", err


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_concurrent_duplicate_is_told_to_retry_and_then_gets_the_replay(
    tmp_path, reward_model, upstream, backend, request
):
    """The first attempt holds its reservation (held in the scorer) when the duplicate arrives: 409
    ``idempotency_in_progress`` with ``x-should-retry: true`` and ``Retry-After``, nothing charged; once
    the first attempt has answered, the same request replays its answer. One charge in all."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    app = _app(tmp_path, reward_model, upstream, backend, request)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    entered, release = threading.Event(), threading.Event()
    real = state.scorer

    def held(prompt, candidates):
        entered.set()
        assert release.wait(60)
        return real(prompt, candidates)

    state.scorer = held
    body = {"prompt": "p", "candidates": ["x", "y", "z"], "privacy": {"epsilon": 0.25}}
    h = {"Authorization": f"Bearer {token}", "Idempotency-Key": "dup"}
    with serve_in_thread(app) as url, ThreadPoolExecutor(1) as ex:
        first = ex.submit(httpx.post, url + "/v1/select", headers=h, json=body, timeout=30)
        assert entered.wait(60)
        assert _totals(state, key_id)["reserved_epsilon"] == 250_000_000  # the first attempt holds it
        # generous client timeouts: on a loaded 2-core machine httpx's default 5 s read timeout was seen to
        # expire before the duplicate's 409 arrived (and the held scorer then timed out too)
        try:
            _in_progress(httpx.post(url + "/v1/select", headers=h, json=body, timeout=30))
        finally:
            release.set()
        r1 = first.result()
        assert r1.status_code == 200 and "idempotent-replayed" not in r1.headers, r1.text
        r2 = httpx.post(url + "/v1/select", headers=h, json=body, timeout=30)
        assert r2.status_code == 200 and r2.headers.get("idempotent-replayed") == "true", r2.text
        assert r2.content == r1.content
        assert state.wait_settled(timeout=10)
        t = _totals(state, key_id)
        assert (t["spent_epsilon"], t["reserved_epsilon"]) == (250_000_000, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_answer_whose_settle_failed_is_stored_and_replayed(
    tmp_path, reward_model, upstream, backend, request
):
    """The settle fails (a trigger on the ledger): the answer is delivered, stored and replayed; its
    reservation stays charged at the reserved cost (reconciliation charges it once), never twice."""
    app = _app(tmp_path, reward_model, upstream, backend, request)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    body = {"prompt": "p", "candidates": ["x", "y"], "privacy": {"epsilon": 0.25}}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "privacy": {"epsilon": 0.125}}
    with serve_in_thread(app) as url:
        _break_settle(state, True)
        for path, payload, ik in (("/v1/select", body, "s-sel"), ("/v1/chat/completions", chat, "s-chat")):
            h = {"Authorization": f"Bearer {token}", "Idempotency-Key": ik}
            r1 = httpx.post(url + path, headers=h, json=payload)
            assert r1.status_code == 200, r1.text
            r2 = httpx.post(url + path, headers=h, json=payload)
            assert r2.status_code == 200 and r2.headers.get("idempotent-replayed") == "true", r2.text
            assert r2.content == r1.content
        t = _totals(state, key_id)
        assert (t["spent_epsilon"], t["reserved_epsilon"]) == (0, 375_000_000)  # open, each once
        _break_settle(state, False)
        with state.engine.begin() as conn:  # age the reservations: reconciliation charges them, once
            conn.execute(db.ledger.update().values(created_at=db.ledger.c.created_at - 3600.0))
        assert len(state.reconcile()) == 2
        for path, payload, ik in (("/v1/select", body, "s-sel"), ("/v1/chat/completions", chat, "s-chat")):
            h = {"Authorization": f"Bearer {token}", "Idempotency-Key": ik}
            r = httpx.post(url + path, headers=h, json=payload)
            assert r.status_code == 200 and r.headers.get("idempotent-replayed") == "true", r.text
        t = _totals(state, key_id)
        assert (t["spent_epsilon"], t["reserved_epsilon"]) == (375_000_000, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_answer_that_could_not_be_stored_is_replayed_once_the_database_is_back(
    tmp_path, reward_model, upstream, backend, request
):
    """Storing the delivered answer fails (a trigger on the idempotency table): a retry is told to
    retry (409 ``idempotency_in_progress``), never charged; the service keeps trying to store the answer,
    and once the table accepts it the retry replays it. One charge in all."""
    import time

    app = _app(tmp_path, reward_model, upstream, backend, request)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    body = {"prompt": "p", "candidates": ["x", "y"], "privacy": {"epsilon": 0.25}}
    h = {"Authorization": f"Bearer {token}", "Idempotency-Key": "lost"}
    with serve_in_thread(app) as url:
        _break_store(state, True)
        try:
            r1 = httpx.post(url + "/v1/select", headers=h, json=body)
            assert r1.status_code == 200, r1.text
            _in_progress(httpx.post(url + "/v1/select", headers=h, json=body))
        finally:
            _break_store(state, False)
        deadline = time.monotonic() + 20
        while True:
            r = httpx.post(url + "/v1/select", headers=h, json=body)
            if r.status_code != 409 or time.monotonic() > deadline:
                break
            _in_progress(r)
            time.sleep(0.2)
        assert r.status_code == 200 and r.headers.get("idempotent-replayed") == "true", r.text
        assert r.content == r1.content
        t = _totals(state, key_id)
        assert (t["spent_epsilon"], t["reserved_epsilon"]) == (250_000_000, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_charged_error_is_the_keys_answer(tmp_path, reward_model, upstream, backend, request):
    """The reward model fails after the reservation (500, charged at the reserved cost): a retry with the
    key replays that error (``x-should-retry: false``), never runs again and is never charged again."""
    app = _app(tmp_path, reward_model, upstream, backend, request)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)

    def broken(prompt, candidates):
        raise RuntimeError("reward model down")

    state.scorer = broken
    body = {"prompt": "p", "candidates": ["x", "y"], "privacy": {"epsilon": 0.25}}
    h = {"Authorization": f"Bearer {token}", "Idempotency-Key": "err"}
    with serve_in_thread(app) as url:
        r1 = httpx.post(url + "/v1/select", headers=h, json=body)
        assert r1.status_code == 500 and r1.headers.get("x-should-retry") == "false", r1.text
        assert r1.json()["error"]["charged"] is True
        before = _totals(state, key_id)
        assert before["reserved_epsilon"] == 250_000_000
        r2 = httpx.post(url + "/v1/select", headers=h, json=body)
        assert r2.status_code == 500 and r2.headers.get("idempotent-replayed") == "true", r2.text
        assert r2.headers.get("x-should-retry") == "false" and r2.content == r1.content
        assert _totals(state, key_id) == before
        assert r2.json()["error"]["code"] == "internal_error"
