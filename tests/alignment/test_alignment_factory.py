"""One factory per concept: ``make_selector``/``pool_size`` and PrivBoN's ε ↔ scale conversion.

The factory must build exactly what the direct constructors build (same laws, same events, same draws for
the same seed), name a missing parameter, and be the one source of the "n, or 2n + 1" candidate rule.
"""

import math

import numpy as np
import pytest

from privalign.alignment import (
    BestOfN,
    InferenceTimePessimism,
    PrivBoN,
    PrivITP,
    Selector,
    make_selector,
    pool_size,
    privbon_epsilon,
    privbon_scale,
)
from privalign.errors import PrivacyParameterError

SCORES_A = np.array([0.1, 0.9, 0.4, 0.7, 0.2])
SCORES_B = np.array([0.3, 0.8, 0.5, 0.6, 0.1])

CASES = [
    ("bon", {}, lambda: BestOfN()),
    ("itp", {"beta": 0.5}, lambda: InferenceTimePessimism(0.5)),
    ("privbon", {"epsilon": 0.7, "sensitivity": 0.5}, lambda: PrivBoN(0.7, sensitivity=0.5)),
    (
        "privitp",
        {"beta": 0.5, "sigma_x": 0.2, "sigma_z": 0.3},
        lambda: PrivITP(0.5, sigma_x=0.2, sigma_z=0.3),
    ),
]


@pytest.mark.parametrize(("method", "params", "direct"), CASES, ids=[c[0] for c in CASES])
def test_factory_builds_what_the_constructor_builds(method, params, direct, seed):
    made, ref = make_selector(method, **params), direct()
    assert isinstance(made, Selector) and type(made) is type(ref) and made.name == method
    assert made.worst_case_event(5) == ref.worst_case_event(5)
    b = SCORES_B if method in ("itp", "privitp") else None
    law_m, law_r = made.law(SCORES_A, pool_b_scores=b), ref.law(SCORES_A, pool_b_scores=b)
    assert np.array_equal(law_m.probabilities, law_r.probabilities) and law_m.fallback == law_r.fallback
    s_m = made.select(SCORES_A, rng=np.random.default_rng(seed), pool_b_scores=b)
    s_r = ref.select(SCORES_A, rng=np.random.default_rng(seed), pool_b_scores=b)
    assert s_m.index == s_r.index and s_m.event == s_r.event


@pytest.mark.parametrize(
    ("method", "missing"),
    [("itp", "beta"), ("privbon", "epsilon"), ("privitp", "beta"), ("privitp", "sigma_x")],
)
def test_missing_parameter_is_named(method, missing):
    params = {"beta": 0.5, "epsilon": 1.0, "sigma_x": 0.2}
    params.pop(missing)
    with pytest.raises(
        PrivacyParameterError, match=f"'{missing}' parameter is required for method '{method}'"
    ):
        make_selector(method, **params)


def test_unknown_method_is_refused():
    with pytest.raises(PrivacyParameterError, match="'method'"):
        make_selector("privmax")


def test_sigma_z_defaults_to_sigma_x():
    sel = make_selector("privitp", beta=0.5, sigma_x=0.25)
    assert sel.worst_case_event(4) == PrivITP(0.5, sigma_x=0.25, sigma_z=0.25).worst_case_event(4)


@pytest.mark.parametrize(
    ("method", "n", "want"), [("bon", 4, 4), ("privbon", 4, 4), ("itp", 4, 9), ("privitp", 1, 3)]
)
def test_pool_size_is_n_or_two_n_plus_one(method, n, want):
    assert pool_size(method, n) == want


def test_pool_size_refuses_bad_input():
    with pytest.raises(PrivacyParameterError):
        pool_size("privitp", 0)
    with pytest.raises(PrivacyParameterError):
        pool_size("nope", 3)


@pytest.mark.parametrize("eps", [0.1, 0.3, 0.7, 1.0, 2.0 / 3.0, 1e-6, 7.3])
@pytest.mark.parametrize("sens", [1.0, 0.5, 0.3, 3.0])
def test_privbon_conversion_is_conservative_and_shared(eps, sens):
    from fractions import Fraction

    scale = privbon_scale(eps, sens)
    assert Fraction(scale) * Fraction(eps) >= 2 * Fraction(sens)  # scale ≥ 2Δ/ε exactly: charged ε ≤ target
    charged = privbon_epsilon(scale, sens)
    assert Fraction(charged) * Fraction(scale) >= 2 * Fraction(sens)  # charged ≥ 2Δ/scale exactly
    assert charged <= eps or math.nextafter(eps, math.inf) >= charged  # at most one ulp above the target
    sel = PrivBoN(eps, sensitivity=sens)  # the selector uses the same conversion
    assert sel.scale == scale and sel.epsilon_effective == charged


def test_privbon_conversion_at_infinity():
    assert privbon_scale(math.inf, 1.0) == 0.0
    assert privbon_epsilon(0.0, 1.0) == math.inf


def test_simulation_uses_the_shared_conversion():
    from privalign.alignment.simulation import MethodSpec

    assert MethodSpec("privbon", epsilon=0.3).privbon_scale(0.7) == privbon_scale(0.3, 0.7)
    assert MethodSpec("privbon", sigma=0.25).privbon_scale(0.7) == 0.25


def test_make_selector_takes_the_gumbel_scale_directly():
    sel = make_selector("privbon", sigma=0.25, sensitivity=0.5)
    assert sel.scale == 0.25 and sel.epsilon_effective == privbon_epsilon(0.25, 0.5)
    assert make_selector("privbon", sigma=0.0).scale == 0.0  # σ = 0: plain BoN
    with pytest.raises(PrivacyParameterError, match="exactly one of 'epsilon' or 'sigma'"):
        make_selector("privbon", epsilon=1.0, sigma=0.25)
    with pytest.raises(PrivacyParameterError, match="'sigma'"):
        make_selector("privbon", sigma=-1.0)


def test_pool_size_without_the_fallback_candidate():
    """The simulation credits the fallback with the base-policy mean (K14): two pools, no extra candidate."""
    assert pool_size("privitp", 4, fallback_candidate=False) == 8
    assert pool_size("itp", 4, fallback_candidate=False) == 8
    assert pool_size("privbon", 4, fallback_candidate=False) == 4


def test_method_spec_validates_through_the_factory():
    from privalign.alignment.simulation import MethodSpec

    for kw, missing in [({"kind": "itp"}, "beta"), ({"kind": "privitp", "beta": 0.1}, "sigma_x")]:
        with pytest.raises(PrivacyParameterError, match=f"'{missing}' parameter is required"):
            MethodSpec(**kw)
        with pytest.raises(PrivacyParameterError, match=f"'{missing}' parameter is required"):
            make_selector(kw.pop("kind"), **kw)
    with pytest.raises(PrivacyParameterError) as a:
        MethodSpec("privitp", beta=0.1, sigma_x=-0.2, sigma_z=0.1)
    with pytest.raises(PrivacyParameterError) as b:
        make_selector("privitp", beta=0.1, sigma_x=-0.2, sigma_z=0.1)
    assert str(a.value) == str(b.value)
    with pytest.raises(PrivacyParameterError, match="'kind' parameter must be one of"):
        MethodSpec("privmax")
    spec = MethodSpec("privitp", beta=0.1, sigma_x=0.2)  # σ_Z defaults to σ_X, as in make_selector
    assert spec.sigma_z == 0.2
    sel = spec.selector(r_max=2.0, sensitivity=0.5)
    assert sel.worst_case_event(8) == make_selector(
        "privitp", beta=0.1, sigma_x=0.2, r_max=2.0, sensitivity=0.5
    ).worst_case_event(8)


def test_simulation_privacy_report_is_the_selectors():
    from privalign.alignment.simulation import MethodSpec, run_protocol
    from privalign.alignment.synthetic import make_synthetic_pool

    specs = [
        MethodSpec("privbon", epsilon=0.3),
        MethodSpec("privbon", sigma=0.4),
        MethodSpec("privitp", beta=0.05, sigma_x=0.2, sigma_z=0.1, L=4.0, delta=1e-5),
    ]
    res = run_protocol(
        make_synthetic_pool(3, 64, random_state=1),
        specs,
        n_grid=[2, 8],
        replicates=2,
        random_state=0,
        score_range=(0.0, 1.5),
        sensitivity=0.7,
        progress=False,
    )
    for s, m in zip(specs[:2], res["methods"][:2], strict=True):
        sel = make_selector("privbon", epsilon=s.epsilon, sigma=s.sigma, sensitivity=0.7, r_max=1.5)
        assert m["privacy"]["scale"] == sel.scale and m["privacy"]["epsilon"] == sel.epsilon_effective
    itp = make_selector(
        "privitp", beta=0.05, sigma_x=0.2, sigma_z=0.1, L=4.0, delta=1e-5, r_max=1.5, sensitivity=0.7
    )
    assert res["methods"][2]["privacy"]["epsilon_max"] == itp.accountant.epsilon_max_many([2, 8])


# -- the selector owns its method: spec, flat candidate list ----------------------------------------------


def test_selector_spec_refuses_a_parameter_the_method_does_not_take():
    from privalign.alignment.selectors import SelectorSpec

    with pytest.raises(PrivacyParameterError, match="'beta' parameter does not apply to method 'privbon'"):
        SelectorSpec.of("privbon", epsilon=1.0, beta=0.1)
    spec = SelectorSpec.of("privitp", beta=0.1, sigma_x=2.0)
    assert spec.resolved() == {"beta": 0.1, "sigma_x": 2.0, "sigma_z": 2.0, "L": 3.0, "delta": 1e-6}
    assert make_selector(spec).sigma_z == 2.0 and spec.describe() == "PrivITP β=0.1 σx=2 σz=2"


@pytest.mark.parametrize("method", ["itp", "privitp"])
def test_pick_maps_pool_b_and_the_fallback_into_the_flat_list(method):
    """``pick`` on ``[pool A (n), pool B (n), fallback]``: an accepted pool-B candidate i is ``n + i``, the
    fallback is ``2n`` (the layout lives in the two-pool selectors, not in the service)."""
    params = {"beta": 0.05} if method == "itp" else {"beta": 0.05, "sigma_x": 1.0, "sigma_z": 0.01}
    sel = make_selector(method, **params)
    n = 4
    rng = np.random.default_rng(0)
    high = np.r_[np.zeros(n), np.ones(n), 0.5]  # pool B at the top: accepted at once
    out = sel.pick(high, rng=rng)
    assert n <= out.index < 2 * n
    low = np.r_[np.ones(n), np.zeros(n), 0.5]  # pool B at the bottom, λ̂ high: nothing accepted
    assert sel.pick(low, rng=rng).index == 2 * n
    with pytest.raises(PrivacyParameterError, match="2n \\+ 1"):
        sel.pick(np.zeros(2 * n), rng=rng)
