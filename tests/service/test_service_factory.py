"""Issue 18 (c): the service plans its selectors through the library's one factory and conversion.

PrivBoN's Gumbel scale for an ε is the library's (``make_selector``/``privbon_scale``, 2Δ/ε rounded up) at
the float ε the service runs (the request's ε rounded down to the ledger unit, then stepped down by
``privbon_epsilon_within`` until the charged ε fits the units exactly); an unknown method name fails with
the library's error, in the config as in ``make_selector`` and the simulation's ``MethodSpec``.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pytest

from privalign.alignment import check_method, make_selector, pool_size, privbon_epsilon_within, privbon_scale
from privalign.alignment.selectors import METHODS, uses_two_pools
from privalign.alignment.simulation import MethodSpec
from privalign.errors import PrivacyParameterError
from privalign.service import db
from privalign.service.config import ServiceConfig, config_from_dict
from privalign.service.plan import make_plan, quantize_epsilon
from privalign.service.plan import pool_size as plan_pool_size
from privalign.service.schemas import PrivacyParams


def _cfg(sensitivity: float = 1.0, reward_max: float = 1.0) -> ServiceConfig:
    cfg = ServiceConfig()
    pv = dataclasses.replace(
        cfg.privacy, allowed_methods=("privbon", "privitp"), sensitivity=sensitivity, reward_max=reward_max
    )
    return dataclasses.replace(cfg, privacy=pv)


def _plan(cfg: ServiceConfig, eps: float, n: int = 8):
    return make_plan(cfg, PrivacyParams(method="privbon", epsilon=eps, n=n), 8)


@pytest.mark.parametrize("sens", [1.0, 0.5, 0.25, 2.0])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 0.25, 1.5, 0.125, 8.0])
def test_service_scale_equals_library_scale_for_the_same_epsilon(eps, sens):
    """ε exactly a number of ledger units and a float: the service runs at ε itself and its scale is the
    library's, the simulation's and make_selector's, bit for bit."""
    plan = _plan(_cfg(sens), eps)
    assert plan.mech.epsilon == eps  # nothing to round: the service runs the requested ε
    lib = privbon_scale(eps, sens)
    assert plan.mech.scale == lib
    assert make_selector("privbon", epsilon=eps, sensitivity=sens).scale == lib
    assert MethodSpec("privbon", epsilon=eps).privbon_scale(sens) == lib
    assert plan.worst.epsilon == make_selector("privbon", epsilon=eps, sensitivity=sens).epsilon_effective


@pytest.mark.parametrize("sens", [1.0, 0.3, 0.7])
@pytest.mark.parametrize("eps", [0.1, 0.3, 2.0 / 3.0, 1e-6, 7.3, 0.123456789123, 10.0])
def test_service_scale_is_the_library_scale_at_the_run_epsilon_and_conservative(eps, sens):
    plan = _plan(_cfg(sens), eps)
    units, _ = quantize_epsilon(eps)
    target = Fraction(units, db.EPS_SCALE)
    run = privbon_epsilon_within(target, sens)
    assert plan.mech.epsilon == run
    assert (
        plan.mech.scale
        == privbon_scale(run, sens)
        == make_selector("privbon", epsilon=run, sensitivity=sens).scale
    )
    # conservative: never less noise than the library at the requested ε, never charged above the units
    assert Fraction(plan.mech.scale) >= Fraction(privbon_scale(eps, sens))
    assert Fraction(plan.worst.epsilon) <= target and plan.epsilon == float(target)
    assert Fraction(run) <= target and Fraction(run) <= Fraction(eps)


def test_privitp_plan_is_the_factory_selector():
    cfg = _cfg()
    plan = make_plan(cfg, PrivacyParams(method="privitp", epsilon=10.0, n=3, beta=0.1, sigma_x=2.0), 8)
    pv = cfg.privacy
    ref = make_selector(
        "privitp",
        beta=0.1,
        sigma_x=2.0,
        sigma_z=pv.privitp["sigma_z"],
        L=pv.privitp["envelope_l"],
        r_max=pv.reward_max,
        delta=pv.delta,
        sensitivity=pv.sensitivity,
        clip=True,
    )
    assert plan.worst == ref.worst_case_event(3)
    assert plan_pool_size(plan) == pool_size("privitp", 3) == 7


def _message(exc: BaseException) -> str:
    """The message after the parameter's name (the part that is the same wherever the name was written)."""
    text = str(exc)
    return text[text.index(" parameter ") :]


def test_unknown_method_gives_the_same_error_everywhere():
    name = "privmax"
    with pytest.raises(PrivacyParameterError) as ref:
        check_method(name)
    expected = f" parameter must be one of {list(METHODS)}. Got {name!r} instead."
    assert _message(ref.value) == expected
    places = {
        "make_selector": lambda: make_selector(name, epsilon=1.0),
        "pool_size": lambda: pool_size(name, 4),
        "uses_two_pools": lambda: uses_two_pools(name),
        "MethodSpec": lambda: MethodSpec(name),
        "service config": lambda: config_from_dict({"privacy": {"allowed_methods": [name]}}),
    }
    for where, call in places.items():
        with pytest.raises(PrivacyParameterError) as got:
            call()
        assert _message(got.value) == expected, where
    assert str(ref.value) == "The 'method'" + expected


def test_service_config_names_the_key_and_refuses_a_library_method_it_does_not_serve():
    with pytest.raises(PrivacyParameterError, match=r"'privacy\.allowed_methods' parameter must be one of"):
        config_from_dict({"privacy": {"allowed_methods": ["greedy"]}})
    with pytest.raises(PrivacyParameterError, match=r"lists 'itp', which the service does not serve"):
        config_from_dict({"privacy": {"allowed_methods": ["itp"]}})


def test_privbon_epsilon_within_refuses_a_non_positive_budget():
    with pytest.raises(PrivacyParameterError, match="'target'"):
        privbon_epsilon_within(Fraction(0), 1.0)
    assert privbon_epsilon_within(Fraction(1, 2), 1.0) == 0.5
    assert math.isfinite(privbon_epsilon_within(Fraction(1, 10), 0.3))


def test_select_default_privitp_uses_the_two_pool_candidate_rule(tmp_path, reward_model):
    """A server whose first allowed method is privitp, and a /v1/select request that names no method: the
    candidates are read as 2n + 1 (pool A, pool B, fallback), as for ``"method": "privitp"``. Before, the
    route read them as n while the plan was privitp with that n: a 500 after private scoring, charged."""
    import httpx
    from test_service_http import _cfg

    from conftest import serve_in_thread
    from privalign.service.app import create_app
    from privalign.service.keys import create_key

    app = create_app(_cfg(tmp_path, reward_model, allowed_methods=["privitp", "privbon"]))
    _, token = create_key(
        app.state.service.engine, budget_epsilon=50.0, budget_delta=1e-3, accounting="ex-post"
    )
    h = {"Authorization": f"Bearer {token}"}
    five = ["a", "b", "c", "d", "e"]
    with serve_in_thread(app) as url:
        for privacy in ({"epsilon": 5.0}, {"epsilon": 5.0, "method": "privitp"}):
            r = httpx.post(
                url + "/v1/select", headers=h, json={"prompt": "p", "candidates": five, "privacy": privacy}
            )
            assert r.status_code == 200, r.text
            assert r.json()["privacy"]["method"] == "privitp"
        r = httpx.post(url + "/v1/select", headers=h, json={"prompt": "p", "candidates": five[:4]})
        assert r.status_code == 400 and "2n + 1" in r.json()["error"]["message"]
