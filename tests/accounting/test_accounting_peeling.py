"""Peeling accounting (spec-reward-estimation §4 option (b)): the spec's table, calibration that never
overshoots, and a numerical check of the per-round sensitivity argument (ε0 = 2/nm)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from privalign.accounting import (
    PeelingEvent,
    PureDPAccountant,
    RDPAccountant,
    ZCDPAccountant,
    calibrate_peeling,
    peeling_epsilon,
)
from privalign.accounting.peeling import (
    advanced_composition_epsilon,
    cwz_noise_multiplier,
    peeling_epsilon_parts,
)
from privalign.errors import PrivacyParameterError


@pytest.mark.parametrize(
    ("s", "selection", "release", "total"),
    [(5, 0.85, 0.19, 1.04), (20, 0.85, 0.38, 1.23), (128, 0.85, 0.42, 1.26)],
)
def test_reproduces_spec_table(s, selection, release, total):
    """At the Cai–Wang–Zhang scale for ε = 1, δ = 1e-5: selections by DRV at δ, release = min(pure, AC at
    δ)."""
    nm = cwz_noise_multiplier(s, 1.0, 1e-5)
    parts = peeling_epsilon_parts(s, nm, 1e-5, 1e-5)
    assert round(parts["selection"], 2) == selection
    assert round(parts["release"], 2) == release
    assert round(parts["total"], 2) == total
    # The CWZ scale overshoots the nominal ε = 1 under this accounting for s ≥ 20 ...
    eps, d = peeling_epsilon(s, nm, 2e-5)
    assert d <= 2e-5
    if s >= 20:
        assert eps > 1.0
    # ... and the PLD of the 2s sub-mechanisms is tighter still (never below 0 and never above DRV).
    pld = RDPAccountant("pld").compose(PeelingEvent(sparsity=s, noise_multiplier=nm)).get_epsilon(2e-5)
    assert 0 < pld <= eps


def test_pure_bound_is_3s_over_nm():
    ev = PeelingEvent(sparsity=7, noise_multiplier=4.0)
    assert PureDPAccountant().compose(ev).get_epsilon() == 3 * 7 / 4.0
    assert peeling_epsilon(7, 4.0, 0.0) == (3 * 7 / 4.0, 0.0)
    assert ZCDPAccountant().compose(ev).get_rho() == 5 * 7 / (2 * 16.0)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    s=st.integers(1, 200),
    eps=st.floats(0.05, 10.0),
    delta=st.sampled_from([0.0, 1e-9, 1e-6, 1e-5, 1e-3]),
)
def test_calibration_never_overshoots_and_is_tight(s, eps, delta):
    nm = calibrate_peeling(s, eps, delta)
    got_eps, got_delta = peeling_epsilon(s, nm, delta)
    assert got_eps <= eps and got_delta <= delta
    # 1e-6 less noise already exceeds the target: the calibration is tight.
    assert peeling_epsilon(s, nm * (1 - 1e-6), delta)[0] > eps


def test_advanced_composition_closed_form():
    e0, k, d = 0.1, 50, 1e-6
    expected = e0 * math.sqrt(2 * k * math.log(1 / d)) + k * e0 * math.expm1(e0)
    got = advanced_composition_epsilon(e0, k, d)
    assert expected <= got <= expected * (1 + 1e-14)
    assert advanced_composition_epsilon(e0, 0, d) == 0.0


def _rnm_prob_first(scores: tuple[float, float], b: float) -> float:
    """P(argmax(scores + Laplace(b)^2) = 0), exactly, by integrating over the first noise."""
    lap = stats.laplace(scale=b)
    f = lambda w: lap.pdf(w) * lap.cdf(scores[0] + w - scores[1])  # noqa: E731
    val, err = integrate.quad(
        f, -60 * b, 60 * b, points=[0.0, scores[1] - scores[0]], epsabs=1e-14, limit=200
    )
    return val


@pytest.mark.parametrize("nm", [0.5, 1.0, 3.0])
def test_laplace_rnm_round_is_2_over_nm_dp_and_1_over_nm_is_not_enough(nm):
    """Sensitivity argument for one selection round: scores |v_i| with ℓ∞ sensitivity λ = 1 and Laplace
    scale b = nm. Worst case: one score up by λ and the other down by λ. The log-ratio of the selection
    probabilities stays ≤ 2/nm, and exceeds 1/nm (so the factor 2 is needed for non-monotone scores)."""
    b = nm
    p = _rnm_prob_first((1.0, 1.0), b)
    q = _rnm_prob_first((2.0, 0.0), b)
    worst = max(abs(math.log(q / p)), abs(math.log((1 - p) / (1 - q))))
    assert worst <= 2.0 / nm + 1e-9
    assert worst > 1.0 / nm


def test_bad_inputs_name_parameter_and_value():
    with pytest.raises(PrivacyParameterError, match=r"'sparsity'.*0"):
        peeling_epsilon(0, 1.0, 1e-5)
    with pytest.raises(PrivacyParameterError, match=r"'noise_multiplier'.*-1"):
        peeling_epsilon(3, -1.0, 1e-5)
    with pytest.raises(PrivacyParameterError, match=r"'delta'.*1\.0"):
        peeling_epsilon(3, 1.0, 1.0)
    with pytest.raises(PrivacyParameterError, match=r"'epsilon'.*nan"):
        calibrate_peeling(3, float("nan"), 1e-5)
    with pytest.raises(PrivacyParameterError, match=r"'epsilon0'.*0\.0"):
        advanced_composition_epsilon(0.0, 3, 1e-5)
    with pytest.raises(TypeError, match="'sparsity'"):
        calibrate_peeling(2.5, 1.0, 1e-5)
    with pytest.raises(PrivacyParameterError, match=r"'delta_release'.*0\.0"):
        peeling_epsilon_parts(3, 1.0, 1e-5, 0.0)
    with pytest.raises(PrivacyParameterError, match=r"'delta'.*0\.0"):
        cwz_noise_multiplier(3, 1.0, 0.0)
    assert np.isfinite(calibrate_peeling(1, 1.0, 0.0))
