"""Issue 36, item 5: every error answer of the service has OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` with a non-null ``code`` that ``docs/service.md``
(*Errors*) documents: 400 (schema and parameter refusals), 401, 404, 405, 409, 413, 422, 429 (budget),
500 and 503, on SQLite and on PostgreSQL. The overload codes (429 rate, 503 overload, 408) are checked in
``test_service_fairness.py`` and ``test_service_connections.py``."""

from __future__ import annotations

import re
from dataclasses import replace

import httpx
import pytest
from test_service_http import _cfg

from conftest import ROOT, serve_in_thread
from privalign.service import db
from privalign.service.app import create_app
from privalign.service.keys import create_key, top_up

BACKENDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]


def _documented_codes() -> set[str]:
    """The codes in the first column of the ``code`` table in docs/service.md, *Errors*."""
    text = (ROOT / "docs" / "service.md").read_text()
    table = text[text.index("| `code` | status |") : text.index("### Idempotency-Key")]
    codes = set()
    for line in table.splitlines()[2:]:
        if line.startswith("|"):
            codes |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return codes


def _check(r: httpx.Response, status: int, code: str, documented: set[str]) -> dict:
    assert r.status_code == status, (status, r.status_code, r.text)
    err = r.json()["error"]
    assert list(err)[:4] == ["message", "type", "param", "code"], err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    assert err["code"] == code, (code, err)
    assert code in documented, f"code {code!r} is not documented in docs/service.md"
    return err


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_error_has_openai_shape_and_a_documented_code(tmp_path, reward_model, backend, request):
    cfg = _cfg(tmp_path, reward_model)
    if backend == "postgres":
        url, schema = request.getfixturevalue("pg_schema")
        cfg = replace(cfg, database=replace(cfg.database, url=url, schema=schema))
    app = create_app(cfg)  # no generator: the completion endpoints answer 503
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=0.5)
    docs = _documented_codes()
    auth = {"Authorization": f"Bearer {token}"}
    sel = {"prompt": "p", "candidates": ["x", "y"], "privacy": {"epsilon": 0.25}}
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        # 400: schema refusals (missing field, wrong type, unknown field, not JSON) and parameter refusals
        e = _check(
            c.post("/v1/select", headers=auth, json={"prompt": "p"}), 400, "missing_required_parameter", docs
        )
        assert e["param"] == "candidates" and e["type"] == "invalid_request_error"
        e = _check(
            c.post("/v1/select", headers=auth, json={**sel, "privacy": {"epsilon": True}}),
            400,
            "invalid_type",
            docs,
        )
        assert e["param"] == "privacy.epsilon"
        _check(c.post("/v1/select", headers=auth, json={**sel, "zzz": 1}), 400, "unknown_parameter", docs)
        r = c.post("/v1/select", headers={**auth, "Content-Type": "application/json"}, content=b"{nope")
        _check(r, 400, "invalid_json", docs)
        e = _check(
            c.post("/v1/select", headers=auth, json={**sel, "privacy": {"epsilon": 99.0}}),
            400,
            "invalid_value",
            docs,
        )
        assert e["param"] == "privacy.epsilon"
        chat = {"messages": [{"role": "user", "content": "hi"}], "privacy": {"epsilon": 0.25}}
        e = _check(
            c.post("/v1/chat/completions", headers=auth, json={**chat, "stop": "x"}),
            400,
            "unsupported_parameter",
            docs,
        )
        assert e["param"] == "stop"
        _check(
            c.post("/v1/chat/completions", headers=auth, json={**chat, "n": 2}),
            400,
            "unsupported_value",
            docs,
        )
        # 401, 404, 405, 413
        e = _check(c.post("/v1/select", json=sel), 401, "invalid_api_key", docs)
        assert e["type"] == "authentication_error"
        _check(c.get("/v1/budget", headers={"Authorization": "Bearer pa_x_y"}), 401, "invalid_api_key", docs)
        _check(c.get("/v1/nothing"), 404, "not_found", docs)
        _check(c.get("/v1/select"), 405, "method_not_allowed", docs)
        big = {**sel, "prompt": "p" * 30000}
        _check(c.post("/v1/select", headers=auth, json=big), 413, "request_too_large", docs)
        # 503: no generator configured (nothing charged)
        _check(c.post("/v1/chat/completions", headers=auth, json=chat), 503, "service_unavailable", docs)
        # 200 with a key, then 422 for another body under it
        h = {**auth, "Idempotency-Key": "k"}
        assert c.post("/v1/select", headers=h, json=sel).status_code == 200
        e = _check(
            c.post("/v1/select", headers=h, json={**sel, "prompt": "q"}), 422, "idempotency_key_reused", docs
        )
        assert e["param"] == "Idempotency-Key"
        # 409, both kinds: a pending attempt that may still run, and one that is over without an answer
        rid = c.post("/v1/select", headers=auth, json=sel).json()["privacy"]["reservation_id"]
        with state.engine.begin() as conn:
            conn.execute(db.idempotency.update().values(status="pending", reservation_id=rid, response=None))
        r = c.post("/v1/select", headers=h, json=sel)
        _check(r, 409, "idempotency_in_progress", docs)
        assert r.headers["x-should-retry"] == "true" and r.headers["retry-after"]
        with state.engine.begin() as conn:
            conn.execute(db.idempotency.update().values(created_at=db.idempotency.c.created_at - 3600.0))
        r = c.post("/v1/select", headers=h, json=sel)
        _check(r, 409, "idempotency_answer_lost", docs)
        assert r.headers["x-should-retry"] == "false"
        # 429: the budget (0.5) is spent
        assert state.wait_settled(timeout=10)
        r = c.post("/v1/select", headers=auth, json=sel)
        e = _check(r, 429, "budget_exhausted", docs)
        assert e["type"] == "budget_exhausted" and set(e["remaining"]) == {"epsilon", "delta"}
        assert r.headers["x-should-retry"] == "false"
        # 500: the reward model fails after the reservation (charged)
        top_up(state.engine, key_id, epsilon=1.0)

        def broken(prompt, candidates):
            raise RuntimeError("down")

        state.scorer = broken
        e = _check(c.post("/v1/select", headers=auth, json=sel), 500, "internal_error", docs)
        assert e["charged"] is True
