"""Statistical and privacy tests: RR flip rate, debiased gradient, Peeling sensitivity and audit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privalign.estimation import iht as iht_mod
from privalign.estimation.base import sigmoid
from privalign.estimation.iht import (
    debiased_gradient,
    debiased_loss,
    gradient_step,
    peeling_sensitivity,
    peeling_threshold,
)
from privalign.estimation.labels import debiased_labels, privatize_labels


@pytest.mark.statistical
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
def test_rr_flip_rate_binomial(epsilon, rng):
    """Exact two-sided binomial test of the flip count against 1/(1+e^ε); α = 1e-4 per ε (3 ε's:
    family-wise 3e-4). Negative control: flip probability 1/(1+e^{2ε}) must be rejected."""
    alpha = 1e-4
    n = 200_000
    y = (rng.random(n) < 0.5).astype(np.float64)
    y_tilde, rho, event = privatize_labels(y, epsilon, rng)
    assert rho == pytest.approx(1.0 / (1.0 + math.exp(epsilon)), rel=1e-12)
    assert event.unit == "label" and event.epsilon == epsilon
    flips = int(np.sum(y_tilde != y))
    assert stats.binomtest(flips, n, rho).pvalue > alpha
    # Broken control: the count a wrong flip rate would produce is rejected against the claimed ρ.
    wrong = 1.0 / (1.0 + math.exp(2 * epsilon))
    broken_flips = int(np.sum(rng.random(n) < wrong))
    assert stats.binomtest(broken_flips, n, rho).pvalue <= alpha


def test_debiased_gradient_forms_agree(rng):
    X = rng.uniform(-1, 1, size=(50, 7))
    theta = rng.normal(size=7)
    y_tilde = (rng.random(50) < 0.5).astype(float)
    for eps in (0.5, 1.0, 3.0):
        rho = 1.0 / (1.0 + math.exp(eps))
        g1, g2, g3 = (debiased_gradient(X, y_tilde, theta, rho, form=f) for f in (1, 2, 3))
        np.testing.assert_allclose(g1, g3, rtol=0, atol=1e-12)
        np.testing.assert_allclose(g2, g3, rtol=0, atol=1e-12)
        # form (2) is the gradient of the Natarajan loss: central finite differences
        h = 1e-6
        fd = np.array(
            [
                (
                    debiased_loss(X, y_tilde, theta + h * e, rho)
                    - debiased_loss(X, y_tilde, theta - h * e, rho)
                )
                / (2 * h)
                for e in np.eye(7)
            ]
        )
        np.testing.assert_allclose(fd, g2.mean(axis=0), rtol=0, atol=1e-7)


@pytest.mark.statistical
def test_debiased_gradient_is_unbiased(rng):
    """E[g̃_i] = ∇ℓ_{y_i}, tested exactly. For one sample, the mean of M debiased gradients is affine in
    K = #{ỹ = 1} ~ Binomial(M, p): mean g̃ = (σ − b − (a − b)K/M)·x with a, b the two values of ŷ. So
    E[g̃] = ∇ℓ_y ⟺ p = p0 := (y − b)/(a − b). We recover K from the library's gradients and run an exact
    binomial test of p = p0 per sample (4 samples × 2 ε: Bonferroni, family-wise α = 1e-3).
    Negative control: the naive gradient ∇ℓ_ỹ (no debiasing) must be rejected."""
    alpha = 1e-3 / 8
    M = 20_000
    X = np.array([[0.5, -1.0, 0.25], [-0.75, 0.5, 1.0], [1.0, 1.0, -0.5], [0.2, -0.3, 0.9]])
    y = np.array([1.0, 0.0, 1.0, 0.0])
    theta = np.array([0.3, -0.7, 1.1])
    sig = sigmoid(X @ theta)
    true_grad = (sig - y)[:, None] * X
    for eps in (0.5, 2.0):
        yt, rho, _ = privatize_labels(np.tile(y, M), eps, rng)  # M independent RR draws of the 4 labels
        # the library's per-sample debiased gradients (form 3), on the stacked design
        draws = debiased_gradient(np.tile(X, (M, 1)), yt, theta, rho, form=3).reshape(M, 4, 3)
        naive = ((np.tile(sig, M) - yt)[:, None] * np.tile(X, (M, 1))).reshape(M, 4, 3)
        a, b = debiased_labels(np.array([1.0, 0.0]), rho)
        for i in range(4):
            j = int(np.argmax(np.abs(X[i])))
            K = round(M * ((sig[i] - draws[:, i, j].mean() / X[i, j]) - b) / (a - b))
            p0 = (y[i] - b) / (a - b)
            assert stats.binomtest(K, M, p0).pvalue > alpha, (eps, i)
            # negative control: without debiasing, E[∇ℓ_ỹ] = ∇ℓ_y needs P(ỹ = 1) = y, which RR violates
            K_naive = round(M * (sig[i] - naive[:, i, j].mean() / X[i, j]))
            assert stats.binomtest(K_naive, M, float(y[i])).pvalue <= alpha, (eps, i)
        assert np.isfinite(true_grad).all()


def test_gradient_step_sensitivity_bound(rng):
    """Replacing one comparison moves v = θ − ηg by at most λ = 2ηc_x/m in ℓ∞ (random θ, adversarial
    swaps)."""
    m, d, eta, c = 40, 12, 3.0, 1.0
    lam = peeling_sensitivity(eta, c, m)
    assert lam == 2 * eta * c / m
    worst = 0.0
    for _ in range(200):
        X = rng.uniform(-c, c, size=(m, d))
        y = (rng.random(m) < 0.5).astype(float)
        theta = rng.normal(scale=5.0, size=d)
        X2, y2 = X.copy(), y.copy()
        X2[0] = c * np.sign(rng.normal(size=d))
        y2[0] = 1.0 - y[0]
        diff = np.max(np.abs(gradient_step(X, y, theta, eta) - gradient_step(X2, y2, theta, eta)))
        worst = max(worst, diff)
        assert diff <= lam * (1 + 1e-12)
    assert worst > 0.5 * lam  # the bound is nearly attained, so it is the right scale


def _worst_case_batches(h_over_c: float = 1.0):
    """Neighbouring batches D, D′ (m = 10, d = 4, c_x = 1, θ = (B, t, t, t)) whose step vectors differ by
    ≈ λ = 2ηc_x/m on coordinates 1..3 in the classic (low, high, high) vs (high, low, low) pattern.

    The changed record has x_0 = c_x and y = 0 on both sides, so σ(xᵀθ) ≈ 1 (B = 20 ≫ t) and its
    gradient is ≈ x: x = (1, 1, −1, −1) in D and x′ = (1, −1, 1, 1) in D′. The other 9 rows are 0.
    Coordinate 0 (v_0 ≈ B) is selected first; the second selection decides between 1..3.
    """
    m, d, eta = 10, 4, 1.0
    h = eta / m
    t = 2.0 * h
    theta = np.array([20.0, t, t, t])
    X = np.zeros((m, d))
    X[0] = [1.0, 1.0, -1.0, -1.0]
    Xp = X.copy()
    Xp[0] = [1.0, -1.0, 1.0, 1.0]
    y = np.zeros(m)
    return X, Xp, y, theta, eta, m


def _support_code(out: np.ndarray) -> np.ndarray:
    nz = out != 0
    return (nz * (1 << np.arange(out.shape[1]))).sum(axis=1)


def _audit_step(rng, *, epsilon, delta, n):
    from privalign.audit.audit import audit_mechanism

    X, Xp, y, theta, eta, m = _worst_case_batches()
    v, vp = gradient_step(X, y, theta, eta), gradient_step(Xp, y, theta, eta)
    lam = 2 * eta / m
    assert np.max(np.abs(v - vp)) == pytest.approx(lam, rel=1e-6)

    def sampler(vec):
        def draw(k):
            out, _ = peeling_threshold(
                np.tile(vec, (k, 1)),
                m,
                sparsity=2,
                epsilon=epsilon,
                delta=delta,
                step_size=eta,
                feature_bound=1.0,
                rng=rng,
            )
            return _support_code(out)

        return draw

    outcomes = sorted({(1 << i) | (1 << j) for i in range(4) for j in range(i + 1, 4)})
    return audit_mechanism(
        sampler(v), sampler(vp), n=n, alpha=1e-3, claimed_epsilon=epsilon, delta=delta, outcomes=outcomes
    )


@pytest.mark.statistical
def test_privacy_audit_of_one_sample_dp_iht_step(rng, monkeypatch):
    """Clopper–Pearson audit (α = 1e-3, Bonferroni over the 2×6 support outcomes) of one Sample-DP IHT
    step — gradient step on the worst-case neighbouring batches above, then the estimator's Peeling at
    ε = 1, δ = 1e-5, s = 2. The empirical lower bound must not exceed ε. Negative control: the same step
    with the sensitivity computed from the full data size instead of the batch size (λ/T with T = 10,
    i.e. a 10× too small scale — the classic disjoint-batch bug) must be flagged."""
    epsilon, delta, n = 1.0, 1e-5, 30_000
    ok = _audit_step(rng, epsilon=epsilon, delta=delta, n=n)
    assert ok.passed, ok.to_dict()

    real = iht_mod.peeling_sensitivity
    monkeypatch.setattr(iht_mod, "peeling_sensitivity", lambda eta, c, m: real(eta, c, m) / 10.0)
    broken = _audit_step(rng, epsilon=epsilon, delta=delta, n=n)
    assert not broken.passed, broken.to_dict()
    assert broken.epsilon_lower_bound > epsilon
