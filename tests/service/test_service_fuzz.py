"""Fuzzing every endpoint from the published OpenAPI schema (schemathesis + Hypothesis, derandomized):
no 5xx, no stack trace, and no charge on any 4xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from test_service_http import PUBLIC_PATHS, _cfg

from privalign.service import db
from privalign.service.app import create_app
from privalign.service.keys import create_key


@pytest.mark.slow
def test_fuzz_every_endpoint_no_5xx_no_charge_on_4xx(tmp_path, reward_model, upstream):
    app = create_app(_cfg(tmp_path, reward_model, upstream, allowed_methods=["privbon", "privitp"]))
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1e6, budget_delta=0.5, accounting="ex-post")
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    ops = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in ops} == PUBLIC_PATHS
    seen: dict[str, set[int]] = {}

    def totals():
        with state.engine.connect() as conn:
            t = db.derive_totals(conn, key_id)
        return t["spent_epsilon"], t["reserved_epsilon"], t["spent_delta"], t["reserved_delta"]

    def make_runner(op):
        n = 30 if op.method.upper() == "POST" else 5

        @settings(max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case):
            assert state.wait_settled(timeout=10)  # earlier answers' deferred settles are not this case's charge
            before = totals()
            resp = case.call(headers={"Authorization": f"Bearer {token}"})
            seen.setdefault(f"{op.method.upper()} {op.path}", set()).add(resp.status_code)
            assert resp.status_code < 500, (case.body, resp.text)
            assert "Traceback" not in resp.text
            if 400 <= resp.status_code < 500:
                assert totals() == before, (case.body, resp.status_code, resp.text)

        return run

    for op in ops:
        make_runner(op)()
    # The fuzzer reached both the refusal paths and the charging path of each selecting endpoint.
    for path in ("POST /v1/select", "POST /v1/chat/completions", "POST /v1/completions"):
        assert any(400 <= c < 500 for c in seen[path]), seen
    print(seen)
