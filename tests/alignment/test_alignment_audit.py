"""Privacy audits on analytically worst-case neighbours (Clopper–Pearson, Bonferroni; α stated), each
with a deliberately broken accountant or mechanism that the audit must catch.

* PrivITP phase 2, conditional on λ̃ (the released value), pair pool B = (0,…,0) vs (Δ,…,Δ), Δ = R_max:
  outcome t = 1 has log-ratio exactly ℓ2 and the fallback exactly n·ℓ1. The empirical lower bound on each
  outcome's log-ratio must stay below the accountant's ε2(outcome; λ̃); the authors' width W = R_max − λ̃
  under-states ℓ2 and is caught.
* PrivITP phase 1, pool A = (0,…,0) vs (R_max,…,R_max) (λ̂ moves by exactly Δ): events {λ̃ > c}; the
  analytic-Gaussian ε1 passes, the authors' ε1 = Δ/σ_X (K4) is refuted.
* PrivBoN, pair (1,0,…,0) vs (0,1,…,1): ε passes; a Δ/ε-scale mechanism is caught.
"""

import math

import numpy as np
import pytest

from privalign.accounting.expost import ell1, ell2
from privalign.alignment import FALLBACK, PrivBoN, PrivITP
from privalign.audit.stats import clopper_pearson

ALPHA = 1e-3  # false-positive probability of each audit (Bonferroni over all its intervals)


def _outcome_counts(idx, n):
    return np.bincount(np.where(idx == FALLBACK, n, idx), minlength=n + 1)


def _log_ratio_lower_bounds(c_num, c_den, n_draws, alpha):
    k = 2 * c_num.size
    lo, _ = clopper_pearson(c_num, n_draws, alpha / k)
    _, hi = clopper_pearson(c_den, n_draws, alpha / k)
    with np.errstate(divide="ignore"):
        return np.where(lo > 0, np.log(lo) - np.log(hi), -np.inf)


@pytest.mark.statistical
@pytest.mark.parametrize("lam,sigma_z", [(0.3, 1.0), (-0.05, 0.5), (0.6, 0.7)])
def test_privitp_phase2_audit(rng, lam, sigma_z):
    n, draws, L = 2, 150_000, 3.0
    m = PrivITP(0.05, sigma_x=1.0, sigma_z=sigma_z, L=L)
    zeros, ones = np.zeros((draws, n)), np.ones((draws, n))
    lt = np.full(draws, lam)
    c0 = _outcome_counts(m.phase2(zeros, lt, rng)[0], n)
    c1 = _outcome_counts(m.phase2(ones, lt, rng)[0], n)
    t = np.array([1, 2, -1])
    claim = m.accountant.epsilon2(t, n, np.full(3, lam))
    # both directions, every outcome
    lb = np.maximum(
        _log_ratio_lower_bounds(c1, c0, draws, ALPHA / 2), _log_ratio_lower_bounds(c0, c1, draws, ALPHA / 2)
    )
    assert np.all(lb <= claim), (lb, claim)
    # broken accountant: the authors' width W = R_max − λ̃
    wb = 1.0 - lam
    broken_l2 = float(ell2(lam, width=wb, r_max=1, sensitivity=1, sigma_z=sigma_z))
    broken_l1 = float(ell1(lam, width=wb, r_max=1, sensitivity=1, sigma_z=sigma_z))
    broken = np.array([broken_l2, broken_l1 + broken_l2, n * broken_l1])
    assert np.any(lb > broken), (lb, broken)


@pytest.mark.statistical
def test_privitp_phase1_audit(rng):
    """(ε, δ) event-form check on λ̃: P[λ̃(D) > c] − e^ε·P[λ̃(D′) > c] ≤ δ for thresholds fixed a priori."""
    draws, delta, sx = 100_000, 1e-6, 1.0
    m = PrivITP(0.05, sigma_x=sx, sigma_z=0.5, delta=delta)
    b = np.full((draws, 2), 0.5)
    lt1 = m.select_batch(np.ones((draws, 4)), rng=rng, pool_b_scores=b).diagnostics["lambda_tilde"]
    lt0 = m.select_batch(np.zeros((draws, 4)), rng=rng, pool_b_scores=b).diagnostics["lambda_tilde"]
    thresholds = np.array([0.0, 0.3, 0.6, 0.9])
    k = 2 * thresholds.size
    c1 = np.array([(lt1 > c).sum() for c in thresholds])
    c0 = np.array([(lt0 > c).sum() for c in thresholds])
    p_lo, _ = clopper_pearson(c1, draws, ALPHA / k)
    _, q_hi = clopper_pearson(c0, draws, ALPHA / k)

    def refuted(eps):
        return bool(np.any(p_lo - math.exp(eps) * q_hi > delta))

    assert not refuted(m.accountant.epsilon1)
    assert refuted(1.0 / sx)  # the authors' ε1 = Δ/σ_X (K4) is caught


@pytest.mark.statistical
def test_privbon_audit_with_negative_control(rng):
    draws, eps = 40_000, 1.0
    d = np.array([1.0, 0, 0, 0, 0])
    dp = np.array([0.0, 1, 1, 1, 1])
    m = PrivBoN(eps)
    c = np.bincount(m.select_batch(np.tile(d, (draws, 1)), rng=rng).indices, minlength=5)
    cp = np.bincount(m.select_batch(np.tile(dp, (draws, 1)), rng=rng).indices, minlength=5)
    lb = np.maximum(
        _log_ratio_lower_bounds(c, cp, draws, ALPHA / 2), _log_ratio_lower_bounds(cp, c, draws, ALPHA / 2)
    )
    assert lb.max() <= eps
    broken = PrivBoN(2 * eps)  # Gumbel scale Δ/ε: what the claim ε would give without the factor 2
    c = np.bincount(broken.select_batch(np.tile(d, (draws, 1)), rng=rng).indices, minlength=5)
    cp = np.bincount(broken.select_batch(np.tile(dp, (draws, 1)), rng=rng).indices, minlength=5)
    lb = np.maximum(
        _log_ratio_lower_bounds(c, cp, draws, ALPHA / 2), _log_ratio_lower_bounds(cp, c, draws, ALPHA / 2)
    )
    assert lb.max() > eps


@pytest.mark.statistical
def test_privitp_fallback_audit_catches_k8(rng):
    """Negative control for charging the fallback as a stop at n (``(n − 1)·ℓ1 + ℓ2``): where ℓ1 > ℓ2 —
    here β = 0.5, L = 0, λ̃ = −β, so the threshold interval [−0.5, 1] sits low and rejections are the
    informative outcome — the fallback's true worst-case loss n·ℓ1 exceeds the authors' charge
    (n−1)·ℓ1 + ℓ2. Pair pool B = (1, 1) vs (0, 0): the fallback's log-ratio is exactly n·ℓ1. The
    accountant's ε2 must not be refuted and the authors' charge must be (false-positive probability ≤ ALPHA
    for the first assertion)."""
    n, draws, lam = 2, 100_000, -0.5
    m = PrivITP(0.5, sigma_x=1.0, sigma_z=0.5, L=0.0)
    lt = np.full(draws, lam)
    c_hi = _outcome_counts(m.phase2(np.ones((draws, n)), lt, rng)[0], n)
    c_lo = _outcome_counts(m.phase2(np.zeros((draws, n)), lt, rng)[0], n)
    claim = m.accountant.epsilon2(np.array([1, 2, -1]), n, np.full(3, lam))
    lb = np.maximum(
        _log_ratio_lower_bounds(c_hi, c_lo, draws, ALPHA / 2),
        _log_ratio_lower_bounds(c_lo, c_hi, draws, ALPHA / 2),
    )
    assert np.all(lb <= claim), (lb, claim)
    l1 = float(ell1(lam, width=m.width(lam), r_max=1, sensitivity=1, sigma_z=0.5))
    l2 = float(ell2(lam, width=m.width(lam), r_max=1, sensitivity=1, sigma_z=0.5))
    assert l1 > l2 and claim[2] == pytest.approx(n * l1)
    assert lb[n] > (n - 1) * l1 + l2, (lb, (n - 1) * l1 + l2)  # the authors' fallback charge is refuted


@pytest.mark.statistical
def test_privitp_phase1_audit_on_tied_neighbours(rng, monkeypatch):
    """Issue 11: phase 1 on tie-heavy neighbours, with the pre-fix normaliser as the negative control.

    Pool A = (0.99, 0.79, 0.89) vs every score lowered by Δ = 0.01, β = 0.1: the exact roots are 0.79 (a
    score: the root sits on a tie) and 0.78, so λ̂ moves by exactly Δ, the Gaussian mechanism's worst case.
    The pre-fix solver returns 0.69 on the first pool (one-ulp miss, last interval forced) and 0.78 on the
    second: it moves by 9Δ, which the audit must catch. Event form ``P[λ̃(D) ∈ E] − e^ε·P[λ̃(D′) ∈ E] ≤ δ``
    for the events {λ̃ > c}, {λ̃ ≤ c} with thresholds fixed a priori, both directions; Clopper–Pearson with
    Bonferroni over every interval; false-positive probability of the first assertion ≤ ALPHA.
    """
    import privalign.alignment.priv_itp as priv_itp_module
    from privalign.audit.broken import broken_solve_normalizer

    draws, delta, sx, d = 100_000, 1e-6, 0.01, 0.01
    a = np.array([0.99, 0.79, 0.89])
    a_prime = a - d
    thresholds = np.array([0.70, 0.735, 0.76, 0.775, 0.78, 0.785, 0.79, 0.80])

    def lambda_tilde(m, pool):
        b = np.full((draws, 2), 0.5)
        return m.select_batch(np.tile(pool, (draws, 1)), rng=rng, pool_b_scores=b).diagnostics["lambda_tilde"]

    def refuted(m, eps):
        x, y = lambda_tilde(m, a), lambda_tilde(m, a_prime)
        k = 4 * thresholds.size  # 2 event types × 2 directions × thresholds
        found = False
        for u, v in ((x, y), (y, x)):
            for above in (True, False):
                cu = np.array([((u > c) if above else (u <= c)).sum() for c in thresholds])
                cv = np.array([((v > c) if above else (v <= c)).sum() for c in thresholds])
                p_lo, _ = clopper_pearson(cu, draws, ALPHA / k)
                _, q_hi = clopper_pearson(cv, draws, ALPHA / k)
                found |= bool(np.any(p_lo - math.exp(eps) * q_hi > delta))
        return found

    m = PrivITP(0.1, sigma_x=sx, sigma_z=0.5, sensitivity=d, delta=delta)
    assert m.accountant.epsilon1 < 10.0
    assert not refuted(m, m.accountant.epsilon1)
    monkeypatch.setattr(priv_itp_module, "solve_normalizer", broken_solve_normalizer)
    assert refuted(m, m.accountant.epsilon1)  # the pre-fix normaliser is caught
