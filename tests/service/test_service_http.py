"""End-to-end HTTP tests of the service on SQLite: OpenAI client, refusals before scoring, idempotency,
tenancy, faults. The server is uvicorn on 127.0.0.1 in a thread; the reward model is the real linear
hashed-n-gram model; the generator is an OpenAI-compatible upstream on loopback."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest
from svc_components import candidates_for

from conftest import serve_in_thread, write_config
from privalign.service import db
from privalign.service.app import create_app
from privalign.service.config import load_config
from privalign.service.keys import create_key, revoke_key, top_up

PUBLIC_PATHS = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/select",
    "/v1/budget",
    "/v1/models",
    "/healthz",
    "/readyz",
    "/metrics",
}


def _cfg(tmp_path, reward_model, upstream=None, **privacy):
    sections = {
        "database": {"url": f"sqlite:///{tmp_path / 'svc.db'}"},
        "limits": {
            "max_n": 16,
            "max_text_chars": 2000,
            "max_body_bytes": 20000,
            "max_epsilon": 5.0,
            "request_timeout_s": 20.0,
        },
        "privacy": {
            "allowed_methods": ["privbon", "privitp"],
            "sensitivity": 1.0,
            "reward_max": 1.0,
            "default_epsilon": 0.5,
            "default_n": 4,
            "reconcile_after_s": 60.0,
            **privacy,
        },
        "reward_model": {"kind": "linear", "path": str(reward_model)},
    }
    sections["privacy"].setdefault(
        "privitp", {"beta": 0.5, "sigma_x": 4.0, "sigma_z": 2.0, "envelope_l": 3.0}
    )
    sections["generator"] = (
        {"kind": "upstream", "base_url": upstream, "model": "m", "timeout_s": 5.0}
        if upstream
        else {"kind": "none"}
    )
    itp = sections["privacy"].pop("privitp")
    path = write_config(tmp_path / "serve.toml", sections)
    path.write_text(
        path.read_text() + "\n[privacy.privitp]\n" + "\n".join(f"{k} = {v!r}" for k, v in itp.items()) + "\n"
    )
    return load_config(path)


def metric(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m:
            total += float(m.group(2))
    return total


def _keys_of(obj) -> set[str]:
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(k)
            out |= _keys_of(v)
    elif isinstance(obj, list):
        for v in obj:
            out |= _keys_of(v)
    return out


def _spent(engine, key_id):
    with engine.connect() as conn:
        return db.derive_totals(conn, key_id)


@pytest.fixture
def service(tmp_path, reward_model, upstream):
    cfg = _cfg(tmp_path, reward_model, upstream)
    app = create_app(cfg)
    with serve_in_thread(app) as url:
        yield url, app.state.service


def test_openai_client_end_to_end_sqlite(service):
    url, state = service
    key_id, token = create_key(state.engine, budget_epsilon=2.0, accounting="pure")
    client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    prompt = "Say something nice"
    chat = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": prompt}],
        extra_body={"privacy": {"method": "privbon", "epsilon": 0.5, "n": 4}},
    )
    assert chat.choices[0].message.content in candidates_for(prompt, 4)
    priv = chat.model_extra["privacy"]
    assert priv["method"] == "privbon" and priv["epsilon_charged"] == 0.5 and priv["epsilon_reserved"] == 0.5
    assert priv["remaining"]["epsilon"] == pytest.approx(1.5)
    comp = client.completions.create(
        model="m", prompt=prompt, extra_body={"privacy": {"epsilon": 0.5, "n": 3}}
    )
    assert comp.choices[0].text in candidates_for(prompt, 3)
    assert comp.model_extra["privacy"]["remaining"]["epsilon"] == pytest.approx(1.0)
    sel = httpx.post(
        url + "/v1/select",
        headers={"Authorization": f"Bearer {token}"},
        json={"prompt": "p", "candidates": ["a kind reply", "a rude reply"], "privacy": {"epsilon": 0.5}},
    )
    assert sel.status_code == 200 and sel.json()["text"] in ("a kind reply", "a rude reply")
    # Raw reward scores are never returned.
    for body in (chat.model_dump(), comp.model_dump(), sel.json()):
        assert not {"score", "scores", "reward", "rewards"} & _keys_of(body)
    calls = metric(url, "privalign_scorer_calls_total")
    assert calls == 3
    # 0.5 left: a request for 1.0 is refused with 429 naming the remaining budget, before any score.
    with pytest.raises(openai.RateLimitError) as ei:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": prompt}],
            extra_body={"privacy": {"epsilon": 1.0}},
        )
    err = ei.value.body
    assert err["type"] == "budget_exhausted" and err["remaining"]["epsilon"] == pytest.approx(0.5)
    assert metric(url, "privalign_scorer_calls_total") == calls
    assert metric(url, "privalign_refusals_total") == 1
    assert state.wait_settled(key_id, timeout=10)  # GET /v1/budget never waits for this process's settles
    b = httpx.get(url + "/v1/budget", headers={"Authorization": f"Bearer {token}"}).json()
    assert b["spent"]["epsilon"] == pytest.approx(1.5) and b["remaining"]["epsilon"] == pytest.approx(0.5)
    assert b["limit"] == {"epsilon": 2.0, "delta": 0.0} and b["pending_settles"] == 0
    assert [r["action"] for r in b["ledger"]].count("settle") == 3
    assert _spent(state.engine, key_id)["spent_epsilon"] == pytest.approx(1.5)
    # Top-up restores service.
    top_up(state.engine, key_id, epsilon=1.0)
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], extra_body={"privacy": {"epsilon": 1.0}}
    )


def test_idempotency_key_returns_stored_answer_without_charging_twice(service):
    url, state = service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    h = {"Authorization": f"Bearer {token}", "Idempotency-Key": "req-1"}
    body = {"prompt": "p", "candidates": ["x", "y", "z"], "privacy": {"epsilon": 0.4}}
    r1 = httpx.post(url + "/v1/select", headers=h, json=body)
    r2 = httpx.post(url + "/v1/select", headers=h, json=body)
    assert r1.status_code == r2.status_code == 200
    assert r1.json() == r2.json() and r2.headers.get("idempotent-replayed") == "true"
    assert _spent(state.engine, key_id)["spent_epsilon"] == pytest.approx(0.4)
    assert metric(url, "privalign_scorer_calls_total") == 1
    r3 = httpx.post(url + "/v1/select", headers=h, json={**body, "candidates": ["x", "y"]})
    assert r3.status_code == 422
    # A refused request does not poison its key: after a top-up the same key can be used.
    h2 = {**h, "Idempotency-Key": "req-2"}
    assert (
        httpx.post(url + "/v1/select", headers=h2, json={**body, "privacy": {"epsilon": 0.9}}).status_code
        == 429
    )
    top_up(state.engine, key_id, epsilon=1.0)
    assert (
        httpx.post(url + "/v1/select", headers=h2, json={**body, "privacy": {"epsilon": 0.9}}).status_code
        == 200
    )


def test_tenancy_keys_cannot_read_or_spend_each_other(service):
    url, state = service
    a_id, a_tok = create_key(state.engine, budget_epsilon=1.0, name="a")
    b_id, b_tok = create_key(state.engine, budget_epsilon=1.0, name="b")
    body = {"prompt": "p", "candidates": ["x", "y"], "privacy": {"epsilon": 1.0}}
    assert (
        httpx.post(url + "/v1/select", headers={"Authorization": f"Bearer {a_tok}"}, json=body).status_code
        == 200
    )
    assert (
        httpx.post(url + "/v1/select", headers={"Authorization": f"Bearer {a_tok}"}, json=body).status_code
        == 429
    )
    # B is untouched and sees only its own ledger.
    bb = httpx.get(url + "/v1/budget", headers={"Authorization": f"Bearer {b_tok}"}).json()
    assert bb["key_id"] == b_id and bb["ledger"] == [] and bb["remaining"]["epsilon"] == 1.0
    # A forged token (B's id with A's secret) is refused; so are unknown and missing keys.
    forged = f"pa_{b_id}_{a_tok.split('_', 2)[2]}"
    for tok in (forged, "pa_0000000000000000_x", "garbage"):
        r = httpx.post(url + "/v1/select", headers={"Authorization": f"Bearer {tok}"}, json=body)
        assert r.status_code == 401
        assert httpx.get(url + "/v1/budget", headers={"Authorization": f"Bearer {tok}"}).status_code == 401
    assert httpx.get(url + "/v1/budget").status_code == 401
    assert _spent(state.engine, b_id)["spent_epsilon"] == 0.0
    revoke_key(state.engine, b_id)
    assert (
        httpx.post(url + "/v1/select", headers={"Authorization": f"Bearer {b_tok}"}, json=body).status_code
        == 401
    )


def test_invalid_requests_are_refused_before_any_charge(service):
    url, state = service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    h = {"Authorization": f"Bearer {token}"}
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ("/v1/chat/completions", {"model": "m", "messages": msgs, "seed": 3}, 400, "seed"),
        ("/v1/chat/completions", {"model": "m", "messages": msgs, "privacy": {"seed": 3}}, 400, "seed"),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": msgs, "privacy": {"epsilon": 0.5, "n": 17}},
            400,
            "privacy.n",
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": msgs, "privacy": {"epsilon": 6.0}},
            400,
            "privacy.epsilon",
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": msgs, "privacy": {"method": "bon"}},
            400,
            "privacy.method",
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": msgs, "privacy": {"epsilon": -1}},
            400,
            "privacy.epsilon",
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": msgs, "privacy": {"typo": 1}},
            400,
            "privacy.typo",
        ),
        ("/v1/chat/completions", {"model": "m", "messages": msgs, "stop": ["x"]}, 400, "stop"),
        ("/v1/chat/completions", {"model": "m", "messages": msgs, "n": 2}, 400, "'n'"),
        ("/v1/completions", {"model": "m", "prompt": "x" * 2001}, 400, "prompt"),
        ("/v1/select", {"prompt": "p", "candidates": ["y"] * 17}, 400, "candidates"),
        ("/v1/select", {"prompt": "p", "candidates": []}, 400, "candidates"),
        (
            "/v1/select",
            {"prompt": "p", "candidates": ["a", "b"], "privacy": {"method": "privitp"}},
            400,
            "candidates",
        ),
        ("/v1/select", {"prompt": "p", "candidates": ["z" * 1999] * 11}, 413, "bytes"),
    ]
    for path, body, status, needle in cases:
        r = httpx.post(url + path, headers=h, json=body)
        assert r.status_code == status, (path, body, r.text)
        assert needle in r.json()["error"]["message"] or needle == r.json()["error"].get("param"), r.text
        assert "Traceback" not in r.text
    r = httpx.post(
        url + "/v1/select", headers={**h, "Content-Type": "application/json"}, content=b"{not json"
    )
    assert r.status_code == 400
    assert metric(url, "privalign_scorer_calls_total") == 0
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] == 0.0 and t["reserved_epsilon"] == 0.0


def test_admin_actions_are_not_reachable_over_http(service):
    url, _ = service
    spec = httpx.get(url + "/openapi.json").json()
    assert set(spec["paths"]) == PUBLIC_PATHS
    for path in ("/v1/keys", "/keys", "/admin", "/v1/keys/create", "/v1/admin/top-up", "/v1/budget/top-up"):
        for method in ("GET", "POST", "PUT", "DELETE"):
            assert httpx.request(method, url + path, json={"budget_epsilon": 100}).status_code in (404, 405)
    assert (
        httpx.request(
            "OPTIONS",
            url + "/v1/select",
            headers={"Origin": "http://evil", "Access-Control-Request-Method": "POST"},
        ).headers.get("access-control-allow-origin")
        is None
    )


def test_upstream_failure_releases_the_reservation(tmp_path, reward_model, failing_upstream):
    app = create_app(_cfg(tmp_path, reward_model, failing_upstream))
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
    rows = state.store.ledger_rows(key_id)
    assert [r["action"] for r in rows] == ["cancel", "reserve"]
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] == 0.0 and t["reserved_epsilon"] == 0.0


def test_scorer_failure_keeps_the_charge_and_hides_the_trace(tmp_path, reward_model):
    def broken(prompt, texts):
        raise RuntimeError("secret model internals /path/to/weights")

    app = create_app(_cfg(tmp_path, reward_model), scorer=broken)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/select",
            headers={"Authorization": f"Bearer {token}"},
            json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.25}},
        )
    assert r.status_code == 500 and "secret" not in r.text and "Traceback" not in r.text
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] + t["reserved_epsilon"] == pytest.approx(0.25)  # fail closed
    assert state.store.reconcile_stale(older_than_s=0.0) and _spent(state.engine, key_id)[
        "spent_epsilon"
    ] == pytest.approx(0.25)


def test_database_unavailable_answers_503_without_selecting(tmp_path, reward_model):
    calls = []

    def counting(prompt, texts):
        calls.append(1)
        return [0.5] * len(texts)

    app = create_app(_cfg(tmp_path, reward_model), scorer=counting)
    state = app.state.service
    _, token = create_key(state.engine, budget_epsilon=1.0)
    dead = db.make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # nothing listens on port 1
    state.engine, state.store.engine = dead, dead
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/select",
            headers={"Authorization": f"Bearer {token}"},
            json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.5}},
        )
        assert r.status_code == 503 and "unavailable" in r.json()["error"]["message"]
        assert httpx.get(url + "/healthz").status_code == 503
    assert calls == []


def test_zcdp_and_ex_post_accounting(tmp_path, reward_model):
    app = create_app(_cfg(tmp_path, reward_model))
    state = app.state.service
    z_id, z_tok = create_key(state.engine, budget_epsilon=5.0, budget_delta=1e-6, accounting="zcdp")
    x_id, x_tok = create_key(state.engine, budget_epsilon=5.0, budget_delta=1e-5, accounting="ex-post")
    p_id, p_tok = create_key(state.engine, budget_epsilon=5.0, accounting="pure")
    cands = [f"c{i} kind" for i in range(9)]
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/select",
            headers={"Authorization": f"Bearer {z_tok}"},
            json={"prompt": "p", "candidates": cands[:4], "privacy": {"epsilon": 1.0}},
        )
        assert r.status_code == 200, r.text
        pz = r.json()["privacy"]
        assert pz["charge_unit"] == "rho" and pz["charged"] == pytest.approx(1.0 / 8)  # ε²/8-zCDP
        body = {"prompt": "p", "candidates": cands, "privacy": {"method": "privitp", "epsilon": 2.0}}
        r = httpx.post(url + "/v1/select", headers={"Authorization": f"Bearer {x_tok}"}, json=body)
        assert r.status_code == 200, r.text
        px = r.json()["privacy"]
        assert 0 < px["epsilon_charged"] <= px["epsilon_reserved"] and px["delta"] > 0
        # remaining: the limit less the realized charge (not the larger reservation); δ is charged as
        # reserved.
        assert px["charged"] < px["reserved"] and px["remaining"]["epsilon"] == pytest.approx(
            5.0 - px["charged"]
        )
        assert px["remaining"]["delta"] == pytest.approx(1e-5 - px["delta"])
        # privacy.epsilon caps the worst case: ε_max(n=4) ≈ 1.95 > 1.5 is refused before anything runs.
        r = httpx.post(
            url + "/v1/select",
            headers={"Authorization": f"Bearer {x_tok}"},
            json={**body, "privacy": {"method": "privitp", "epsilon": 1.5}},
        )
        assert r.status_code == 400 and "exceeds" in r.json()["error"]["message"]
        # PrivITP is (ε, δ)-ex-post: a pure-DP key cannot pay for it.
        r = httpx.post(url + "/v1/select", headers={"Authorization": f"Bearer {p_tok}"}, json=body)
        assert r.status_code == 400 and "not supported" in r.json()["error"]["message"]
    assert state.wait_settled(timeout=10)
    assert _spent(state.engine, p_id)["reserved_epsilon"] == 0.0
    t = _spent(state.engine, x_id)
    assert t["spent_epsilon"] == pytest.approx(px["charged"]) and t["reserved_epsilon"] == 0.0


def test_non_private_bon_requires_explicit_opt_in(tmp_path, reward_model):
    from privalign.errors import PrivacyParameterError

    with pytest.raises(PrivacyParameterError, match="allow_non_private"):
        _cfg(tmp_path, reward_model, allowed_methods=["privbon", "bon"])
    app = create_app(_cfg(tmp_path, reward_model, allowed_methods=["privbon", "bon"], allow_non_private=True))
    key_id, token = create_key(app.state.service.engine, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/select",
            headers={"Authorization": f"Bearer {token}"},
            json={
                "prompt": "p",
                "candidates": ["a rude reply", "a kind helpful reply"],
                "privacy": {"method": "bon"},
            },
        )
    assert r.status_code == 200 and r.json()["text"] == "a kind helpful reply"
    assert r.json()["privacy"]["private"] is False and r.json()["privacy"]["guarantee"] == "none"
    assert (
        _spent(app.state.service.engine, key_id)["reserved_epsilon"] == 0.0
        and app.state.service.store.ledger_rows(key_id) == []
    )


def test_generator_timeout_releases_the_reservation(tmp_path, reward_model):
    import threading

    release = threading.Event()

    def slow_generator(prompt, n, **kwargs):
        release.wait(10)
        return ["x"] * n

    cfg = _cfg(tmp_path, reward_model)
    from dataclasses import replace

    cfg = replace(cfg, limits=replace(cfg.limits, request_timeout_s=0.5))
    app = create_app(cfg, generator=slow_generator)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"prompt": "p", "privacy": {"epsilon": 0.5}},
            timeout=30,
        )
        release.set()
        assert r.status_code == 504 and "released" in r.json()["error"]["message"]
        assert metric(url, "privalign_scorer_calls_total") == 0
    assert [row["action"] for row in state.store.ledger_rows(key_id)] == ["cancel", "reserve"]
    assert _spent(state.engine, key_id)["spent_epsilon"] == 0.0


@pytest.mark.model
@pytest.mark.parametrize("kind", ["transformers", "ctranslate2"])
def test_chat_completion_with_the_local_generator(tmp_path, reward_model, kind):
    """The default generator (SmolLM2-135M, offline GGUF, through transformers) and its CTranslate2 int8
    twin: loaded lazily, 2 candidates of 2 tokens, charged once."""
    cfg = _cfg(tmp_path, reward_model)
    from dataclasses import replace

    from privalign.service.config import ComponentConfig

    cfg = replace(
        cfg,
        generator=ComponentConfig(kind=kind, options={"max_new_tokens": 2}),
        limits=replace(cfg.limits, request_timeout_s=600.0),
    )  # the first request loads the model
    app = create_app(cfg)
    key_id, token = create_key(app.state.service.engine, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=300)
        r = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=2,
            extra_body={"privacy": {"epsilon": 0.5, "n": 2}},
        )
    assert (
        isinstance(r.choices[0].message.content, str) and r.model_extra["privacy"]["epsilon_charged"] == 0.5
    )
    assert _spent(app.state.service.engine, key_id)["spent_epsilon"] == 0.5
    assert app.state.service.generator.backend == kind


def test_pad_selection_s_pads_scoring_and_selection_to_a_minimum(tmp_path, reward_model):
    """With privacy.pad_selection_s = P, the time from the start of scoring to the answer is at least P;
    the pad is a minimum, not added on top of a private part that already takes longer than P."""
    from privalign.service.components import LinearHashedScorer

    inner = LinearHashedScorer(reward_model)
    starts: list[float] = []
    sleep_s = {"v": 0.0}

    def timed(prompt, texts):
        starts.append(time.monotonic())
        time.sleep(sleep_s["v"])
        return inner(prompt, texts)

    pad = 0.5
    app = create_app(_cfg(tmp_path, reward_model, pad_selection_s=pad), scorer=timed)
    _, token = create_key(app.state.service.engine, budget_epsilon=10.0)
    body = {
        "prompt": "p",
        "candidates": ["a kind reply", "a rude reply", "plain"],
        "privacy": {"epsilon": 0.5},
    }
    with serve_in_thread(app) as url:
        for _ in range(3):
            r = httpx.post(
                url + "/v1/select", headers={"Authorization": f"Bearer {token}"}, json=body, timeout=30
            )
            done = time.monotonic()
            assert r.status_code == 200, r.text
            assert done - starts[-1] >= pad  # unpadded, scoring 3 candidates + selection takes milliseconds
        sleep_s["v"] = 0.8  # the private part alone takes longer than the pad
        r = httpx.post(
            url + "/v1/select", headers={"Authorization": f"Bearer {token}"}, json=body, timeout=30
        )
        done = time.monotonic()
        assert r.status_code == 200, r.text
        assert 0.8 <= done - starts[-1] < 0.8 + pad  # not 0.8 + pad: the pad only tops up to P


def test_key_cache_saves_the_auth_read_but_never_outlives_revocation_or_a_top_up(tmp_path, reward_model):
    """After one database authentication a key's served requests skip the key read (the reservation checks
    the key is active); a revoked key, a wrong secret, an exhausted or a topped-up budget still get
    exactly the answers they got without the cache, and nothing is charged for the refusals."""
    calls = []

    def counting(prompt, texts):
        calls.append(1)
        return [0.5] * len(texts)

    app = create_app(_cfg(tmp_path, reward_model), scorer=counting)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    reads = []
    query_one = state.store.query_one
    state.store.query_one = lambda sql, params: reads.append(params) or query_one(sql, params)
    body = {"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.25}}
    h = {"Authorization": f"Bearer {token}"}
    with serve_in_thread(app) as url:
        assert httpx.post(url + "/v1/select", headers=h, json=body).status_code == 200
        assert len(reads) == 1  # first request: authenticated from the database
        assert httpx.post(url + "/v1/select", headers=h, json=body).status_code == 200
        assert len(reads) == 1  # second: from the key cache, no key read
        # A wrong secret for the cached key id: 401, whatever the cache holds.
        bad = {"Authorization": f"Bearer pa_{key_id}_{'x' * 43}"}
        assert httpx.post(url + "/v1/select", headers=bad, json=body).status_code == 401
        # Exhausted (0.5 left, 0.75 asked): the same 429 naming the remaining budget, before any score.
        r = httpx.post(url + "/v1/select", headers=h, json={**body, "privacy": {"epsilon": 0.75}})
        assert r.status_code == 429 and r.json()["error"]["remaining"]["epsilon"] == pytest.approx(0.5)
        # A top-up made by the admin CLI is honoured at once (the cached limit is stale).
        top_up(state.engine, key_id, epsilon=1.0)
        r = httpx.post(url + "/v1/select", headers=h, json={**body, "privacy": {"epsilon": 0.75}})
        assert r.status_code == 200 and r.json()["privacy"]["remaining"]["epsilon"] == pytest.approx(0.75)
        # Metrics count the cached path like the other: 0.25 + 0.25 + 0.75 reserved and charged.
        assert metric(url, "privalign_epsilon_reserved_total") == pytest.approx(1.25)
        assert metric(url, "privalign_epsilon_charged_total") == pytest.approx(1.25)
        n_calls = len(calls)
        revoke_key(state.engine, key_id)
        for _ in range(2):
            assert httpx.post(url + "/v1/select", headers=h, json=body).status_code == 401
        assert len(calls) == n_calls == 3  # the refusals never reached the reward model
    assert state.wait_settled(key_id, timeout=10)
    rows = state.store.ledger_rows(key_id)
    assert [r["action"] for r in rows].count("reserve") == 3 and [r["action"] for r in rows].count(
        "settle"
    ) == 3
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] == pytest.approx(1.25) and t["reserved_epsilon"] == 0.0


def test_key_cache_is_bounded_checks_the_secret_and_forgets_revoked_keys(tmp_path):
    from privalign.service.keys import KeyCache, authenticate
    from privalign.service.store import SQLBudgetStore

    eng = db.make_engine(f"sqlite:///{tmp_path / 'k.db'}")
    db.create_schema(eng)
    store, cache = SQLBudgetStore(eng), KeyCache(max_keys=2)
    toks = [create_key(eng, budget_epsilon=1.0)[1] for _ in range(3)]
    for t in toks:
        assert authenticate(store, t, cache=cache) is not None
    assert cache.verify(toks[0]) is None  # bounded: the first remembered key was forgotten
    assert cache.verify(toks[1]) is not None and cache.verify(toks[2]) is not None
    kid = toks[2].split("_", 2)[1]
    assert cache.verify(f"pa_{kid}_wrong-secret") is None
    assert authenticate(store, f"pa_{kid}_wrong-secret", cache=cache) is None
    assert (
        cache.verify(toks[2]) is not None
    )  # a wrong secret does not evict the key (no cheap eviction by others)
    revoke_key(eng, kid)
    assert (
        cache.verify(toks[2]) is not None
    )  # the cache alone knows nothing of revocation (the reserve checks it) ...
    assert (
        authenticate(store, toks[2], cache=cache) is None and cache.verify(toks[2]) is None
    )  # ... the database does


def test_settle_is_written_after_the_answer_and_remaining_is_as_of_the_reservation(tmp_path, reward_model):
    """Without an Idempotency-Key the settle is written after the response has been sent: the answer does
    not wait for it, its ``remaining`` is computed from the reservation's totals, the reservation stays
    charged at its reserved cost until the settle commits, and GET /v1/budget answers at once (pending
    settles counted at their reserved cost). With an Idempotency-Key the settle is written before the
    answer."""
    import threading

    app = create_app(_cfg(tmp_path, reward_model))
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)
    gate, settled = threading.Event(), []
    settle = state.store.settle

    def gated_settle(rid, cost=None, *, event=None, units=None):
        assert gate.wait(15), "settle gate never opened"
        settle(rid, cost, event=event, units=units)
        settled.append(rid)

    state.store.settle = gated_settle
    h = {"Authorization": f"Bearer {token}"}
    body = {
        "prompt": "p",
        "candidates": ["a kind reply", "a rude reply", "plain"],
        "privacy": {"epsilon": 0.25},
    }
    with serve_in_thread(app) as url:
        # Gate closed: a settle written before the answer would block the request past its 5 s timeout.
        r1 = httpx.post(url + "/v1/select", headers=h, json=body, timeout=5)
        r2 = httpx.post(url + "/v1/select", headers=h, json=body, timeout=5)  # the first is still unsettled
        assert r1.status_code == r2.status_code == 200, (r1.text, r2.text)
        p1, p2 = r1.json()["privacy"], r2.json()["privacy"]
        assert p1["charged"] == p1["reserved"] == 0.25 and p1["remaining"]["epsilon"] == pytest.approx(0.75)
        assert p2["remaining"]["epsilon"] == pytest.approx(0.5)  # the first request's open reservation counts
        assert settled == []
        t = _spent(state.engine, key_id)  # charged at the reserved cost while the settles are pending
        assert t["spent_epsilon"] == 0.0 and t["reserved_epsilon"] == pytest.approx(0.5)
        assert [row["action"] for row in state.store.ledger_rows(key_id)] == ["reserve", "reserve"]
        assert metric(url, "privalign_epsilon_charged_total") == pytest.approx(0.5)
        # A request that does not fit while they are pending is refused: nothing is ever overspent.
        r = httpx.post(url + "/v1/select", headers=h, json={**body, "privacy": {"epsilon": 0.75}}, timeout=5)
        assert r.status_code == 429 and r.json()["error"]["remaining"]["epsilon"] == pytest.approx(0.5)
        # GET /v1/budget never waits: the pending settles count at their reserved cost, and it says so.
        t0 = time.monotonic()
        got = httpx.get(url + "/v1/budget", headers=h, timeout=2).json()
        assert time.monotonic() - t0 < 1.5
        assert got["spent"]["epsilon"] == 0.0 and got["reserved"]["epsilon"] == pytest.approx(0.5)
        assert got["remaining"]["epsilon"] == pytest.approx(0.5) and got["pending_settles"] == 2
        gate.set()
        assert state.wait_settled(key_id, timeout=15)
        got = httpx.get(url + "/v1/budget", headers=h, timeout=2).json()
        assert (
            got["spent"]["epsilon"] == pytest.approx(0.5)
            and got["reserved"]["epsilon"] == 0.0
            and got["pending_settles"] == 0
        )
        assert sorted(settled) == sorted([p1["reservation_id"], p2["reservation_id"]])
        # With an Idempotency-Key the settle is written before the answer is stored and sent.
        gate.clear()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/select", headers={**h, "Idempotency-Key": "i1"}, json=body, timeout=1)
        gate.set()
        deadline = time.time() + 10
        while True:  # the first attempt finishes once its settle is written; until then a retry gets 409
            r = httpx.post(url + "/v1/select", headers={**h, "Idempotency-Key": "i1"}, json=body, timeout=5)
            if r.status_code != 409 or time.time() > deadline:
                break
            time.sleep(0.05)
        assert r.status_code == 200 and r.headers.get("idempotent-replayed") == "true"
        assert len(settled) == 3
        assert r.json()["privacy"]["remaining"]["epsilon"] == pytest.approx(0.25)
    rows = state.store.ledger_rows(key_id)
    assert [row["action"] for row in rows].count("settle") == 3 and [row["action"] for row in rows].count(
        "reserve"
    ) == 3
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] == pytest.approx(0.75) and t["reserved_epsilon"] == 0.0
    assert state.store.snapshot(key_id)["spent_epsilon"] == pytest.approx(0.75)


def test_a_failed_deferred_settle_leaves_the_reserved_cost_charged(tmp_path, reward_model):
    """A settle that fails after the answer was sent (database error) is counted and leaves the
    reservation open at its reserved cost; reconciliation then charges that cost (fail closed)."""
    app = create_app(_cfg(tmp_path, reward_model))
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1.0)

    def broken_settle(rid, cost=None, *, event=None, units=None):
        raise RuntimeError("database gone")

    state.store.settle = broken_settle
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/select",
            headers={"Authorization": f"Bearer {token}"},
            json={"prompt": "p", "candidates": ["a", "b"], "privacy": {"epsilon": 0.25}},
            timeout=5,
        )
        assert r.status_code == 200 and r.json()["privacy"]["charged"] == 0.25
        assert state.wait_settled(key_id, timeout=10)
        assert metric(url, "privalign_settle_failures_total") == 1
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] == 0.0 and t["reserved_epsilon"] == pytest.approx(0.25)
    assert state.store.reconcile_stale(older_than_s=0.0) == [r.json()["privacy"]["reservation_id"]]
    t = _spent(state.engine, key_id)
    assert t["spent_epsilon"] == pytest.approx(0.25) and t["reserved_epsilon"] == 0.0
