"""One-sided soundness against closed forms and high-precision oracles (style.md §9)."""

from __future__ import annotations

import math

import mpmath
import pytest

from privalign.accounting import (
    GaussianEvent,
    NoisyArgmaxEvent,
    PoissonSampledEvent,
    PureDPAccountant,
    PureDPEvent,
    RDPAccountant,
    ZCDPAccountant,
    gaussian_delta,
    gaussian_epsilon,
    zcdp_to_approx_dp,
    zcdp_to_approx_dp_bun_steinke,
)
from privalign.accounting.conversions import approx_dp_to_zcdp, zcdp_to_approx_dp_cks

mpmath.mp.dps = 60


def oracle_delta(nm: float, eps: float) -> mpmath.mpf:
    """Balle & Wang 2018 Thm 8 at 60 significant digits."""
    nm, eps = mpmath.mpf(nm), mpmath.mpf(eps)
    a, b = 1 / (2 * nm), eps * nm
    return mpmath.ncdf(a - b) - mpmath.exp(eps) * mpmath.ncdf(-a - b)


NMS = [0.3, 0.5, 0.8, 1.0, 2.0, 5.0, 20.0]
EPSS = [0.0, 0.01, 0.1, 0.5, 1.0, 3.0, 8.0, 30.0]


@pytest.mark.parametrize("nm", NMS)
def test_gaussian_delta_matches_mpmath_oracle_and_is_never_below(nm):
    for eps in EPSS:
        exact = oracle_delta(nm, eps)
        ours = gaussian_delta(nm, eps)
        assert mpmath.mpf(ours) >= exact, (nm, eps)
        assert ours <= float(exact) * (1 + 1e-6) + 1e-280, (nm, eps, ours, float(exact))


@pytest.mark.parametrize("nm", NMS)
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_gaussian_epsilon_is_sound_and_tight(nm, delta):
    eps = gaussian_epsilon(nm, delta)
    assert oracle_delta(nm, eps) <= delta
    if eps > 0:
        assert oracle_delta(nm, eps * (1 - 1e-9) - 1e-12) > delta


@pytest.mark.parametrize("method", ["rdp", "pld"])
@pytest.mark.parametrize("nm", [0.6, 1.0, 3.0])
@pytest.mark.parametrize("k", [1, 4])
def test_rdp_pld_gaussian_delta_never_below_optimal_curve(method, nm, k):
    """k Gaussians at nm are one Gaussian at nm/sqrt(k); the accountant's δ(ε) must be ≥ its exact curve."""
    acc = RDPAccountant(method, value_discretization_interval=1e-3).compose(
        GaussianEvent(noise_multiplier=nm), k
    )
    nm_eff = nm / math.sqrt(k)
    for eps in [0.1, 0.5, 1.0, 2.0, 4.0]:
        assert acc.get_delta(eps) >= float(oracle_delta(nm_eff, eps)), eps
    for delta in [1e-3, 1e-6]:
        assert acc.get_epsilon(delta) >= gaussian_epsilon(nm_eff, delta) * (1 - 1e-12)


@pytest.mark.parametrize("nm", [0.5, 1.0, 2.0, 10.0])
def test_zcdp_conversion_never_below_exact_gaussian(nm):
    acc = ZCDPAccountant().compose(GaussianEvent(noise_multiplier=nm))
    for delta in [1e-2, 1e-5, 1e-9]:
        assert acc.get_epsilon(delta) >= gaussian_epsilon(nm, delta)
        assert zcdp_to_approx_dp_bun_steinke(acc.get_rho(), delta) >= gaussian_epsilon(nm, delta)
    for eps in [0.1, 1.0, 3.0]:
        assert acc.get_delta(eps) >= float(oracle_delta(nm, eps))


def test_zcdp_conversion_table_of_the_spec():
    """spec-inference-time §3.3: T PrivBoN queries at ε: BS16 / CKS20 conversions at δ = 1e-6."""
    for eps, T, bs, cks in [(0.1, 1000, 9.56, 8.85), (0.5, 100, 16.27, 15.33), (1.0, 100, 38.78, 37.42)]:
        acc = ZCDPAccountant().compose(NoisyArgmaxEvent(epsilon=eps), T)
        assert round(zcdp_to_approx_dp_bun_steinke(acc.get_rho(), 1e-6), 2) == bs
        assert round(zcdp_to_approx_dp_cks(acc.get_rho(), 1e-6), 2) == cks
        assert acc.get_epsilon(1e-6) == zcdp_to_approx_dp(acc.get_rho(), 1e-6)
        assert round(acc.get_epsilon(1e-6), 2) == cks


@pytest.mark.parametrize("rho", [0.01, 0.5, 3.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-9])
def test_cks_conversion_against_mpmath_minimum(rho, delta):
    """Our ε is ≥ the exact minimum over α of the CKS20 bound (so it is one of the valid bounds or above)
    and within a relative 1e-6 of it. The minimum is found by mpmath: grid, then Newton on f'(α) = 0."""

    def f(a):
        return rho * a + mpmath.log(1 - 1 / a) - (mpmath.log(delta) + mpmath.log(a)) / (a - 1)

    grid = [1 + mpmath.mpf(10) ** (x / 100) for x in range(-600, 400)]
    a0 = min(grid, key=f)
    a_star = mpmath.findroot(lambda a: mpmath.diff(f, a), a0)
    best = min(f(a_star), f(a0))
    ours = zcdp_to_approx_dp_cks(rho, delta)
    assert mpmath.mpf(ours) >= best
    assert ours <= float(best) * (1 + 1e-6)


def test_zcdp_get_delta_consistent_with_get_epsilon():
    acc = ZCDPAccountant().compose(NoisyArgmaxEvent(epsilon=0.5), 40)
    for delta in [1e-3, 1e-6]:
        eps = acc.get_epsilon(delta)
        assert acc.get_delta(eps) <= delta * (1 + 1e-6)


def test_approx_dp_to_zcdp_never_overshoots():
    for eps, delta in [(0.5, 1e-6), (1.0, 1e-5), (8.0, 1e-9)]:
        rho = approx_dp_to_zcdp(eps, delta)
        assert zcdp_to_approx_dp(rho, delta) <= eps
        assert zcdp_to_approx_dp(rho * (1 + 1e-6), delta) > eps


def test_pure_get_delta_is_the_randomized_response_hockey_stick():
    acc = PureDPAccountant().compose(PureDPEvent(epsilon=1.5))
    for eps in [0.0, 0.5, 1.0, 1.49]:
        p = mpmath.exp(1.5) / (1 + mpmath.exp(1.5))
        exact = p - mpmath.exp(eps) * (1 - p)  # only the first outcome contributes for eps < 1.5
        assert acc.get_delta(eps) >= exact
        assert acc.get_delta(eps) <= float(exact) * (1 + 1e-9)
    assert acc.get_delta(1.5) == 0.0


def test_poisson_sampled_gaussian_pld_not_above_rdp():
    ev = PoissonSampledEvent(
        sampling_probability=0.01, event=GaussianEvent(noise_multiplier=1.0), relation="add_remove_one"
    )
    rdp = RDPAccountant("rdp").compose(ev, 500).get_epsilon(1e-5)
    pld = RDPAccountant("pld").compose(ev, 500).get_epsilon(1e-5)
    assert 0 < pld <= rdp


def test_one_sided_checks_catch_broken_conversions():
    """Negative controls: the checks above have power. A zCDP conversion missing the factor 2
    (ρ + sqrt(ρ·log(1/δ))) and a Gaussian δ computed at twice the noise both fall below the exact curve."""
    grid = [(nm, d) for nm in [0.5, 1.0, 2.0, 10.0] for d in [1e-2, 1e-5, 1e-9]]
    broken_conv = lambda rho, d: rho + math.sqrt(rho * math.log(1 / d))  # noqa: E731
    assert any(broken_conv(1 / (2 * nm * nm), d) < gaussian_epsilon(nm, d) for nm, d in grid)
    assert any(gaussian_delta(2 * nm, 1.0) < oracle_delta(nm, 1.0) for nm, _ in grid)
