"""Statistical tests of each mechanism's output law, for the seeded and the secure noise source.

Every test states its false-positive rate: ALPHA per test function (Bonferroni-split when a test makes
several checks), with exact critical values from scipy.stats (chi2.isf after merging bins with expected
count < 5, kstwo.isf, binomtest). With PRIVALIGN_TEST_SEED=all (100 seeds) the family-wise false-positive
rate is ≤ 100·ALPHA = 1e-2.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate

from privalign.audit.stats import assert_binomial, assert_chi_square, assert_ks
from privalign.errors import PrivacyParameterError
from privalign.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    NoisyArgmax,
    NoisyTopK,
    Peeling,
    RandomizedResponse,
    softmax,
)
from privalign.rng import SecureNoise, SeededNoise, as_noise_source

pytestmark = pytest.mark.statistical

ALPHA = 1e-4


def _source(kind: str, seed: int):
    return SeededNoise(np.random.default_rng(seed)) if kind == "seeded" else SecureNoise()


# Sample sizes: seeded sources are cheap; SecureNoise calls OpenDP once per query (~1 ms), so it is
# tested with small samples (the test still has its stated α; it just has less power).
N_ARGMAX = {"seeded": 20_000, "secure": 800}


@pytest.mark.parametrize("kind", ["seeded", "secure"])
def test_noisy_argmax_law_is_the_softmax(kind, seed):
    scores = np.array([0.0, 0.4, 1.0, 1.7]) if kind == "secure" else np.array([0.0, 0.3, 0.9, 1.4, 2.0, 2.1])
    # ε = 2 (scale 1): OpenDP's exact Gumbel sampler is several times slower at scales such as 4/3.
    m = NoisyArgmax(epsilon=2.0, sensitivity=1.0)
    n = N_ARGMAX[kind]
    idx = m(np.tile(scores, (n, 1)), rng=_source(kind, seed))
    counts = np.bincount(idx, minlength=scores.size)
    p = m.probabilities(scores)
    np.testing.assert_allclose(p, softmax(scores / m.scale))
    assert_chi_square(counts, p, ALPHA)


@pytest.mark.parametrize("kind", ["seeded", "secure"])
def test_gumbel_argmax_of_the_noise_source_is_softmax(kind, seed):
    """The NoiseSource primitive itself: argmax(s + Gumbel(β)) ~ softmax(s/β)."""
    src = _source(kind, seed)
    scores, beta = np.array([0.0, 1.0, 2.5]), 0.7
    n = N_ARGMAX[kind]
    idx = np.asarray(src.gumbel_argmax(np.tile(scores, (n, 1)), beta))
    assert_chi_square(np.bincount(idx, minlength=3), softmax(scores / beta), ALPHA)


def _ordered_pair_law(p: np.ndarray) -> dict[tuple[int, int], float]:
    """Law of the first two picks of exponential-mechanism peeling: p_i · p_j / (1 − p_i)."""
    return {(i, j): p[i] * p[j] / (1 - p[i]) for i, j in itertools.permutations(range(p.size), 2)}


@pytest.mark.parametrize("kind", ["seeded", "secure"])
def test_noisy_top_k_law_is_exponential_mechanism_peeling(kind, seed):
    scores = np.array([0.0, 0.5, 1.2, 2.0])
    m = NoisyTopK(k=2, epsilon=2.0, sensitivity=1.0)  # scale 1
    n = {"seeded": 20_000, "secure": 600}[kind]
    out = m(np.tile(scores, (n, 1)), rng=_source(kind, seed))
    law = _ordered_pair_law(softmax(scores / m.scale))
    keys = list(law)
    code = {k: c for c, k in enumerate(keys)}
    counts = np.bincount([code[(int(a), int(b))] for a, b in out], minlength=len(keys))
    assert_chi_square(counts, [law[k] for k in keys], ALPHA)


@pytest.mark.parametrize("kind", ["seeded", "secure"])
def test_randomized_response_flip_rate_is_exact(kind, seed):
    rr = RandomizedResponse(epsilon=0.8)
    n = {"seeded": 50_000, "secure": 20_000}[kind]
    src = _source(kind, seed)
    # Both input values, α split over the two binomial tests.
    for bit in (0, 1):
        out = rr(np.full(n, bit), rng=src)
        assert_binomial(int(np.sum(out != bit)), n, 1.0 / (1.0 + math.exp(0.8)), ALPHA / 2)


@pytest.mark.parametrize("kind", ["seeded", "secure"])
def test_gaussian_and_laplace_noise_laws(kind, seed):
    """Zero-signal trick: M(0) − 0 must be N(0, σ²) / Laplace(0, b); four KS tests at α/4 each."""
    n = {"seeded": 5_000, "secure": 400}[kind]
    src = _source(kind, seed)
    g = GaussianMechanism(sigma=1.7, sensitivity=1.0)
    lap = LaplaceMechanism(scale=0.6, sensitivity=1.0)
    assert_ks(g(np.zeros(n), rng=src), "norm", ALPHA / 4, args=(0.0, g.sigma))
    assert_ks(lap(np.zeros(n), rng=src), "laplace", ALPHA / 4, args=(0.0, lap.scale))
    # The noise source primitives with other scales.
    assert_ks(src.normal(0.25, n), "norm", ALPHA / 4, args=(0.0, 0.25))
    assert_ks(src.laplace(4.0, n), "laplace", ALPHA / 4, args=(0.0, 4.0))


def test_seeded_raw_gumbel_and_secure_uniform_laws(seed):
    n = 5_000
    assert_ks(SeededNoise(seed).gumbel(2.0, n), "gumbel_r", ALPHA / 3, args=(0.0, 2.0))
    sec = SecureNoise()
    u = sec.uniform(n)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert_ks(u, "uniform", ALPHA / 3)
    assert_ks(sec.gumbel(0.5, 2_000), "gumbel_r", ALPHA / 3, args=(0.0, 0.5))


# ------------------------------------------------------------------------------------------------
# Peeling: exact law of the ordered support, computed by numerical integration
# ------------------------------------------------------------------------------------------------


def _lap_pdf(x, b):
    return np.exp(-np.abs(x) / b) / (2 * b)


def _lap_cdf(x, b):
    return np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0) / b), 1 - 0.5 * np.exp(-np.maximum(x, 0) / b))


def _rnm_laplace_probs(a: np.ndarray, b: float) -> np.ndarray:
    """P(argmax_i a_i + Laplace(b)_i = i), by quad over the winner's noisy value."""
    out = np.empty(a.size)
    pts = sorted(set(a.tolist()))  # split the integral at the kinks of the Laplace pdf/cdf
    for i in range(a.size):
        others = np.delete(a, i)

        def f(x, i=i, others=others):
            return _lap_pdf(x - a[i], b) * np.prod(_lap_cdf(x - others, b))

        out[i] = sum(
            integrate.quad(f, lo, hi, epsabs=1e-13, limit=200)[0]
            for lo, hi in zip([-np.inf] + pts, pts + [np.inf])
        )
    return out


def _peeling_support_law(v: np.ndarray, s: int, b: float) -> dict[tuple[int, ...], float]:
    """Exact law of the ordered support: a product of Laplace report-noisy-max laws on the remaining set."""
    a = np.abs(v)
    cache: dict[tuple[int, ...], np.ndarray] = {}
    law: dict[tuple[int, ...], float] = {}
    for seq in itertools.permutations(range(a.size), s):
        prob, remaining = 1.0, list(range(a.size))
        for i in seq:
            key = tuple(remaining)
            if key not in cache:
                cache[key] = _rnm_laplace_probs(a[remaining], b)
            prob *= cache[key][remaining.index(i)]
            remaining.remove(i)
        law[seq] = prob
    return law


def test_peeling_support_law_matches_the_exact_law(seed):
    v = np.array([0.2, -0.9, 0.5, 0.0])
    p = Peeling(sparsity=2, epsilon=8.0, delta=1e-3, sensitivity=0.1)
    b = p.noise_scale
    law = _peeling_support_law(v, 2, b)
    assert abs(sum(law.values()) - 1.0) < 1e-8
    n = 20_000
    rng = np.random.default_rng(seed)
    out, support = p(np.tile(v, (n, 1)), rng=rng)
    keys = list(law)
    code = {k: c for c, k in enumerate(keys)}
    counts = np.bincount([code[tuple(r)] for r in support.tolist()], minlength=len(keys))
    assert_chi_square(counts, np.array([law[k] for k in keys]) / sum(law.values()), ALPHA / 2)
    # Released values: v_S + fresh Laplace(b) on the support.
    noise = np.take_along_axis(out, support, axis=1) - v[support]
    assert_ks(noise.ravel()[: 2 * 5_000 : 2], "laplace", ALPHA / 2, args=(0.0, b))


def test_secure_noise_refuses_seeds():
    for bad in (0, 42, np.random.default_rng(0), "seed"):
        with pytest.raises(PrivacyParameterError, match="'seed'"):
            SecureNoise(bad)
    assert SecureNoise().secure is True and SeededNoise(0).secure is False


def test_noise_source_conversion_and_permutation(seed):
    g = np.random.default_rng(seed)
    assert isinstance(as_noise_source(g), SeededNoise)
    sec = SecureNoise()
    assert as_noise_source(sec) is sec
    with pytest.raises(TypeError, match="'rng'"):
        as_noise_source(3)
    for src in (SeededNoise(seed), sec):
        perm = np.asarray(src.permutation(50))
        assert sorted(perm.tolist()) == list(range(50))
        top = np.asarray(src.gumbel_topk(np.array([[0.0, 5.0, 1.0, 9.0]]), 2, 0.0))
        np.testing.assert_array_equal(top, [[3, 1]])
