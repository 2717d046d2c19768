"""Fuzzing every endpoint from the published OpenAPI schema (schemathesis + Hypothesis, derandomized),
on SQLite and on PostgreSQL: no 5xx, no stack trace, and no charge on any 4xx. A second, Hypothesis-only
fuzzer sends hostile JSON (lone surrogates, bools and strings for numbers, extreme floats) to the
selecting endpoints, with and without an ``Idempotency-Key``."""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_service_http import PUBLIC_PATHS, _cfg

from privalign.service import db
from privalign.service.app import create_app
from privalign.service.keys import create_key


def _app(tmp_path, reward_model, upstream, backend, request):
    from dataclasses import replace

    cfg = _cfg(tmp_path, reward_model, upstream, allowed_methods=["privbon", "privitp"])
    if backend == "postgres":
        url, schema = request.getfixturevalue("pg_schema")
        cfg = replace(cfg, database=replace(cfg.database, url=url, schema=schema))
    return create_app(cfg)


BACKENDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_fuzz_every_endpoint_no_5xx_no_charge_on_4xx(tmp_path, reward_model, upstream, backend, request):
    app = _app(tmp_path, reward_model, upstream, backend, request)
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

        @settings(
            max_examples=n,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy())
        def run(case):
            assert state.wait_settled(
                timeout=10
            )  # earlier answers' deferred settles are not this case's charge
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


_HOSTILE_STR = st.sampled_from(
    [
        '"a kind reply"',
        '"\\ud800"',
        '"x\\udfffy"',
        '"\\ud83d\\ude00"',
        '""',
        "1",
        "true",
        "null",
        '["a"]',
        '{"a": 1}',
        '"' + "w" * 50 + '"',
    ]
)
_HOSTILE_NUM = st.sampled_from(
    [
        "true",
        "false",
        '"0.5"',
        "null",
        "0",
        "-1",
        "1e-16",
        "1e-309",
        "5e-324",
        "1e308",
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",  # valid JSON that parses as inf
        "-1e400",
        "0.1",
        "0.5",
        "2",
        "2.0",
        "1e6",
        "[]",
    ]
)


@st.composite
def _hostile_body(draw):
    path = draw(st.sampled_from(["/v1/select", "/v1/chat/completions", "/v1/completions"]))
    priv = {}
    for k in draw(
        st.lists(
            st.sampled_from(["method", "epsilon", "n", "beta", "sigma_x", "sigma_z", "seed", "typo"]),
            max_size=4,
            unique=True,
        )
    ):
        priv[k] = (
            draw(st.sampled_from(['"privbon"', '"privitp"', '"bon"', "1"]))
            if k == "method"
            else draw(_HOSTILE_NUM)
        )
    privacy = "{" + ", ".join(f'"{k}": {v}' for k, v in priv.items()) + "}"
    # Half the chat bodies are valid but for the fields the schema leaves unchecked, so that the hostile
    # values there reach the path past validation (the Idempotency-Key hash, the answer).
    valid_core = path == "/v1/chat/completions" and draw(st.booleans())
    if valid_core:
        privacy = '{"epsilon": 0.01}'
    if path == "/v1/select":
        cands = draw(st.lists(_HOSTILE_STR, min_size=0, max_size=5))
        body = f'{{"prompt": {draw(_HOSTILE_STR)}, "candidates": [{", ".join(cands)}], "privacy": {privacy}}}'
    elif path == "/v1/completions":
        body = f'{{"model": "m", "prompt": {draw(_HOSTILE_STR)}, "privacy": {privacy}}}'
    else:
        extra = draw(
            st.sampled_from(
                [
                    "",
                    ', "temperature": true',
                    ', "top_p": 1e308',
                    ', "max_tokens": 2.5',
                    ', "stream": true',
                    ', "n": 1',
                    ', "max_completion_tokens": 7',
                    ', "stop": null',
                    ', "temperature": NaN',
                    ', "stream": true, "stream_options": {"include_usage": true, "x": '
                    + draw(_HOSTILE_STR)
                    + "}",
                    ', "stream_options": ' + draw(_HOSTILE_STR),
                    ', "user": ' + draw(_HOSTILE_STR),
                ]
            )
        )
        # ChatMessage keeps unknown keys unchecked (a lone surrogate there was a 500 with an
        # Idempotency-Key)
        msg_extra = draw(
            st.sampled_from(
                ["", ', "x": ' + draw(_HOSTILE_STR), ', "x": {"y": [' + draw(_HOSTILE_STR) + "]}"]
            )
        )
        content = (
            '"hi"'
            if valid_core
            else draw(
                st.sampled_from(
                    [
                        draw(_HOSTILE_STR),
                        '[{"type": "text", "text": ' + draw(_HOSTILE_STR) + "}]",
                        '[{"type": "image_url", "image_url": {"url": "x"}}]',
                    ]
                )
            )
        )
        body = (
            f'{{"model": "m", "messages": [{{"role": "user", "content": {content}{msg_extra}}}], '
            f'"privacy": {privacy}{extra}}}'
        )
    return path, body, draw(st.booleans())


@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_json_never_5xx_and_refusals_never_charge(tmp_path, reward_model, upstream, backend, request):
    import httpx

    from conftest import serve_in_thread

    app = _app(tmp_path, reward_model, upstream, backend, request)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1e6, budget_delta=0.5, accounting="ex-post")
    seen: dict[int, int] = {}

    def totals():
        with state.engine.connect() as conn:
            return db.derive_totals(conn, key_id, units=True)

    with serve_in_thread(app) as url, httpx.Client(timeout=30) as client:

        @settings(
            max_examples=120,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=_hostile_body())
        def run(case):
            path, body, idempotent = case
            assert state.wait_settled(timeout=10)
            before = totals()
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            if idempotent:  # the idempotent path hashes the request: it must not fail on any body either
                headers["Idempotency-Key"] = uuid.uuid4().hex
            r = client.post(url + path, content=body.encode("ascii"), headers=headers)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code < 500, (body, r.status_code, r.text)
            assert "Traceback" not in r.text
            if r.status_code >= 400:
                assert totals() == before, (body, r.status_code, r.text)

        run()
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0, seen
    print(backend, seen)
