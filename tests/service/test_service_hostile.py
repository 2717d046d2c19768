"""Hostile inputs, one test each: hostile input never yields a 5xx and never costs budget,
exact budgets, errors clients understand, private files, expiring stored answers, OpenAI compatibility,
readiness. Every test runs the real app on uvicorn (in a thread) over SQLite."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time

import httpx
import openai
import pytest
from svc_components import candidates_for
from test_service_http import _cfg, _spent, metric

from conftest import serve_in_thread
from privalign.service import db
from privalign.service.app import create_app
from privalign.service.keys import create_key


@pytest.fixture
def svc(tmp_path, reward_model, upstream):
    app = create_app(_cfg(tmp_path, reward_model, upstream))
    with serve_in_thread(app) as url:
        yield url, app.state.service


def _raw(url: str, path: str, token: str | None, body: str, **headers: str) -> httpx.Response:
    h = {"Content-Type": "application/json", **headers}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return httpx.post(url + path, headers=h, content=body.encode("ascii"), timeout=20)


def _untouched(state, key_id: str) -> None:
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] == 0.0 and t["reserved_epsilon"] == 0.0 and t["spent_delta"] == 0.0, t
    assert state.store.ledger_rows(key_id) == []


# ------------------------------------------------------------------------------------------------
# 1. Hostile input: 400 at validation, never a 5xx, never a charge
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, param",
    [
        # A JSON-escaped lone surrogate used to 500 *after* the private selection (charged, no answer).
        (
            "/v1/select",
            '{"prompt": "p", "candidates": ["a kind reply", "\\ud800"], "privacy": {"epsilon": 0.5}}',
            "candidates[1]",
        ),
        ("/v1/select", '{"prompt": "\\udfff", "candidates": ["a", "b"]}', "prompt"),
        (
            "/v1/chat/completions",
            '{"model": "m", "messages": [{"role": "user", "content": "\\ud83d"}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            '{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}',
            "model",
        ),
        ("/v1/completions", '{"model": "m", "prompt": "x\\ud800y"}', "prompt"),
    ],
)
def test_lone_surrogates_are_refused_at_validation(svc, path, body, param):
    url, state = svc
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    for _ in range(3):  # whichever candidate a selection would pick: always the same 400
        r = _raw(url, path, token, body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param and "unicode" in r.json()["error"]["message"].lower()
    assert metric(url, "privalign_scorer_calls_total") == 0
    _untouched(state, key_id)


@pytest.mark.parametrize(
    "privacy, param",
    [
        ('{"epsilon": true}', "privacy.epsilon"),  # bool is not a number (was accepted as ε = 1)
        ('{"epsilon": "0.5"}', "privacy.epsilon"),
        ('{"epsilon": NaN}', "privacy.epsilon"),
        ('{"epsilon": Infinity}', "privacy.epsilon"),
        # 1e400 is valid JSON that parses as inf: refused like Infinity, never ε = ∞ (no privacy)
        ('{"epsilon": 1e400}', "privacy.epsilon"),
        ('{"epsilon": 1E400}', "privacy.epsilon"),
        ('{"epsilon": -1e400}', "privacy.epsilon"),
        ('{"epsilon": -Infinity}', "privacy.epsilon"),
        ('{"method": "privitp", "sigma_x": 1e400}', "privacy.sigma_x"),
        ('{"method": "privitp", "sigma_z": NaN}', "privacy.sigma_z"),
        ('{"method": "privitp", "beta": 1e400}', "privacy.beta"),
        ('{"epsilon": 1e-16}', "privacy.epsilon"),  # below the floor
        ('{"epsilon": 1e-309}', "privacy.epsilon"),  # was a 500 with a traceback in the log
        ('{"epsilon": 5e-324}', "privacy.epsilon"),
        ('{"n": 2.0}', "privacy.n"),
        ('{"n": true}', "privacy.n"),
        (
            '{"method": "privitp", "sigma_x": 1e308, "epsilon": 5.0}',
            "privacy.sigma_x",
        ),  # was reserved, then a charged 500
        ('{"method": "privitp", "sigma_z": 1e-300, "epsilon": 5.0}', "privacy.sigma_z"),
        ('{"method": "privitp", "beta": 1e300, "epsilon": 5.0}', "privacy.beta"),
        ('{"method": "privitp", "beta": false}', "privacy.beta"),
    ],
)
def test_privacy_parameters_are_strict_and_range_checked_before_any_reservation(svc, privacy, param):
    url, state = svc
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    cands = '["a kind reply", "a rude reply", "plain"]'
    r = _raw(url, "/v1/select", token, f'{{"prompt": "p", "candidates": {cands}, "privacy": {privacy}}}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    # The same without a key: a 400 (validation comes first), never a 5xx.
    r = _raw(url, "/v1/select", None, f'{{"prompt": "p", "candidates": {cands}, "privacy": {privacy}}}')
    assert r.status_code == 400
    assert metric(url, "privalign_scorer_calls_total") == 0
    _untouched(state, key_id)


@pytest.mark.parametrize("value", ["1e400", "Infinity", "NaN"])
@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/select", '{{"prompt": "p", "candidates": ["a", "b", "c"], "privacy": {{"epsilon": {v}}}}}'),
        (
            "/v1/chat/completions",
            '{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], '
            '"privacy": {{"epsilon": {v}}}}}',
        ),
        ("/v1/completions", '{{"model": "m", "prompt": "hi", "privacy": {{"epsilon": {v}}}}}'),
    ],
)
def test_a_non_finite_epsilon_is_a_400_on_every_selecting_endpoint(svc, path, body, value):
    """Issue 24: ε = ∞ (also as 1e400, which JSON parsers read as inf) is no privacy: a 400 naming
    privacy.epsilon, before any generation, scoring or reservation; a non-private answer is asked for by name
    (method "bon", where the operator allows it)."""
    url, state = svc
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    r = _raw(url, path, token, body.format(v=value))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "privacy.epsilon" and "finite" in err["message"], r.text
    assert metric(url, "privalign_scorer_calls_total") == 0
    _untouched(state, key_id)


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", "true"),
        ("temperature", '"1"'),
        ("temperature", "3"),
        ("top_p", "0"),
        ("max_tokens", "1.5"),
        ("max_completion_tokens", "100000"),
        ("n", "2"),
        ("stream", '"yes"'),
        ("stop", '["x"]'),
        ("logit_bias", '{"1": 5}'),
    ],
)
def test_openai_parameters_are_passed_or_refused_by_name(svc, field, value):
    url, state = svc
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    r = _raw(
        url,
        "/v1/chat/completions",
        token,
        f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "{field}": {value}}}',
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    _untouched(state, key_id)


# ------------------------------------------------------------------------------------------------
# 2. Exact budgets
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def svc_pg(tmp_path, reward_model, upstream, pg_schema):
    from dataclasses import replace

    url, schema = pg_schema
    cfg = _cfg(tmp_path, reward_model, upstream)
    app = create_app(replace(cfg, database=replace(cfg.database, url=url, schema=schema)))
    with serve_in_thread(app) as base:
        yield base, app.state.service


@pytest.mark.parametrize(
    "accounting, delta, backend",
    [
        ("pure", 0.0, "sqlite"),
        ("ex-post", 1e-6, "sqlite"),
        pytest.param("pure", 0.0, "postgres", marks=pytest.mark.postgres),
        pytest.param("ex-post", 1e-6, "postgres", marks=pytest.mark.postgres),
    ],
)
def test_a_budget_of_two_serves_exactly_twenty_requests_at_a_tenth(request, accounting, delta, backend):
    url, state = request.getfixturevalue("svc" if backend == "sqlite" else "svc_pg")
    key_id, token = create_key(state.engine, budget_epsilon=2.0, budget_delta=delta, accounting=accounting)
    h = {"Authorization": f"Bearer {token}"}
    body = {"prompt": "p", "candidates": ["a kind reply", "a rude reply"], "privacy": {"epsilon": 0.1}}
    codes = [httpx.post(url + "/v1/select", headers=h, json=body, timeout=20).status_code for _ in range(21)]
    assert codes == [200] * 20 + [429], codes  # floats served 19
    assert state.wait_settled(key_id, timeout=10)
    exact = state.store.snapshot(key_id, units=True)
    assert (
        exact["spent_epsilon"] == exact["limit_epsilon"] == 2 * db.EPS_SCALE
        and exact["reserved_epsilon"] == 0
    )
    # After exhaustion nothing is served: tiny ε is refused by the floor, the floor itself by the budget.
    r = httpx.post(url + "/v1/select", headers=h, json={**body, "privacy": {"epsilon": 1e-16}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "privacy.epsilon"
    floor = state.cfg.limits.min_epsilon
    for _ in range(3):
        r = httpx.post(url + "/v1/select", headers=h, json={**body, "privacy": {"epsilon": floor}})
        assert r.status_code == 429
    assert state.store.snapshot(key_id, units=True) == exact
    b = httpx.get(url + "/v1/budget", headers=h).json()
    assert b["remaining"]["epsilon"] == 0.0 and b["spent"]["epsilon"] == 2.0


def test_charges_are_whole_ledger_units_and_the_requested_epsilon_is_never_exceeded(svc):
    url, state = svc
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    h = {"Authorization": f"Bearer {token}"}
    r = httpx.post(
        url + "/v1/select",
        headers=h,
        json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.3}},
    )
    assert r.status_code == 200
    p = r.json()["privacy"]
    assert p["charged"] == 0.3 and p["epsilon_charged"] <= 0.3 and p["remaining"]["epsilon"] == 0.7
    # ε is rounded *down* to the 1e-9 unit: the mechanism never runs at more than was asked.
    r = httpx.post(
        url + "/v1/select",
        headers=h,
        json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.1234567891999}},
    )
    assert r.status_code == 200 and r.json()["privacy"]["charged"] == 0.123456789
    assert state.wait_settled(key_id, timeout=10)
    assert state.store.snapshot(key_id, units=True)["spent_epsilon"] == 300_000_000 + 123_456_789


# ------------------------------------------------------------------------------------------------
# 3. Errors clients understand
# ------------------------------------------------------------------------------------------------


def test_a_charged_failure_is_not_retried_by_the_openai_client(tmp_path, reward_model, upstream):
    calls = []

    def broken(prompt, texts):
        calls.append(1)
        raise RuntimeError("boom")

    app = create_app(_cfg(tmp_path, reward_model, upstream), scorer=broken)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=2)  # the client's default
        with pytest.raises(openai.InternalServerError) as ei:
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"privacy": {"epsilon": 0.25}},
            )
        assert ei.value.response.headers["x-should-retry"] == "false"
        assert ei.value.body["charged"] is True
    assert len(calls) == 1  # was 3: one failed call cost three reservations
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] + t["reserved_epsilon"] == pytest.approx(0.25)


def test_the_429_speaks_http_and_is_not_retried(svc):
    url, state = svc
    key_id, token = create_key(state.engine, budget_epsilon=0.5)
    client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=2)
    t0 = time.monotonic()
    with pytest.raises(openai.RateLimitError) as ei:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_body={"privacy": {"epsilon": 1.0}}
        )
    assert time.monotonic() - t0 < 0.5 + 5  # no back-off retries (each would wait ≥ 0.5 s)
    assert ei.value.response.headers["x-should-retry"] == "false"
    msg = ei.value.body["message"]
    assert "remaining(" not in msg and "GET /v1/budget" in msg
    assert ei.value.body["remaining"] == {"epsilon": 0.5, "delta": 0.0}
    assert metric(url, "privalign_refusals_total") == 1
    _untouched(state, key_id)


def test_budget_uses_field_names_and_never_blocks(tmp_path, reward_model):
    app = create_app(_cfg(tmp_path, reward_model))
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0, budget_delta=1e-6, accounting="ex-post")
    state.settler.submit(time.sleep, 3.0)  # a settle worker stuck behind a slow database…
    state.settler.submit(time.sleep, 3.0)
    h = {"Authorization": f"Bearer {token}"}
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/select",
            headers=h,
            json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.25}},
        )
        assert r.status_code == 200
        t0 = time.monotonic()
        b = httpx.get(url + "/v1/budget", headers=h, timeout=10).json()
        assert time.monotonic() - t0 < 1.0  # …does not block the budget read
        assert b["pending_settles"] == 1 and b["reserved"]["epsilon"] == 0.25 and b["spent"]["epsilon"] == 0.0
        assert (
            set(b["limit"])
            == set(b["spent"])
            == set(b["reserved"])
            == set(b["remaining"])
            == {"epsilon", "delta"}
        )
        assert b["limit"] == {"epsilon": 1.0, "delta": 1e-6} and b["remaining"]["epsilon"] == 0.75
        assert state.wait_settled(key_id, timeout=15)
        b = httpx.get(url + "/v1/budget", headers=h).json()
        assert b["spent"]["epsilon"] == 0.25 and b["pending_settles"] == 0


# ------------------------------------------------------------------------------------------------
# 4. Files
# ------------------------------------------------------------------------------------------------


def test_ledger_files_are_private_and_stored_answers_expire(tmp_path, reward_model):
    old = os.umask(0o022)
    try:
        cfg = _cfg(tmp_path, reward_model)
        from dataclasses import replace

        cfg = replace(cfg, limits=replace(cfg.limits, idempotency_ttl_s=1.0))
        app = create_app(cfg)
    finally:
        os.umask(old)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    h = {"Authorization": f"Bearer {token}", "Idempotency-Key": "k1"}
    body = {"prompt": "p", "candidates": ["a kind reply", "a secret reply"], "privacy": {"epsilon": 0.25}}
    with serve_in_thread(app) as url:
        r1 = httpx.post(url + "/v1/select", headers=h, json=body)
        r2 = httpx.post(url + "/v1/select", headers=h, json=body)
        assert r1.status_code == r2.status_code == 200 and r2.headers["idempotent-replayed"] == "true"
        path = tmp_path / "svc.db"
        for f in (path, path.with_name("svc.db-wal"), path.with_name("svc.db-shm")):
            if f.exists():
                assert stat.S_IMODE(f.stat().st_mode) == 0o600, (f, oct(f.stat().st_mode))
        assert path.exists()
        with state.engine.connect() as conn:
            assert conn.execute(db.idempotency.select()).first() is not None
        time.sleep(1.2)
        # Expired: not replayed (a new attempt, charged again), and reconciliation deletes the rows.
        r3 = httpx.post(url + "/v1/select", headers=h, json=body)
        assert r3.status_code == 200 and "idempotent-replayed" not in r3.headers
        time.sleep(1.2)
        state.reconcile()
        with state.engine.connect() as conn:
            assert conn.execute(db.idempotency.select()).first() is None


# ------------------------------------------------------------------------------------------------
# 5. OpenAI compatibility
# ------------------------------------------------------------------------------------------------


class RecordingGenerator:
    """A generator that records its keyword arguments; candidates as the upstream test server makes them."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, prompt, n, **kw):
        self.calls.append({"prompt": prompt, "n": n, **kw})
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        return candidates_for(text, n)


@pytest.fixture
def rec(tmp_path, reward_model):
    gen = RecordingGenerator()
    app = create_app(_cfg(tmp_path, reward_model), generator=gen)
    with serve_in_thread(app) as url:
        yield url, app.state.service, gen


def test_models_sampling_parameters_content_parts_and_completions(rec):
    url, state, gen = rec
    key_id, token = create_key(state.engine, budget_epsilon=10.0)
    client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    assert [m.id for m in client.models.list()] == ["privalign"]
    chat = client.chat.completions.create(
        model="m",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]}
        ],
        temperature=0.3,
        top_p=0.9,
        max_completion_tokens=17,
        extra_body={"privacy": {"epsilon": 0.5, "n": 3}},
    )
    assert chat.choices[0].message.content in candidates_for("Say hi", 3)
    assert gen.calls[-1] == {
        "prompt": [{"role": "user", "content": "Say hi"}],
        "n": 3,
        "max_tokens": 17,
        "temperature": 0.3,
        "top_p": 0.9,
        "chat": True,
    }
    comp = client.completions.create(
        model="m",
        prompt="Once upon",
        max_tokens=9,
        temperature=0.0,
        extra_body={"privacy": {"epsilon": 0.5, "n": 2}},
    )
    assert comp.choices[0].text in candidates_for("Once upon", 2)
    assert gen.calls[-1] == {
        "prompt": "Once upon",
        "n": 2,
        "max_tokens": 9,
        "temperature": 0.0,
        "top_p": 1.0,
        "chat": False,
    }
    # An image part is refused by name, before any charge.
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        )
    assert ei.value.body["param"].startswith("messages[0].content")
    assert state.wait_settled(key_id, timeout=10)
    assert (
        _spent(state.engine, key_id)["spent_epsilon"] == 1.0
    )  # 0.5 (chat) + 0.5 (completion); the 400 is free
    assert len(gen.calls) == 2


def test_streaming_with_the_official_client_sync_and_async(rec):
    url, state, gen = rec
    key_id, token = create_key(state.engine, budget_epsilon=10.0)
    client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_body={"privacy": {"epsilon": 0.5, "n": 3}},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text in candidates_for("hi", 3) and chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].model_extra["privacy"]["charged"] == 0.5

    async def go():
        ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
        out = []
        stream = await ac.completions.create(
            model="m", prompt="tell", stream=True, extra_body={"privacy": {"epsilon": 0.5, "n": 2}}
        )
        async for c in stream:
            out.append(c)
        chat = await ac.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hey"}],
            extra_body={"privacy": {"epsilon": 0.5, "n": 2}},
        )
        await ac.close()
        return out, chat

    out, chat = asyncio.run(go())
    assert "".join(c.choices[0].text for c in out) in candidates_for("tell", 2)
    assert chat.choices[0].message.content in candidates_for("hey", 2)
    assert state.wait_settled(key_id, timeout=10)
    assert _spent(state.engine, key_id)["spent_epsilon"] == pytest.approx(1.5)


# ------------------------------------------------------------------------------------------------
# 6. Readiness
# ------------------------------------------------------------------------------------------------


class SlowWarmGenerator(RecordingGenerator):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def warm(self) -> None:
        assert self.release.wait(20)


def test_readyz_is_false_until_the_generator_is_warm(tmp_path, reward_model, caplog):
    gen = SlowWarmGenerator()
    app = create_app(_cfg(tmp_path, reward_model), generator=gen)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    with caplog.at_level("WARNING", logger="privalign.service"):
        t = state.start_warm_up()
        with serve_in_thread(app) as url:
            assert httpx.get(url + "/healthz").status_code == 200  # alive
            r = httpx.get(url + "/readyz")
            assert r.status_code == 503 and r.json() == {"ready": False, "reason": "loading the generator"}
            r = httpx.post(
                url + "/v1/completions",
                headers={"Authorization": f"Bearer {token}"},
                json={"prompt": "p", "privacy": {"epsilon": 0.5}},
            )
            assert (
                r.status_code == 503
                and "loading" in r.json()["error"]["message"]
                and r.headers["retry-after"] == "5"
            )
            _untouched(state, key_id)
            # /v1/select needs no generator: it serves while the generator loads.
            r = httpx.post(
                url + "/v1/select",
                headers={"Authorization": f"Bearer {token}"},
                json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.25}},
            )
            assert r.status_code == 200
            gen.release.set()
            t.join(10)
            ready = httpx.get(url + "/readyz").json()
            assert ready["ready"] is True and ready["load"]["saturated"] is False
            r = httpx.post(
                url + "/v1/completions",
                headers={"Authorization": f"Bearer {token}"},
                json={"prompt": "p", "privacy": {"epsilon": 0.25}},
            )
            assert r.status_code == 200
    assert any("loading the generator" in m for m in caplog.messages)


def test_an_unencodable_generated_candidate_is_a_generator_failure_not_a_charge(tmp_path, reward_model):
    """A generator (e.g. an upstream whose JSON carried an escaped lone surrogate) that returns text that
    cannot be encoded fails *before* scoring: the reservation is cancelled, nothing is charged."""

    def gen(prompt, n, **kw):
        return ["fine", "bad \ud800"] + ["x"] * (n - 2)

    app = create_app(_cfg(tmp_path, reward_model), generator=gen)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"prompt": "p", "privacy": {"epsilon": 0.5}},
        )
        assert r.status_code == 502 and "released" in r.json()["error"]["message"]
        assert metric(url, "privalign_scorer_calls_total") == 0
    assert [row["action"] for row in state.store.ledger_rows(key_id)] == ["cancel", "reserve"]
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] == 0.0 and t["reserved_epsilon"] == 0.0


def test_filter_charge_is_pure():
    """PrivacyFilter.charge computes the charge (realized ≤ reserved) without touching its store."""
    from privalign.accounting.filters import ExPostFilter, InMemoryBudgetStore
    from privalign.alignment import PrivBoN
    from privalign.errors import ReservationError

    store = InMemoryBudgetStore()
    flt = ExPostFilter(1.0, 1e-6, store=store)
    worst = PrivBoN(0.25, sensitivity=1.0, r_max=1.0, clip=True).worst_case_event(4)
    res = flt.reserve("u", worst)
    before = store.totals("u")
    assert flt.charge(res, worst) == (0.25, 0.0)
    assert store.totals("u") == before  # nothing written
    bigger = PrivBoN(0.5, sensitivity=1.0, r_max=1.0, clip=True).worst_case_event(4)
    with pytest.raises(ReservationError):
        flt.charge(res, bigger)
    flt.settle(res, worst)
    assert store.totals("u")[0] == (0.25, 0.0)
