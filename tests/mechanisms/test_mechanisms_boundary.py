"""Boundary inputs for calibrations and conversions (the sweep for the normaliser's
pattern). Each case is a reproduction from the sweep (``/work/notes/sweep.md`` of that session): it failed
before the fix. Checks use exact rational arithmetic or mpmath, not a tolerance."""

import math
from fractions import Fraction

import mpmath
import pytest

from privalign.accounting.conversions import zcdp_to_approx_dp_bun_steinke
from privalign.accounting.peeling import advanced_composition_epsilon, calibrate_peeling
from privalign.alignment import PrivBoN
from privalign.audit.stats import clopper_pearson
from privalign.errors import PrivacyParameterError
from privalign.mechanisms import GaussianMechanism, LaplaceMechanism, Peeling, RandomizedResponse
from privalign.mechanisms._common import gumbel_scale

mpmath.mp.dps = 60


def test_advanced_composition_delta_near_one_is_not_understated():  # F1
    got = advanced_composition_epsilon(0.1, 1, 0.999999)
    exact = mpmath.mpf(0.1) * mpmath.sqrt(2 * -mpmath.log(mpmath.mpf(0.999999))) + mpmath.mpf(
        0.1
    ) * mpmath.expm1(0.1)
    assert mpmath.mpf(got) >= exact


def test_bun_steinke_delta_near_one_is_not_understated():  # F1
    got = zcdp_to_approx_dp_bun_steinke(1.0, 0.999999)
    exact = 1 + 2 * mpmath.sqrt(-mpmath.log(mpmath.mpf(0.999999)))
    assert mpmath.mpf(got) >= exact


def test_peeling_huge_epsilon_is_not_an_overflow():  # F2
    assert calibrate_peeling(1, 1000.0, 1e-5) > 0
    Peeling(1, 700.0, 1e-5, 1.0)  # EPS_MAX, the largest ε the rule allows (issue 36)
    with pytest.raises(PrivacyParameterError, match="'epsilon'.*above 700"):  # by name, no overflow
        Peeling(1, 2000.0, 1e-5, 1.0)
    assert advanced_composition_epsilon(800.0, 2, 1e-5) == math.inf


@pytest.mark.parametrize("eps,sens", [(0.1, 0.1), (0.3, 0.7), (1.0 / 3.0, 0.1), (0.7, 0.3), (2.9, 1.1)])
def test_laplace_loss_never_exceeds_the_requested_epsilon(eps, sens):  # F5
    m = LaplaceMechanism.from_epsilon(eps, sens)
    assert Fraction(sens) / Fraction(m.scale) <= Fraction(eps)  # the noise actually used
    assert 1 / Fraction(m.noise_multiplier) >= Fraction(sens) / Fraction(m.scale)  # the event charges ≥ it
    assert Fraction(m.epsilon) >= Fraction(sens) / Fraction(m.scale)


@pytest.mark.parametrize("rho,sens", [(0.01, 0.1), (0.3, 0.7), (1.0 / 3.0, 0.1), (2.0, 0.3)])
def test_gaussian_from_zcdp_never_undercharges(rho, sens):  # F5
    m = GaussianMechanism.from_zcdp(rho, sens)
    assert Fraction(sens) ** 2 <= 2 * Fraction(rho) * Fraction(m.sigma) ** 2
    nm = Fraction(m.noise_multiplier)
    assert nm <= Fraction(m.sigma) / Fraction(sens)  # ρ = 1/(2nm²) computed from the event is ≥ the truth


@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0, 36.0, 40.0, 700.0])  # 700 = EPS_MAX: e^-ε ≈ 1e-304
def test_randomized_response_loss_at_most_epsilon_and_never_in_the_clear(eps):  # F6
    p = RandomizedResponse(eps).flip_probability
    assert p >= 2.0**-52  # every bit stays randomized
    exact_loss = mpmath.log((1 - mpmath.mpf(p)) / mpmath.mpf(p))
    assert exact_loss <= eps


def test_clopper_pearson_upper_tail_uses_the_exact_alpha():  # F7
    _, hi = clopper_pearson(0, 10, 1e-12)
    # P[Bin(10, hi) ≤ 0] = (1 − hi)^10 must be ≤ α/2
    assert (1 - mpmath.mpf(float(hi))) ** 10 <= mpmath.mpf(1e-12) / 2 * (1 + mpmath.mpf(1e-9))


def test_gumbel_scale_overflow_is_a_parameter_error():  # F8
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        gumbel_scale(1e300, 1e-12)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        PrivBoN(1e-320).select([0.1, 0.2], rng=None)
