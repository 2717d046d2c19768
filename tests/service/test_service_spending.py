"""No silent spending and limits that mean what they say: a request that does not
state ``privacy.epsilon`` is refused (or, where the operator allows it, spends a default that the answer
and ``GET /v1/budget`` show); ``limits.max_n`` caps the candidates of every method, PrivITP's ``2n + 1``
included; ``limits.max_text_chars`` bounds generated candidates; ``serve --check`` and ``serve`` fail with
one line on a port they cannot listen on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest
from svc_components import candidates_for
from test_service_http import _cfg, metric

from conftest import HERE, ROOT, serve_in_thread
from privalign.errors import PrivacyParameterError
from privalign.service import db
from privalign.service.app import create_app
from privalign.service.config import config_from_dict
from privalign.service.keys import create_key


def _units(state, key_id):
    with state.engine.connect() as conn:
        t = db.derive_totals(conn, key_id, units=True)
    return t["spent_epsilon"], t["reserved_epsilon"]


# ------------------------------------------------------------------------------------------------
# Item 5: no silent spending
# ------------------------------------------------------------------------------------------------


def test_a_request_without_privacy_epsilon_is_refused_by_default(tmp_path, reward_model, upstream):
    app = create_app(_cfg(tmp_path, reward_model, upstream))
    state = app.state.service
    assert state.cfg.privacy.require_privacy is True  # the default
    key_id, token = create_key(state.engine, budget_epsilon=2.0)
    h = {"Authorization": f"Bearer {token}"}
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ("/v1/chat/completions", {"model": "m", "messages": msgs}, "privacy"),
        ("/v1/chat/completions", {"model": "m", "messages": msgs, "privacy": {"n": 2}}, "privacy.epsilon"),
        ("/v1/completions", {"model": "m", "prompt": "hi", "privacy": {}}, "privacy.epsilon"),
        ("/v1/select", {"prompt": "p", "candidates": ["a", "b"]}, "privacy"),
        (
            "/v1/select",
            {"prompt": "p", "candidates": ["a", "b"], "privacy": {"method": "privbon"}},
            "privacy.epsilon",
        ),
    ]
    with serve_in_thread(app) as url:
        for path, body, param in cases:
            r = httpx.post(url + path, headers=h, json=body)
            assert r.status_code == 400, (path, body, r.text)
            err = r.json()["error"]
            assert err["param"] == param and f"'{param}' parameter is required" in err["message"], err
            assert '"epsilon": 0.5' in err["message"] and "Nothing was charged" in err["message"]
        assert _units(state, key_id) == (0, 0)
        assert metric(url, "privalign_scorer_calls_total") == 0
        # With epsilon stated, n and method may still come from the server; the answer says which did.
        r = httpx.post(
            url + "/v1/completions",
            headers=h,
            json={"model": "m", "prompt": "hi", "privacy": {"epsilon": 0.5}},
        )
        assert r.status_code == 200, r.text
        priv = r.json()["privacy"]
        assert priv["defaulted"] == ["method", "n"] and priv["n"] == 4 and priv["epsilon_charged"] == 0.5
        b = httpx.get(url + "/v1/budget", headers=h).json()
        assert b["request_defaults"] == {
            "require_privacy": True,
            "method": "privbon",
            "epsilon": None,
            "n": 4,
        }


def test_the_operator_may_allow_a_default_and_it_is_shown(tmp_path, reward_model, upstream):
    cfg = _cfg(tmp_path, reward_model, upstream, require_privacy=False)
    app = create_app(cfg)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=2.0)
    h = {"Authorization": f"Bearer {token}"}
    with serve_in_thread(app) as url:
        b = httpx.get(url + "/v1/budget", headers=h).json()
        assert b["request_defaults"] == {
            "require_privacy": False,
            "method": "privbon",
            "epsilon": 0.5,
            "n": 4,
        }
        r = httpx.post(
            url + "/v1/chat/completions",
            headers=h,
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200, r.text
        priv = r.json()["privacy"]
        assert priv["defaulted"] == ["method", "epsilon", "n"] and priv["epsilon_charged"] == 0.5
        r = httpx.post(
            url + "/v1/select",
            headers=h,
            json={"prompt": "p", "candidates": ["a", "b", "c"], "privacy": {"epsilon": 0.25}},
        )
        assert r.json()["privacy"]["defaulted"] == ["method"]  # n is the candidates' count, not a default
        assert state.wait_settled(timeout=10)
        assert _units(state, key_id) == (750_000_000, 0)


def test_require_privacy_must_be_a_bool():
    with pytest.raises(
        PrivacyParameterError, match=r"'privacy.require_privacy' parameter must be true or false"
    ):
        config_from_dict({"privacy": {"require_privacy": "yes"}, "generator": {"kind": "none"}})


# ------------------------------------------------------------------------------------------------
# Item 6: limits that mean what they say
# ------------------------------------------------------------------------------------------------


class _CountingGenerator:
    def __init__(self, length: int = 0) -> None:
        self.calls, self.length = [], length

    def __call__(self, prompt, n, **kw):
        self.calls.append(n)
        if self.length:
            return [f"{i} " + "w" * self.length for i in range(n)]
        return candidates_for(prompt if isinstance(prompt, str) else "x", n)


def test_max_n_caps_privitp_candidates_before_anything_is_generated_or_reserved(tmp_path, reward_model):
    # _cfg: limits.max_n = 16; privitp at n = 8 would generate 2n + 1 = 17 candidates.
    gen = _CountingGenerator()
    app = create_app(_cfg(tmp_path, reward_model, None), generator=gen)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=1e3, budget_delta=0.5, accounting="ex-post")
    h = {"Authorization": f"Bearer {token}"}
    priv = {"method": "privitp", "epsilon": 5.0}
    with serve_in_thread(app) as url:
        for path, body in (
            ("/v1/completions", {"model": "m", "prompt": "hi", "privacy": {**priv, "n": 8}}),
            (
                "/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": "hi"}], "privacy": {**priv, "n": 8}},
            ),
        ):
            r = httpx.post(url + path, headers=h, json=body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "privacy.n", err
            for part in ("privacy.n' parameter 8", "2n + 1 = 17", "limits.max_n = 16", "n ≤ 7"):
                assert part in err["message"], (part, err["message"])
        assert gen.calls == [] and _units(state, key_id) == (0, 0)
        # n = 7 → 15 candidates: served, and exactly 15 were generated.
        r = httpx.post(
            url + "/v1/completions",
            headers=h,
            json={"model": "m", "prompt": "hi", "privacy": {**priv, "n": 7}},
        )
        assert r.status_code == 200, r.text
        assert gen.calls == [15] and r.json()["privacy"]["n"] == 15


def test_default_n_must_fit_max_n_for_every_allowed_method():
    with pytest.raises(
        PrivacyParameterError, match=r"'privacy.default_n' parameter 8 makes privitp .* use 17"
    ):
        config_from_dict(
            {
                "limits": {"max_n": 16},
                "privacy": {"default_n": 8, "allowed_methods": ["privbon", "privitp"]},
                "generator": {"kind": "none"},
            }
        )
    config_from_dict({"limits": {"max_n": 16}, "privacy": {"default_n": 8}, "generator": {"kind": "none"}})


def test_a_generated_candidate_longer_than_max_text_chars_is_a_generator_failure(tmp_path, reward_model):
    # _cfg: limits.max_text_chars = 2000
    gen = _CountingGenerator(length=2500)
    app = create_app(_cfg(tmp_path, reward_model, None), generator=gen)
    state = app.state.service
    key_id, token = create_key(state.engine, budget_epsilon=2.0)
    h = {"Authorization": f"Bearer {token}"}
    body = {"model": "m", "prompt": "hi", "privacy": {"epsilon": 0.5, "n": 2}}
    with serve_in_thread(app) as url:
        r = httpx.post(url + "/v1/completions", headers=h, json=body)
        assert r.status_code == 502 and "released" in r.json()["error"]["message"], r.text
        assert metric(url, "privalign_scorer_calls_total") == 0
        assert state.wait_settled(timeout=10)
        assert _units(state, key_id) == (0, 0)
        gen.length = 1900
        assert httpx.post(url + "/v1/completions", headers=h, json=body).status_code == 200


# ------------------------------------------------------------------------------------------------
# Item 7: start-up checks
# ------------------------------------------------------------------------------------------------


def _serve(tmp_path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(HERE), env.get("PYTHONPATH", "")])
    env["PRIVALIGN_HOME"] = str(tmp_path / "home")
    cmd = [
        sys.executable,
        "-m",
        "privalign",
        "serve",
        "--generator",
        "none",
        "--db",
        f"sqlite:///{tmp_path / 's.db'}",
    ]
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("check", [True, False], ids=["check", "serve"])
def test_serve_fails_with_one_line_on_a_busy_port(tmp_path, check):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = _serve(tmp_path, "--port", str(port), *(["--check"] if check else []))
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "--port" in lines[0] and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], lines
    assert "serving on" not in p.stderr and p.stdout == ""


def test_serve_check_fails_on_an_address_it_cannot_listen_on(tmp_path):
    p = _serve(tmp_path, "--host", "192.0.2.1", "--port", "8000", "--check")  # TEST-NET-1: never local
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "--host" in p.stderr and "192.0.2.1:8000" in p.stderr and p.stdout == ""  # not this machine's
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    ok = _serve(tmp_path, "--port", str(port), "--check")
    assert ok.returncode == 0, ok.stderr
