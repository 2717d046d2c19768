"""Budgets shared by the keys of a user (``privalign keys create --user NAME``), on SQLite and PostgreSQL:
the keys of one user spend one budget with the race and crash guarantees of a single key; one user's
spending never touches another user's or a plain key's budget; a revoked key of a user cannot spend while
the user's other keys can; a version-2 ledger upgrades with every key keeping its own budget."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import func, select, text
from test_service_replicas import _config

from conftest import serve_in_thread
from privalign.cli import main
from privalign.errors import PrivacyParameterError
from privalign.service import db, migrations
from privalign.service.app import create_app
from privalign.service.config import load_config
from privalign.service.keys import _hash, authenticate, create_key, list_keys, revoke_key, top_up
from privalign.service.store import ActiveKeyCheckFailed, SQLBudgetStore

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
EPS = db.EPS_SCALE


def _database(request, tmp_path, backend: str) -> dict:
    if backend == "sqlite":
        return {"url": f"sqlite:///{tmp_path / 'users.db'}"}
    url, schema = request.getfixturevalue("pg_schema")
    return {"url": url, "schema": schema}


def _engine(database: dict):
    eng = db.make_engine(database["url"], schema=database.get("schema"))
    db.create_schema(eng, schema=database.get("schema"))
    return eng


def _exact(engine, principal: str) -> dict:
    """The principal's totals derived from the rows, checked equal to the cached totals (units)."""
    with engine.connect() as conn:
        derived = db.derive_totals(conn, principal, units=True)
    assert SQLBudgetStore(engine).snapshot(principal, units=True) == derived
    return derived


def _count(engine, table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def _select(
    base: str, token: str, prompt: str, epsilon: float = 0.0625, client: httpx.Client | None = None
) -> httpx.Response:
    return (client or httpx).post(
        base + "/v1/select",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "prompt": prompt,
            "candidates": ["a kind reply", "a rude reply"],
            "privacy": {"epsilon": epsilon},
        },
        timeout=60,
    )


# ------------------------------------------------------------------------------------------------
# Keys: create, join, top up, revoke, list
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_keys_of_a_user_share_one_budget(request, tmp_path, backend):
    eng = _engine(_database(request, tmp_path, backend))
    store = SQLBudgetStore(eng)
    a1, t1 = create_key(eng, budget_epsilon=1.0, user="alice", name="laptop")
    a2, t2 = create_key(eng, user="alice", name="phone")  # joins: no budget of its own
    b1, tb = create_key(eng, budget_epsilon=1.0, user="bob")
    p1, tp = create_key(eng, budget_epsilon=1.0)  # a key with its own budget
    k1, k2, kb, kp = (authenticate(store, t) for t in (t1, t2, tb, tp))
    assert k1.principal == k2.principal == "u:alice" and k1.user == k2.user == "alice"
    assert kb.principal == "u:bob" and kp.principal == p1 and kp.user is None
    assert k2.limit == (1.0, 0.0) and k2.accounting == "pure"
    # Nothing contradicting the user's budget is written: one line naming the parameter.
    keys_before, grants_before = _count(eng, db.api_keys), _count(eng, db.budget_grants)
    for kwargs, param in (
        ({"budget_epsilon": 5.0}, "budget_epsilon"),
        ({"budget_delta": 1e-6}, "budget_delta"),
        ({"accounting": "zcdp"}, "accounting"),
    ):
        with pytest.raises(PrivacyParameterError, match=f"'{param}' parameter") as ei:
            create_key(eng, user="alice", **kwargs)
        assert "\n" not in str(ei.value)
    for bad in ("", "a b", "x" * 61, "é", "u:x/y"):
        with pytest.raises(PrivacyParameterError, match="'user' parameter must be 1 to 60"):
            create_key(eng, budget_epsilon=1.0, user=bad)
    with pytest.raises(PrivacyParameterError, match="'budget_epsilon' parameter is required"):
        create_key(eng, user="carol")  # a first key must create the budget
    assert (_count(eng, db.api_keys), _count(eng, db.budget_grants)) == (keys_before, grants_before)
    assert create_key(eng, user="alice", accounting="pure")[0]  # the user's own accounting is accepted
    # Spending through either key spends the user's budget; a top-up through either key adds to it.
    store.reserve(k1.principal, (0.25, 0.0), require_active=True, active_key=k1.key_id)
    store.reserve(k2.principal, (0.25, 0.0), require_active=True, active_key=k2.key_id)
    top_up(eng, a2, epsilon=0.5)
    rows = {r["key_id"]: r for r in list_keys(eng)}
    for k in (a1, a2):
        assert rows[k]["user"] == "alice" and rows[k]["limit"] == [1.5, 0.0]
        assert rows[k]["reserved"] == [0.5, 0.0] and rows[k]["remaining"] == [1.0, 0.0]
    assert rows[b1]["remaining"] == rows[p1]["remaining"] == [1.0, 0.0] and rows[p1]["user"] is None
    # Revoking one key of a user: that key can no longer spend (not even through a stale cache entry,
    # require_active checks the key itself); the other key and the budget are untouched.
    revoke_key(eng, a1)
    assert authenticate(store, t1) is None
    with pytest.raises(ActiveKeyCheckFailed):
        store.reserve(k1.principal, (0.25, 0.0), require_active=True, active_key=a1)
    assert authenticate(store, t2) is not None
    store.reserve(k2.principal, (0.25, 0.0), require_active=True, active_key=a2)
    rows = {r["key_id"]: r for r in list_keys(eng)}
    assert rows[a1]["revoked"] and not rows[a2]["revoked"] and rows[a2]["remaining"] == [0.75, 0.0]
    # A key of another user, or a key of its own, is a different budget.
    for principal in ("u:bob", p1):
        assert _exact(eng, principal)["reserved_epsilon"] == 0
    assert _exact(eng, "u:alice") == {
        "limit_epsilon": 3 * EPS // 2,
        "limit_delta": 0,
        "spent_epsilon": 0,
        "spent_delta": 0,
        "reserved_epsilon": 3 * EPS // 4,
        "reserved_delta": 0,
    }
    eng.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_first_keys_of_a_user_create_one_budget(request, tmp_path, backend):
    """Keys of a new user created concurrently, each stating a budget: exactly one creates the budget,
    the others are refused (they would contradict it); the budget is granted once."""
    eng = _engine(_database(request, tmp_path, backend))
    barrier = threading.Barrier(6)

    def create(_):
        barrier.wait()
        try:
            return create_key(eng, budget_epsilon=1.0, user="carol")[0]
        except PrivacyParameterError as exc:
            assert "'budget_epsilon' parameter must be absent" in str(exc)
            return None

    with ThreadPoolExecutor(6) as ex:
        made = [k for k in ex.map(create, range(6)) if k is not None]
    assert len(made) == 1
    assert _exact(eng, "u:carol")["limit_epsilon"] == EPS
    with eng.connect() as conn:
        grants = conn.execute(
            select(func.count()).where(db.budget_grants.c.principal == "u:carol")
        ).scalar_one()
    assert grants == 1
    eng.dispose()


def test_keys_cli_user(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    def run(*argv):
        code = main(["keys", *argv, "--db", url, "--json"])
        cap = capsys.readouterr()
        return code, cap.out, cap.err

    code, out, _ = run("create", "--budget-epsilon", "2", "--budget-delta", "1e-6", "--user", "dana")
    first = json.loads(out)
    assert code == 0 and first["user"] == "dana" and first["joined_user_budget"] is False
    code, out, _ = run("create", "--user", "dana", "--name", "ci")
    second = json.loads(out)
    assert code == 0 and second["joined_user_budget"] and second["remaining"] == [2.0, 1e-6]
    for argv, flag in (
        (("create", "--user", "dana", "--budget-epsilon", "1"), "--budget-epsilon"),
        (("create", "--user", "dana", "--accounting", "zcdp"), "--accounting"),
        (("create", "--user", "no spaces", "--budget-epsilon", "1"), "--user"),
        (("create", "--user", "erin"), "--budget-epsilon"),
    ):
        code, out, err = run(*argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and flag in err, (argv, err)
    assert run("top-up", second["key_id"], "--epsilon", "1")[0] == 0
    code, out, _ = run("list")
    rows = json.loads(out)
    assert len(rows) == 2 and {r["user"] for r in rows} == {"dana"}
    assert all(r["limit"] == [3.0, 1e-6] for r in rows)
    assert main(["keys", "list", "--db", url]) == 0
    assert capsys.readouterr().out.count("user=dana") == 2


# ------------------------------------------------------------------------------------------------
# The service: /v1/budget, isolation, revocation, races
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_service_user_budget_isolation_and_revocation(request, tmp_path, reward_model, backend):
    database = _database(request, tmp_path, backend)
    app = create_app(load_config(_config(tmp_path, "u.toml", database, reward_model)))
    state = app.state.service
    eng = state.engine
    a1, t1 = create_key(eng, budget_epsilon=1.0, user="alice")
    a2, t2 = create_key(eng, user="alice")
    _, tb = create_key(eng, budget_epsilon=1.0, user="bob")
    p1, tp = create_key(eng, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        for tok, eps in ((t1, 0.25), (t2, 0.25), (t1, 0.125)):
            r = _select(url, tok, "q", eps)
            assert r.status_code == 200, r.text
        # The answer's remaining is the user's: 1 - 0.625.
        assert r.json()["privacy"]["remaining"]["epsilon"] == pytest.approx(0.375)
        assert state.wait_settled(timeout=10)
        for tok, key_id in ((t1, a1), (t2, a2)):
            b = httpx.get(url + "/v1/budget", headers={"Authorization": f"Bearer {tok}"}).json()
            assert b["key_id"] == key_id and b["user"] == "alice"
            assert b["spent"]["epsilon"] == pytest.approx(0.625) and b["remaining"][
                "epsilon"
            ] == pytest.approx(0.375)
            assert [row["action"] for row in b["ledger"]].count("settle") == 3  # both keys' rows
        for tok, user in ((tb, "bob"), (tp, None)):  # untouched
            b = httpx.get(url + "/v1/budget", headers={"Authorization": f"Bearer {tok}"}).json()
            assert b["user"] == user and b["remaining"]["epsilon"] == 1.0 and b["ledger"] == []
        # a1 is in this process's key cache; revoked, it cannot spend (401, nothing charged) while a2 can.
        revoke_key(eng, a1)
        before = _exact(eng, "u:alice")
        r = _select(url, t1, "after revoke", 0.125)
        assert r.status_code == 401, r.text
        assert _exact(eng, "u:alice") == before
        r = _select(url, t2, "still mine", 0.125)
        assert r.status_code == 200, r.text
        # The user's budget runs out for every key of the user at once: 0.25 left, 0.5 refused.
        r = _select(url, t2, "too much", 0.5)
        assert r.status_code == 429 and "user 'alice'" in r.json()["error"]["message"]
        assert state.wait_settled(timeout=10)
    alice = _exact(eng, "u:alice")
    assert alice["spent_epsilon"] == 3 * EPS // 4 and alice["reserved_epsilon"] == 0
    for principal in ("u:bob", p1):
        assert _exact(eng, principal)["spent_epsilon"] == 0
    state.store.close()
    eng.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_service_keys_of_a_user_racing_never_overspend(request, tmp_path, reward_model, backend):
    """48 concurrent clients, 2 requests each: 32 on two keys of one user (budget 1 = 16 requests of
    ε = 1/16) and 16 on a plain key and on another user; exactly 16 answers for the user, as many charges,
    and the other budgets charged exactly what their own answers cost."""
    database = _database(request, tmp_path, backend)
    app = create_app(load_config(_config(tmp_path, "race.toml", database, reward_model)))
    state = app.state.service
    eng = state.engine
    _, t1 = create_key(eng, budget_epsilon=1.0, user="alice")
    _, t2 = create_key(eng, user="alice")
    plain, tp = create_key(eng, budget_epsilon=1.0)
    _, tb = create_key(eng, budget_epsilon=1.0, user="bob")
    tokens = [t1, t2] * 16 + [tp, tb] * 8
    barrier = threading.Barrier(len(tokens))

    def client(i: int) -> list[int]:
        with httpx.Client(timeout=60.0) as c:  # one connection per client, as the OpenAI client keeps
            barrier.wait()
            return [_select(base, tokens[i], f"q{i}-{j}", client=c).status_code for j in range(2)]

    with serve_in_thread(app) as base:
        with ThreadPoolExecutor(len(tokens)) as ex:
            codes = list(ex.map(client, range(len(tokens))))
        assert state.wait_settled(timeout=30)
    alice_codes = [c for i, cs in enumerate(codes) for c in cs if i < 32]
    assert sorted(set(alice_codes)) == [200, 429] and alice_codes.count(200) == 16
    for i0, principal in ((32, plain), (33, "u:bob")):  # 8 clients x 2 requests each: 1.0 exactly
        own = [c for i, cs in enumerate(codes) for c in cs if i >= 32 and (i - i0) % 2 == 0]
        assert own == [200] * 16, own
        assert _exact(eng, principal)["spent_epsilon"] == EPS
    alice = _exact(eng, "u:alice")
    assert alice["spent_epsilon"] == EPS and alice["reserved_epsilon"] == 0  # never overspent, all used
    actions = [r["action"] for r in state.store.ledger_rows("u:alice", limit=1000)]
    assert actions.count("reserve") == actions.count("settle") == 16  # exactly as many charges as answers
    state.store.close()
    eng.dispose()


@pytest.mark.postgres
@pytest.mark.slow
def test_two_replicas_keys_of_a_user_never_overspend(tmp_path, reward_model, pg_schema, server_process):
    url, schema = pg_schema
    database = {"url": url, "schema": schema}
    cfg = _config(tmp_path, "pg.toml", database, reward_model)
    a = server_process(cfg).start()
    b = server_process(cfg).start()
    eng = _engine(database)
    toks = [create_key(eng, budget_epsilon=1.0, user="alice")[1]]
    toks += [create_key(eng, user="alice")[1] for _ in range(3)]  # four keys, one budget
    barrier = threading.Barrier(64)

    def client(i: int) -> list[int]:
        base = (a.url, b.url)[i % 2]
        with httpx.Client(timeout=60.0) as c:
            barrier.wait()
            return [_select(base, toks[(i // 2) % 4], f"q{i}", client=c).status_code for _ in range(2)]

    with ThreadPoolExecutor(64) as ex:
        codes = [c for cs in ex.map(client, range(64)) for c in cs]
    assert codes.count(200) == 16 and codes.count(429) == 112, sorted(set(codes))
    deadline = time.time() + 30
    while _exact(eng, "u:alice")["reserved_epsilon"] and time.time() < deadline:  # deferred settles
        time.sleep(0.1)
    alice = _exact(eng, "u:alice")
    assert alice["spent_epsilon"] == EPS and alice["reserved_epsilon"] == 0
    actions = [r["action"] for r in SQLBudgetStore(eng).ledger_rows("u:alice", limit=1000)]
    assert actions.count("reserve") == actions.count("settle") == 16
    eng.dispose()


def _crash_one_key_of_a_user(tmp_path, reward_model, database, server_process):
    """kill -9 while a request of one key of a user is scoring (reserved): the user's budget stays charged
    at the reserved cost, the restarted service reconciles it, and the user's other key spends exactly
    what is left."""
    eng = _engine(database)
    marker = tmp_path / "scoring.marker"
    scorer = {
        "target": "svc_components:sleepy_scorer",
        "path": str(reward_model),
        "sleep_s": 60.0,
        "marker": str(marker),
    }
    cfg = _config(tmp_path, "crash.toml", database, reward_model, scorer=scorer, timeout=1.0, reconcile=1.0)
    _, t1 = create_key(eng, budget_epsilon=1.0, user="alice")
    _, t2 = create_key(eng, user="alice")
    plain, _ = create_key(eng, budget_epsilon=1.0)
    srv = server_process(cfg).start()
    result: dict = {}

    def call():
        try:
            result["r"] = _select(srv.url, t1, "p", 0.25)
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
    assert "err" in result  # no answer, hence no selection
    store = SQLBudgetStore(eng)
    assert [r["action"] for r in store.ledger_rows("u:alice")] == ["reserve"]
    assert _exact(eng, "u:alice")["reserved_epsilon"] == EPS // 4  # charged while open (fail closed)
    time.sleep(1.1)  # older than reconcile_after_s
    cfg2 = _config(tmp_path, "after.toml", database, reward_model, timeout=1.0, reconcile=1.0)
    srv2 = server_process(cfg2).start()  # reconciles at start-up
    assert [r["action"] for r in store.ledger_rows("u:alice")] == ["reconcile", "reserve"]
    alice = _exact(eng, "u:alice")
    assert alice["spent_epsilon"] == EPS // 4 and alice["reserved_epsilon"] == 0
    codes = [_select(srv2.url, t2, f"q{i}", 0.25).status_code for i in range(4)]
    assert codes == [200, 200, 200, 429]  # the other key of the user: exactly the 0.75 left
    b = httpx.get(srv2.url + "/v1/budget", headers={"Authorization": f"Bearer {t2}"}, timeout=30).json()
    assert b["user"] == "alice" and b["remaining"]["epsilon"] == 0.0
    assert _exact(eng, plain)["spent_epsilon"] == 0
    eng.dispose()


@pytest.mark.slow
def test_kill_9_mid_request_of_a_user_key_sqlite(tmp_path, reward_model, server_process):
    _crash_one_key_of_a_user(
        tmp_path, reward_model, {"url": f"sqlite:///{tmp_path / 'crash.db'}"}, server_process
    )


@pytest.mark.postgres
@pytest.mark.slow
def test_kill_9_mid_request_of_a_user_key_postgres(tmp_path, reward_model, pg_schema, server_process):
    url, schema = pg_schema
    _crash_one_key_of_a_user(tmp_path, reward_model, {"url": url, "schema": schema}, server_process)


# ------------------------------------------------------------------------------------------------
# Migration: a version-2 ledger keeps every key's own budget
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_v2_ledger_upgrades_with_keys_keeping_their_budgets(request, tmp_path, backend):
    from alembic import command

    database = _database(request, tmp_path, backend)
    eng = db.make_engine(database["url"], schema=database.get("schema"))
    with eng.begin() as conn:
        command.upgrade(migrations.alembic_config(conn), "0002")  # the version-2 tables, as released
    salt = "ab" * 16
    with eng.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO api_keys (key_id, name, salt, secret_hash, accounting, created_at) "
                "VALUES (:k, '', :s, :h, 'pure', 0)"
            ),
            [{"k": k, "s": salt, "h": _hash(salt, "s3cret")} for k in ("k1", "k2")],
        )
    store = SQLBudgetStore(eng)
    store.grant("k1", 1.0, 0.0)
    store.grant("k2", 2.0, 0.0)
    rid = store.reserve("k1", (0.25, 0.0)).reservation_id
    store.settle(rid, (0.25, 0.0))
    db.create_schema(eng, schema=database.get("schema"))  # the upgrade to 0003
    with eng.connect() as conn:
        assert migrations.current_revision(conn) == migrations.HEAD == "0003"
        assert conn.execute(select(db.schema_version.c.version)).scalar_one() == db.SCHEMA_VERSION == 3
        assert conn.execute(select(db.api_keys.c.user_name)).scalars().all() == [None, None]
    k1 = authenticate(store, "pa_k1_s3cret")
    assert k1 is not None and k1.user is None and k1.principal == "k1" and k1.limit == (1.0, 0.0)
    rows = {r["key_id"]: r for r in list_keys(eng)}
    assert rows["k1"]["remaining"] == [0.75, 0.0] and rows["k2"]["remaining"] == [2.0, 0.0]
    assert _exact(eng, "k1")["spent_epsilon"] == EPS // 4
    # A user created after the upgrade has a budget of its own.
    _, tok = create_key(eng, budget_epsilon=0.5, user="alice")
    assert authenticate(store, tok).limit == (0.5, 0.0) and _exact(eng, "k2")["limit_epsilon"] == 2 * EPS
    eng.dispose()
