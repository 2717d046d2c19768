"""The ITP normaliser λ̂: the root of (1/n) Σ_i relu((r_i − λ)/β) = 1, by sort-and-scan.

``F(λ) = (1/n) Σ_i relu((r_i − λ)/β)`` is continuous, strictly decreasing on (−∞, max r), ``F(−∞) = ∞``
and ``F(max r) = 0``, so the root is unique. If exactly the sorted indices ``≥ k`` lie above λ the
equation is linear, ``λ_k = (Σ_{i≥k} r_(i) − n·β)/(n − k)``, valid iff ``r_(k−1) ≤ λ_k < r_(k)``. The
solver sorts once and checks every k at once (vectorized over rows): O(n log n) per row.

Properties (spec-inference-time §2.2, property-tested in ``tests/alignment``):
(i) ``|F(λ̂) − 1| ≤ 1e-9``; (ii) ``max(mean r − β, max r − n·β) ≤ λ̂ ≤ max r − β``; (iii) translation
equivariance; (iv) monotonicity; (v) 1-Lipschitz in ℓ∞ (proof in ``docs/privacy/privitp.md``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from privalign._validation import check_real
from privalign.errors import PrivacyParameterError

__all__ = ["solve_normalizer", "normalizer_residual"]


def solve_normalizer(scores: ArrayLike, beta: float) -> np.ndarray | float:
    """Solve ``(1/n) Σ_i relu((r_i − λ)/β) = 1`` for λ, row-wise.

    Args:
      scores: A 1-D array of n rewards, or a 2-D array (one row per prompt, n columns). Finite.
      beta: The regularisation strength β > 0.

    Returns:
      λ̂ as a float for 1-D input, or an array of shape ``(rows,)`` for 2-D input.

    Raises:
      PrivacyParameterError: β ≤ 0, an empty or non-finite ``scores``.
    """
    beta = check_real(beta, "beta", low=0.0, closed="neither")
    r = np.asarray(scores, dtype=np.float64)
    one_d = r.ndim == 1
    if r.ndim not in (1, 2):
        raise PrivacyParameterError(f"The 'scores' parameter must be a 1-D or 2-D array. Got shape {r.shape} instead.")
    if r.size == 0 or r.shape[-1] == 0:
        raise PrivacyParameterError(f"The 'scores' parameter must have at least one candidate. Got shape {r.shape} instead.")
    if not np.isfinite(r).all():
        raise PrivacyParameterError("The 'scores' parameter must contain only finite values. Got NaN or inf.")
    if one_d:
        r = r[None, :]
    n = r.shape[1]
    s = np.sort(r, axis=1)
    # suffix sums S_k = Σ_{i≥k} s_i (computed from the right for accuracy)
    suffix = np.cumsum(s[:, ::-1], axis=1)[:, ::-1]
    k = np.arange(n)
    lam = (suffix - n * beta) / (n - k)
    prev = np.concatenate([np.full((s.shape[0], 1), -np.inf), s[:, :-1]], axis=1)
    valid = (prev <= lam) & (lam < s)
    valid[:, -1] = True  # floating-point guard; the k = n−1 candidate is always valid in exact arithmetic
    first = np.argmax(valid, axis=1)
    out = lam[np.arange(s.shape[0]), first]
    return float(out[0]) if one_d else out


def normalizer_residual(scores: ArrayLike, beta: float, lam: ArrayLike) -> np.ndarray:
    """``F(λ) − 1`` row-wise (diagnostic; 0 at the root)."""
    r = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    lam = np.atleast_1d(np.asarray(lam, dtype=np.float64))
    return np.mean(np.maximum((r - lam[:, None]) / beta, 0.0), axis=1) - 1.0
