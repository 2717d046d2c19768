"""The exponential mechanism's Gumbel scale and charged ε are rounded on the conservative side."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from privalign.alignment import PrivBoN
from privalign.mechanisms import NoisyArgmax, NoisyTopK
from privalign.mechanisms._common import gumbel_epsilon, gumbel_scale


def _cases():
    rng = np.random.default_rng(2026)
    fixed = [(1.0, 1.0), (1.0, 3.0), (0.1, 0.3), (1.0, 0.7), (6.0, 12.0), (1e-9, 1e9), (3.3, 0.1)]
    return fixed + [(float(rng.uniform(1e-3, 10)), float(rng.uniform(1e-3, 50))) for _ in range(400)]


def test_scale_and_epsilon_round_up_and_are_tight():
    rounded_up = 0
    for delta, eps in _cases():
        s = gumbel_scale(delta, eps)
        assert Fraction(s) * Fraction(eps) >= Fraction(2 * delta)  # real loss 2Δ/s ≤ ε
        below = math.nextafter(s, 0.0)
        assert Fraction(below) * Fraction(eps) < Fraction(2 * delta)  # and s is the smallest such float
        rounded_up += s != 2 * delta / eps
        e = gumbel_epsilon(delta, s)
        assert Fraction(e) * Fraction(s) >= Fraction(2 * delta) and e <= eps
    assert rounded_up > 0  # plain division would have been non-conservative in some cases


def test_mechanisms_use_the_rounded_scale_and_charge_at_most_the_request():
    for delta, eps in _cases()[:60]:
        if eps > 700.0:  # above EPS_MAX the constructors refuse ε (the one ε rule, issue 36)
            continue
        assert NoisyArgmax(epsilon=eps, sensitivity=delta).scale == gumbel_scale(delta, eps)
        assert NoisyTopK(k=2, epsilon=eps, sensitivity=delta).scale == gumbel_scale(delta, eps)
        pb = PrivBoN(eps, sensitivity=delta)
        assert pb.scale == gumbel_scale(delta, eps)
        assert Fraction(pb.epsilon_effective) * Fraction(pb.scale) >= Fraction(2 * delta)
        assert pb.epsilon_effective <= eps
    assert NoisyArgmax(epsilon=math.inf, sensitivity=1.0).scale == 0.0


@pytest.mark.parametrize("sigma_reg", [0.5, 3.0])
def test_privbon_with_regularising_noise_charges_the_rounded_up_effective_epsilon(sigma_reg):
    pb = PrivBoN(1.0, sensitivity=1.0, sigma_reg=sigma_reg)
    assert pb.scale == max(2.0, sigma_reg)
    assert Fraction(pb.epsilon_effective) * Fraction(pb.scale) >= Fraction(2)
