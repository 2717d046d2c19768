"""Boundary inputs of the estimation calibrations (the sweep). Each case failed before."""

import math
from fractions import Fraction

import pytest

from privalign.estimation.baselines import dpsgd_epsilon
from privalign.estimation.iht import _advanced_epsilon, advanced_composition_split


@pytest.mark.parametrize(
    "eps,delta,T",
    [(0.001, 1e-12, 5), (1.0, 1e-5, 3), (0.1, 1e-6, 7), (8.0, 1e-5, 11), (2.0, 1e-5, 40), (0.3, 0.5, 9)],
)
def test_advanced_composition_split_never_overshoots(eps, delta, T):  # F3
    e_i, d_i = advanced_composition_split(eps, delta, T)
    basic_ok = T * Fraction(e_i) <= Fraction(eps) and T * Fraction(d_i) <= Fraction(delta)
    adv_ok = _advanced_epsilon(e_i, T, delta / 2.0) <= eps and T * Fraction(d_i) + Fraction(
        delta / 2.0
    ) <= Fraction(delta)
    assert basic_ok or adv_ok


def test_dpsgd_rdp_uses_a_checked_delta_and_never_overflows():  # F4
    e = dpsgd_epsilon(0.5, 1.0, 20, 1e-5, accountant="rdp")
    assert e > 0 and (math.isinf(e) or e >= dpsgd_epsilon(0.5, 1.0, 20, 1e-5, accountant="pld") * 0.5)
    assert dpsgd_epsilon(0.3, 1.0, 1000, 1e-5, accountant="rdp") > 0  # was an OverflowError
