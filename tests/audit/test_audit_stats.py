"""The statistical toolkit itself: exact intervals and tests that reject wrong laws.

Tests that expect *no* rejection under H0 have false-positive rate ALPHA (stated per test); tests that
expect a rejection use alternatives far enough from H0 that the rejection probability is ≈ 1 (the
p-values printed on failure show by how much).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from privalign.audit import (
    StatisticalAssertionError,
    assert_binomial,
    assert_chi_square,
    assert_ks,
    audit_mechanism,
    audit_threshold,
    binomial_test,
    chi_square_test,
    clopper_pearson,
    epsilon_lower_bound,
    ks_test,
    merge_bins,
)
from privalign.errors import PrivacyParameterError

ALPHA = 1e-4


def test_clopper_pearson_known_values_and_edges():
    lo, hi = clopper_pearson(0, 10, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10))
    lo, hi = clopper_pearson(10, 10, 0.05)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10))
    lo, hi = clopper_pearson(5, 10, 0.05)  # textbook value (0.1871, 0.8129)
    assert lo == pytest.approx(0.18709, abs=1e-5) and hi == pytest.approx(0.81291, abs=1e-5)
    lo, hi = clopper_pearson(np.array([1, 2]), np.array([4, 8]), 0.1)
    assert lo.shape == (2,) and np.all(lo < hi)
    with pytest.raises(PrivacyParameterError):
        clopper_pearson(5, 3, 0.05)
    with pytest.raises(PrivacyParameterError, match="'alpha'"):
        clopper_pearson(1, 3, 0.0)


def test_clopper_pearson_coverage_is_at_least_nominal():
    # Exact coverage by summing the binomial pmf over k: never below 1 − α.
    for n, p in [(20, 0.1), (50, 0.5), (200, 0.03)]:
        k = np.arange(n + 1)
        lo, hi = clopper_pearson(k, n, 0.05)
        cover = stats.binom.pmf(k, n, p)[(lo <= p) & (p <= hi)].sum()
        assert cover >= 0.95 - 1e-12


def test_merge_bins_depends_only_on_expected():
    e = np.array([1.0, 2.0, 50.0, 3.0, 0.5, 40.0])
    o = np.array([9, 9, 9, 9, 9, 9])
    em, om, merged = merge_bins(e, o)
    assert np.all(em >= 5) and em.sum() == pytest.approx(e.sum()) and om.sum() == o.sum()
    assert merged == 3


def test_chi_square_accepts_the_true_law_and_rejects_a_wrong_one(rng):
    p = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
    counts = rng.multinomial(5_000, p)
    res = assert_chi_square(counts, p, ALPHA)
    assert res.details["df"] >= 1 and res.critical_value == pytest.approx(
        stats.chi2.isf(ALPHA, res.details["df"])
    )
    wrong = rng.multinomial(5_000, [0.45, 0.35, 0.15, 0.05, 0.0])
    with pytest.raises(StatisticalAssertionError, match="false-positive probability"):
        assert_chi_square(wrong, p, ALPHA)
    impossible = counts.copy()
    impossible[-1] = 1
    assert chi_square_test(impossible, p, ALPHA).rejected
    with pytest.raises(PrivacyParameterError, match="'probabilities'"):
        chi_square_test(counts, [0.5, 0.5, 0.5, 0.0, 0.0], ALPHA)


def test_ks_uses_the_exact_kstwo_critical_value(rng):
    x = rng.normal(0.0, 2.0, 3_000)
    res = assert_ks(x, "norm", ALPHA, args=(0.0, 2.0))
    assert res.critical_value == pytest.approx(stats.kstwo.isf(ALPHA, 3_000))
    # Half the scale (the classic factor-2 bug) is rejected.
    assert ks_test(x, "norm", ALPHA, args=(0.0, 1.0)).rejected


def test_binomial_test(rng):
    k = int(rng.binomial(10_000, 0.2))
    assert_binomial(k, 10_000, 0.2, ALPHA)
    assert binomial_test(2_600, 10_000, 0.2, ALPHA).rejected
    with pytest.raises(StatisticalAssertionError):
        assert_binomial(2_600, 10_000, 0.2, ALPHA)


def test_epsilon_lower_bound_on_exact_counts():
    # Both sides with 10^6 draws and the exact e^1 ratio: the bound is below 1 but close.
    n = 1_000_000
    p, q = 0.7310585786300049, 0.2689414213699951
    res = epsilon_lower_bound(
        [round(n * p), round(n * q)], [round(n * q), round(n * p)], n, n, alpha=1e-3, claimed_epsilon=1.0
    )
    assert 0.97 < res.epsilon_lower_bound < 1.0 and res.passed and res.n_intervals == 4
    # δ is subtracted before the ratio.
    res_d = epsilon_lower_bound([500], [100], 1000, 1000, alpha=1e-3, delta=0.3)
    res_0 = epsilon_lower_bound([500], [100], 1000, 1000, alpha=1e-3)
    assert res_d.epsilon_lower_bound < res_0.epsilon_lower_bound
    # No evidence at all: ε̂ = 0.
    assert epsilon_lower_bound([0, 0], [0, 0], 10, 10, alpha=0.01).epsilon_lower_bound == 0.0
    with pytest.raises(PrivacyParameterError):
        epsilon_lower_bound([1, 2], [1], 10, 10, alpha=0.01)


def test_audit_front_ends_validate_the_samplers(rng):
    with pytest.raises(PrivacyParameterError, match="sample_d"):
        audit_mechanism(lambda n: np.zeros(n - 1), lambda n: np.zeros(n), 10, 0.01)
    with pytest.raises(PrivacyParameterError, match="outside 'outcomes'"):
        audit_mechanism(lambda n: np.full(n, 2), lambda n: np.zeros(n), 10, 0.01, outcomes=[0, 1])
    with pytest.raises(PrivacyParameterError, match="'thresholds'"):
        audit_threshold(lambda n: np.zeros(n), lambda n: np.zeros(n), 10, 0.01, thresholds=[])
    # A constant "mechanism" vs a different constant: infinite privacy loss, but the bound stays finite
    # and large (it is limited by the sample size).
    res = audit_mechanism(lambda n: np.zeros(n), lambda n: np.ones(n), 1000, 0.01, claimed_epsilon=1.0)
    assert res.epsilon_lower_bound > 5 and res.passed is False and res.verdict == "violation"
