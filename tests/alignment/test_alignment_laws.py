"""Exact laws vs large seeded sampling runs (chi-square, exact critical values, α stated), and the
equivalences ε = ∞ ≡ BoN, zero noise ≡ ITP, Bernoulli form ≡ threshold form."""

import math

import numpy as np
import pytest

from privalign.alignment import FALLBACK, BestOfN, InferenceTimePessimism, PrivBoN, PrivITP
from privalign.alignment.laws import privitp_acceptance, privitp_law, sequential_law
from privalign.alignment.normalizer import solve_normalizer
from privalign.audit.stats import chi_square_test

ALPHA = 1e-4  # per test; false-positive probability ≤ 1e-4 under H0
DRAWS = 40_000


def _counts(idx, n):
    idx = np.where(idx == FALLBACK, n, idx)
    return np.bincount(idx, minlength=n + 1)


@pytest.mark.statistical
def test_privbon_matches_softmax(rng):
    s = rng.uniform(0, 1, 8)
    m = PrivBoN(3.0)
    idx = m.select_batch(np.tile(s, (DRAWS, 1)), rng=rng).indices
    res = chi_square_test(np.bincount(idx, minlength=8), m.law(s).probabilities, ALPHA)
    assert not res.rejected, res.message if hasattr(res, "message") else res


@pytest.mark.statistical
def test_itp_matches_sequential_law(rng):
    a, b = rng.uniform(0, 1, 6), rng.uniform(0, 1, 6)
    m = InferenceTimePessimism(0.2)
    idx = m.select_batch(np.tile(a, (DRAWS, 1)), rng=rng, pool_b_scores=np.tile(b, (DRAWS, 1))).indices
    law = m.law(a, pool_b_scores=b)
    assert law.probabilities.sum() + law.fallback == pytest.approx(1.0)
    assert not chi_square_test(_counts(idx, 6), np.append(law.probabilities, law.fallback), ALPHA).rejected


@pytest.mark.statistical
@pytest.mark.parametrize("sx,sz", [(0.3, 0.2), (0.05, 0.5), (2.0, 0.1)])
def test_privitp_matches_exact_law(rng, sx, sz):
    a, b = rng.uniform(0, 1, 5), rng.uniform(0, 1, 5)
    m = PrivITP(0.1, sigma_x=sx, sigma_z=sz, L=3.0)
    idx = m.select_batch(np.tile(a, (DRAWS, 1)), rng=rng, pool_b_scores=np.tile(b, (DRAWS, 1))).indices
    law = m.law(a, pool_b_scores=b)
    assert law.error_bound < 1e-6
    assert law.probabilities.sum() + law.fallback == pytest.approx(1.0, abs=1e-9)
    assert not chi_square_test(_counts(idx, 5), np.append(law.probabilities, law.fallback), ALPHA).rejected


@pytest.mark.statistical
def test_bernoulli_form_equals_threshold_form_in_law(rng):
    """Bernoulli(min(relu((r̃ − λ̃)/β)/M, 1)) on noisy scores vs the mechanism's r + Z > λ̃ + W·U, at a fixed
    λ̃: both samples against the closed-form conditional law (two chi-square tests, α each)."""
    b = np.array([0.1, 0.5, 0.9, 0.3])
    beta, sz, L, lam = 0.1, 0.3, 3.0, 0.4
    m = PrivITP(beta, sigma_x=1.0, sigma_z=sz, L=L)
    idx, _, w = m.phase2(np.tile(b, (DRAWS, 1)), np.full(DRAWS, lam), rng)
    M = w[0] / beta
    noisy = b + rng.normal(0, sz, (DRAWS, 4))
    p_acc = np.minimum(np.maximum((noisy - lam) / beta, 0) / M, 1)
    acc = rng.random((DRAWS, 4)) < p_acc
    bern = np.where(acc.any(1), np.argmax(acc, 1), FALLBACK)
    a = privitp_acceptance(b, lam, w[0], sz)
    p, fb = sequential_law(a)
    law = np.append(p, fb)
    assert not chi_square_test(_counts(idx, 4), law, ALPHA).rejected
    assert not chi_square_test(_counts(bern, 4), law, ALPHA).rejected


def test_privbon_infinite_epsilon_is_bon(rng):
    for _ in range(20):
        s = rng.uniform(0, 1, 10)
        assert PrivBoN(math.inf).select(s, rng=rng).index == BestOfN().select(s).index
    s = rng.uniform(0, 1, 10)
    assert np.array_equal(PrivBoN(math.inf).law(s).probabilities, BestOfN().law(s).probabilities)


def test_privitp_zero_noise_limit_is_itp(rng):
    a, b = rng.uniform(0, 1, 7), rng.uniform(0, 1, 7)
    itp = InferenceTimePessimism(0.1).law(a, pool_b_scores=b)
    p, fb, _ = privitp_law(a, b, beta=0.1, r_max=1.0, sigma_x=1e-7, sigma_z=1e-7, L=0.0)
    assert np.allclose(p, itp.probabilities, atol=1e-5) and fb == pytest.approx(itp.fallback, abs=1e-5)
    # and the sequential law given λ̃ = λ̂ with σ_Z = 0 is exactly ITP's
    lam = solve_normalizer(a, 0.1)
    p0, fb0 = sequential_law(privitp_acceptance(b, lam, 1.0 - lam, 0.0))
    assert np.allclose(p0, itp.probabilities) and fb0 == pytest.approx(itp.fallback)


def test_clamp_point_masses_in_law(rng):
    # λ̂ at the bottom of the interval with huge σ_X: about half the mass sits at each clamp end
    a, b = np.zeros(4), rng.uniform(0, 1, 4)
    p, fb, err = privitp_law(a, b, beta=0.1, r_max=1.0, sigma_x=50.0, sigma_z=0.2, L=3.0)
    assert p.sum() + fb == pytest.approx(1.0, abs=1e-9) and err < 1e-6
