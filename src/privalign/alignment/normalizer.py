"""The ITP normaliser λ̂: the root of (1/n) Σ_i relu((r_i − λ)/β) = 1, certified on every input.

``F(λ) = (1/n) Σ_i relu((r_i − λ)/β)`` is continuous, non-increasing, strictly decreasing on
(−∞, max r), ``F(−∞) = ∞`` and ``F(max r) = 0``, so the root is unique. Write ``S(λ) = n·β·F(λ)`` and
``s_0 ≤ … ≤ s_{n−1}`` for the sorted scores.

Algorithm (vectorized over rows, O(n log n) per row):

1. ``T_j = S(s_j) = Σ_{i>j} (s_i − s_j)`` by the recursion ``T_j = T_{j+1} + (n−j−1)(s_{j+1} − s_j)``
   from the right. Every added term is ≥ 0, so the computed ``T`` is non-increasing in ``j`` *exactly*
   (floating-point addition of a non-negative number never decreases): locating the crossing cannot be
   fooled by rounding, and ties (``s_{j+1} = s_j``) add exact zeros.
2. ``J = #{j : T_j ≥ nβ}``. If ``J = 0`` the root is below ``s_0`` and every score is active:
   ``λ = s_0 − (nβ − T_0)/n``. Otherwise the root is in ``[s_{J−1}, s_J]`` with the ``m = n − J`` scores
   above it active: ``λ = s_{J−1} + (T_{J−1} − nβ)/m``, clamped into that interval.
3. One Newton step on ``S`` evaluated directly (pairwise summation), which is exact on the linear piece.
4. **Certificate.** With ``τ = 2⁻⁴⁰·(max r − min r + β)`` the solver checks, with margins for the
   summation error, that ``S(λ − τ/2) ≥ nβ ≥ S(λ + τ/2)`` (the two points rounded to float), i.e. that
   the exact root lies within ``τ/2 + ulp(λ)/2 ≤ τ`` of λ.
   Rows whose check fails (never observed; kept so the guarantee is not assumed) are solved in exact
   rational arithmetic (``fractions.Fraction``) and rounded to the nearest float.

Guarantee: ``|λ̂ − λ*| ≤ τ`` for every row with ``|λ*|`` below ``2¹²·(max r − min r + β)`` (always
true for scores in a public range ``[0, R_max]``; otherwise ``|λ̂ − λ*| ≤ ulp(λ*)``, the float64 limit).
Hence ``|F(λ̂) − 1| ≤ τ/β``, i.e. ≤ 1e-9 whenever ``β ≥ 1e-3·(max r − min r + β)``.

Properties (spec-inference-time §2.2, property-tested in ``tests/alignment`` on continuous, grid-valued,
tied, all-equal and clipped scores): (i) residual; (ii) ``max(mean r − β, max r − n·β) ≤ λ̂ ≤ max r − β``;
(iii) translation equivariance; (iv) monotonicity; (v) 1-Lipschitz in ℓ∞ up to 2τ (proof and the
accounting of the 2τ slack in ``docs/privacy/privitp.md``).

Versions before this solver (commits up to 96b6291) used a sort-and-scan that tested
``s_{k−1} ≤ λ_k < s_k`` in floating point and forced the last interval when no test passed; at exact ties
it returned roots off by up to 10.9 (see CHANGELOG.md).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from privalign._validation import check_real
from privalign.accounting.expost import NORMALIZER_CERTIFICATE_REL
from privalign.errors import PrivacyParameterError

__all__ = ["solve_normalizer", "normalizer_residual", "normalizer_tolerance", "CERTIFICATE_REL"]

#: Relative width of the certificate: ``τ = CERTIFICATE_REL · (max r − min r + β)``.
CERTIFICATE_REL = NORMALIZER_CERTIFICATE_REL
_EPS = np.finfo(np.float64).eps


def normalizer_tolerance(spread: ArrayLike, beta: float) -> np.ndarray | float:
    """The certified bound τ on ``|λ̂ − λ*|`` for scores whose range (max − min) is ``spread``.

    For scores in a public range ``[0, R_max]`` the data-independent bound is
    ``normalizer_tolerance(R_max, beta)``; :class:`~privalign.alignment.PrivITP` accounts for it.
    """
    return CERTIFICATE_REL * (np.asarray(spread, dtype=np.float64) + float(beta))


def _check(scores: ArrayLike, beta: float) -> tuple[np.ndarray, float, bool]:
    beta = check_real(beta, "beta", low=0.0, closed="neither")
    r = np.asarray(scores, dtype=np.float64)
    if r.ndim not in (1, 2):
        raise PrivacyParameterError(
            f"The 'scores' parameter must be a 1-D or 2-D array. Got shape {r.shape} instead."
        )
    if r.size == 0 or r.shape[-1] == 0:
        raise PrivacyParameterError(
            f"The 'scores' parameter must have at least one candidate. Got shape {r.shape} instead."
        )
    if not np.isfinite(r).all():
        raise PrivacyParameterError("The 'scores' parameter must contain only finite values. Got NaN or inf.")
    one_d = r.ndim == 1
    return (r[None, :] if one_d else r), beta, one_d


def _S(s: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """``S(λ) = Σ_i relu(s_i − λ)`` row-wise (pairwise summation along the contiguous axis)."""
    return np.sum(np.maximum(s - lam[:, None], 0.0), axis=1)


def _exact_root(row: np.ndarray, beta: float) -> float:
    """The exact root in rational arithmetic, rounded to the nearest float (the fallback)."""
    s = sorted(Fraction(float(x)) for x in row)
    n = len(s)
    c = n * Fraction(beta)
    t = Fraction(0)  # T_j, from the right
    for j in range(n - 1, -1, -1):
        if j < n - 1:
            t += (n - j - 1) * (s[j + 1] - s[j])
        if t >= c:  # the crossing: T_j ≥ nβ > T_{j+1}
            return float(s[j] + (t - c) / (n - j - 1))
    return float(s[0] - (c - t) / n)


def solve_normalizer(scores: ArrayLike, beta: float) -> np.ndarray | float:
    """Solve ``(1/n) Σ_i relu((r_i − λ)/β) = 1`` for λ, row-wise, with a certified error bound.

    Args:
      scores: A 1-D array of n rewards, or a 2-D array (one row per prompt, n columns). Finite.
      beta: The regularisation strength β > 0.

    Returns:
      λ̂ as a float for 1-D input, or an array of shape ``(rows,)`` for 2-D input, within
      :func:`normalizer_tolerance` of the exact root (see the module docstring).

    Raises:
      PrivacyParameterError: β ≤ 0, an empty or non-finite ``scores``.

    >>> solve_normalizer([1.0, 0.8, 0.9], 0.1)   # the root coincides with a score
    0.8
    """
    r, beta, one_d = _check(scores, beta)
    # Rows are independent: solve blocks of about 2 MB so that the sort and the temporaries stay in cache
    # (the same operations row by row, so the result does not depend on the block size).
    step = max(1, (1 << 18) // r.shape[1])
    if r.shape[0] > step:
        lam = np.concatenate([_solve_rows(r[i : i + step], beta) for i in range(0, r.shape[0], step)])
    else:
        lam = _solve_rows(r, beta)
    return float(lam[0]) if one_d else lam


def _solve_rows(r: np.ndarray, beta: float) -> np.ndarray:
    p, n = r.shape
    s = np.sort(r, axis=1)
    c = n * beta
    rows = np.arange(p)
    # 1. T_j = S(s_j): non-increasing in j by construction (non-negative increments only)
    t = np.zeros((p, n))
    if n > 1:
        inc = np.diff(s, axis=1) * np.arange(n - 1, 0, -1, dtype=np.float64)
        t[:, :-1] = np.cumsum(inc[:, ::-1], axis=1)[:, ::-1]
    # 2. the crossing and the linear piece
    big_j = np.count_nonzero(t >= c, axis=1)
    j = np.maximum(big_j - 1, 0)
    m = np.where(big_j == 0, n, n - big_j).astype(np.float64)  # active scores; ≥ 1 since T_{n−1} = 0 < nβ
    lo = np.where(big_j == 0, -np.inf, s[rows, j])
    hi = np.where(big_j == 0, s[:, 0], s[rows, np.minimum(big_j, n - 1)])
    lam = np.where(big_j == 0, s[:, 0] - (c - t[:, 0]) / n, s[rows, j] + (t[rows, j] - c) / m)
    lam = np.clip(lam, lo, hi)
    # 3. one Newton step with S evaluated directly (exact on the piece), kept inside the bracket
    lam = np.clip(lam + (_S(s, lam) - c) / m, lo, hi)
    # 4. certificate: S(λ − τ) ≥ nβ ≥ S(λ + τ), with margins for the summation error of S and of c
    spread = s[:, -1] - s[:, 0]
    tau = normalizer_tolerance(spread, beta)
    kappa = (n.bit_length() + 256) * _EPS  # numpy's pairwise sum: blocks of 128, then a binary tree
    below, above = lam - 0.5 * tau, lam + 0.5 * tau
    ok = (_S(s, below) * (1.0 - kappa) >= c * (1.0 + _EPS)) & (
        _S(s, above) * (1.0 + kappa) <= c * (1.0 - _EPS)
    )
    ok &= (np.spacing(np.abs(lam)) <= tau) & (below < lam) & (lam < above)  # else the exact root is used
    for i in np.flatnonzero(~ok):
        lam[i] = _exact_root(s[i], beta)
    return lam


def normalizer_residual(scores: ArrayLike, beta: float, lam: ArrayLike) -> np.ndarray:
    """``F(λ) − 1`` row-wise (diagnostic; 0 at the root)."""
    r = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    lam = np.atleast_1d(np.asarray(lam, dtype=np.float64))
    return np.mean(np.maximum((r - lam[:, None]) / beta, 0.0), axis=1) - 1.0
