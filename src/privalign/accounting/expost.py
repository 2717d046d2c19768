"""Ex-post privacy accounting of PrivITP (spec-inference-time §2.4).

Phase 2 of PrivITP accepts candidate i iff ``r_i + Z_i > λ̃ + W·U_i`` (Gaussian AboveThreshold with a
fresh uniform threshold on ``[λ̃, λ̃ + W]``; ``W = R_max + σ_Z·L − λ̃``). Conditional on ``λ̃`` and for
scores in the public range ``[0, R_max]`` whose neighbours differ by at most Δ (ℓ∞):

* ``ℓ1(λ̃) = log E_U Φ((λ̃ + W·U − R_max + Δ)/σ_Z) − log E_U Φ((λ̃ + W·U − R_max)/σ_Z)`` (worst rejection
  ratio, attained at r = R_max vs R_max − Δ);
* ``ℓ2(λ̃) = log E_U Φ((Δ − λ̃ − W·U)/σ_Z) − log E_U Φ((−λ̃ − W·U)/σ_Z)`` (worst acceptance ratio, at r = 0
  vs Δ);
* ``ε2(t; λ̃) = (t − 1)·ℓ1 + ℓ2`` for a stop at t, and ``n·ℓ1`` for the fallback (not ``(n − 1)·ℓ1 + ℓ2``,
  which is smaller whenever ℓ1 > ℓ2).

``E_U Φ((c + b·U)/σ)`` has the closed form ``(σ/b)·[G((c+b)/σ) − G(c/σ)]`` with ``G(z) = zΦ(z) + φ(z)``
(``G′ = Φ``); it is evaluated in log space with ``erfcx`` (``privalign.accounting.normal``; no grid). Both
orderings of each neighbour pair are evaluated and the larger kept (the reverse ratios are ≤ 0 by
log-concavity, but we do not rely on it).

Phase 1 releases ``λ̂ + N(0, σ_X²)``; λ̂ is 1-Lipschitz in ℓ∞ (proof: ``docs/privacy/privitp.md``), so
this is the Gaussian mechanism with sensitivity Δ: ``ρ1 = Δ²/(2σ_X²)``-zCDP (Bun & Steinke 2016,
arXiv 1605.02065v1, Prop. 1.6) and (ε1, δ)-DP with ε1 from the analytic Gaussian mechanism (Balle & Wang
2018, arXiv 1805.06530v2, Thm. 8), computed by ``privalign.accounting.conversions.gaussian_epsilon``.
The authors' ``ε1 = Δ/σ_X`` is *not* used: it is not a valid DP bound for Gaussian noise.

The worst case over the clamped interval ``λ̃ ∈ [−β, R_max − β]`` is a certified upper bound: ℓ1 is
non-increasing and ℓ2 non-decreasing in λ̃ (proved in :func:`phase2_worst_case`), so per-cell bounds on a
grid, refined where they matter, bound the supremum from above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from privalign._validation import check_int, check_real
from privalign.accounting.calibration import CalibrationLimitError, bisect_monotone
from privalign.accounting.normal import erfcx, log_ndtr, ndtr

__all__ = [
    "log_G",
    "log_expected_phi",
    "ell1",
    "ell2",
    "epsilon2",
    "phase2_worst_case",
    "phase2_worst_cases",
    "phase1_epsilon",
    "phase1_rho",
    "phase1_sensitivity",
    "NORMALIZER_CERTIFICATE_REL",
    "PrivITPAccountant",
    "calibrate_privitp_sigma",
]

_SQRT_HALF_PI = math.sqrt(math.pi / 2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def log_G(z: ArrayLike) -> np.ndarray:
    """``log G(z)`` with ``G(z) = zΦ(z) + φ(z)`` (the antiderivative of Φ), stable for all finite z.

    For z < 0: ``G(z) = φ(z)·(1 + z·m(z))``, ``m(z) = Φ(z)/φ(z) = sqrt(π/2)·erfcx(−z/√2)``; below
    z = −30 the asymptotic series ``G(z) = φ(z)·Σ_k (−1)^k (2k−1)!!/z^{2k+2}`` (6 terms, relative error
    < 1e-12) avoids the cancellation in ``1 + z·m(z)``.
    """
    z = np.asarray(z, dtype=np.float64)
    out = np.empty_like(z)
    logphi = -0.5 * z * z - _LOG_SQRT_2PI
    pos = z >= 0
    out[pos] = np.log(z[pos] * ndtr(z[pos]) + np.exp(logphi[pos]))
    mid = (~pos) & (z >= -30.0)
    zm = z[mid]
    out[mid] = logphi[mid] + np.log1p(zm * _SQRT_HALF_PI * erfcx(-zm / math.sqrt(2.0)))
    far = z < -30.0
    zf = z[far]
    inv2 = 1.0 / (zf * zf)
    # 1/z² − 3/z⁴ + 15/z⁶ − 105/z⁸ + 945/z¹⁰ − 10395/z¹²
    series = inv2 * (1 + inv2 * (-3 + inv2 * (15 + inv2 * (-105 + inv2 * (945 - 10395 * inv2)))))
    out[far] = logphi[far] + np.log(series)
    return out


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """log(1 − e^x) for x ≤ 0, accurate near 0 and −∞."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def log_expected_phi(c: ArrayLike, b: ArrayLike, sigma: ArrayLike) -> np.ndarray:
    """``log E_U Φ((c + b·U)/σ)`` for ``U ~ Unif[0, 1]``, in closed form (broadcasting).

    ``E_U Φ((c + bU)/σ) = [G(hi) − G(lo)]/(hi − lo)`` with ``lo, hi`` the sorted ``c/σ, (c+b)/σ``; when
    ``|b|/σ < 1e-6`` the midpoint value ``log Φ((c + b/2)/σ)`` is used (error O((b/σ)²)).

    Args:
      c, b: Offsets and widths (any sign).
      sigma: σ > 0.

    Returns:
      The log expectation, an array of the broadcast shape.
    """
    c, b, sigma = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (c, b, sigma)))
    lo = np.minimum(c, c + b) / sigma
    hi = np.maximum(c, c + b) / sigma
    width = hi - lo
    small = width < 1e-6
    with np.errstate(divide="ignore", invalid="ignore"):
        lg_hi = log_G(hi)
        lg_lo = log_G(lo)
        diff = lg_hi + _log1mexp(np.minimum(lg_lo - lg_hi, 0.0))
        val = diff - np.log(np.where(small, 1.0, width))
    mid = log_ndtr((lo + hi) / 2.0)
    return np.where(small, mid, val)


def _pair_ratio(c_num, c_den, b, sigma):
    return log_expected_phi(c_num, b, sigma) - log_expected_phi(c_den, b, sigma)


def ell1(
    lam_tilde: ArrayLike, *, width: ArrayLike, r_max: float, sensitivity: float, sigma_z: float
) -> np.ndarray:
    """Worst-case log ratio of one *rejection* (r = R_max vs R_max − Δ), both orderings, ≥ 0.

    Args:
      lam_tilde: The released (clamped) noisy normaliser λ̃.
      width: The threshold width W = R_max + σ_Z·L − λ̃ (from the mechanism object, never recomputed).
      r_max: The public upper end of the score range.
      sensitivity: Δ (ℓ∞); ``min(Δ, R_max)`` is used, which is valid because scores lie in [0, R_max].
      sigma_z: Phase-2 noise standard deviation.
    """
    lam = np.asarray(lam_tilde, dtype=np.float64)
    d = min(float(sensitivity), float(r_max))
    base = lam - r_max
    fwd = _pair_ratio(base + d, base, width, sigma_z)
    rev = _pair_ratio(base, base + d, width, sigma_z)
    return np.maximum(np.maximum(fwd, rev), 0.0)


def ell2(
    lam_tilde: ArrayLike, *, width: ArrayLike, r_max: float, sensitivity: float, sigma_z: float
) -> np.ndarray:
    """Worst-case log ratio of one *acceptance* (r = 0 vs Δ), both orderings, ≥ 0 (see :func:`ell1`)."""
    lam = np.asarray(lam_tilde, dtype=np.float64)
    d = min(float(sensitivity), float(r_max))
    w = np.asarray(width, dtype=np.float64)
    fwd = _pair_ratio(d - lam, -lam, -w, sigma_z)
    rev = _pair_ratio(-lam, d - lam, -w, sigma_z)
    return np.maximum(np.maximum(fwd, rev), 0.0)


def epsilon2(
    t: ArrayLike,
    n: int,
    lam_tilde: ArrayLike,
    *,
    width: ArrayLike,
    r_max: float,
    sensitivity: float,
    sigma_z: float,
) -> np.ndarray:
    """Ex-post phase-2 loss: ``(t − 1)·ℓ1 + ℓ2`` for t = 1..n; ``n·ℓ1`` for the fallback (t = −1 or 0).

    Args:
      t: Stopping times (1-based), with ``-1`` (or 0) meaning "fallback".
      n: The phase-2 pool size (only used for the fallback charge).
      lam_tilde, width, r_max, sensitivity, sigma_z: See :func:`ell1`.
    """
    t = np.asarray(t)
    l1 = ell1(lam_tilde, width=width, r_max=r_max, sensitivity=sensitivity, sigma_z=sigma_z)
    l2 = ell2(lam_tilde, width=width, r_max=r_max, sensitivity=sensitivity, sigma_z=sigma_z)
    fb = t <= 0
    return np.where(fb, n * l1, (np.maximum(t, 1) - 1) * l1 + l2)


def _ells(lam, *, r_max, sensitivity, sigma_z, L):
    w = r_max + sigma_z * L - lam
    l1 = ell1(lam, width=w, r_max=r_max, sensitivity=sensitivity, sigma_z=sigma_z)
    l2 = ell2(lam, width=w, r_max=r_max, sensitivity=sensitivity, sigma_z=sigma_z)
    return l1, l2


def _cell_upper_bounds(l1: np.ndarray, l2: np.ndarray, n: int) -> np.ndarray:
    """Certified upper bounds of ``(n−1)ℓ1 + ℓ2`` on each cell ``[λ_k, λ_{k+1}]`` of a grid, from the
    monotonicity of ℓ1 (non-increasing) and ℓ2 (non-decreasing) in λ̃: the sup over a cell is at most
    ``(n−1)·max(ℓ1 at the ends) + max(ℓ2 at the ends)`` (taking the max of both ends instead of the
    left/right end makes the bound insensitive to rounding-level non-monotonicity)."""
    return (n - 1) * np.maximum(l1[:-1], l1[1:]) + np.maximum(l2[:-1], l2[1:])


#: Relative and absolute allowance for the floating-point error of ℓ1, ℓ2 (observed ≤ 1e-12 relative and
#: ≤ 5e-10 absolute against a 60-digit mpmath oracle over wide random parameters; see the tests).
_FP_REL, _FP_ABS = 1e-8, 1e-9


def phase2_worst_case(
    n: int, *, beta: float, r_max: float, sensitivity: float, sigma_z: float, L: float, grid_size: int = 2049
) -> tuple[float, float]:
    """Certified ``sup_{λ̃ ∈ [−β, R_max − β]} max{(n−1)ℓ1 + ℓ2, n·ℓ1}`` with W = R_max + σ_Z·L − λ̃.

    **Monotonicity (proof).** With ``W = C − λ̃`` and ``C = R_max + σ_Z·L`` fixed, the threshold
    ``λ̃ + W·U`` is uniform on ``[λ̃, C]``, so ``ℓ1(λ̃) = log ∫_λ̃^C g₊ − log ∫_λ̃^C g₀`` with
    ``g₊(τ) = Φ((τ − R_max + Δ)/σ_Z)``, ``g₀(τ) = Φ((τ − R_max)/σ_Z)``; the ratio ``h = g₊/g₀`` is
    non-increasing in τ (Φ is log-concave). Then ``dℓ1/dλ̃ = (g₀(λ̃)/∫g₀)·(1 − h(λ̃)·∫g₀/∫g₊) ≤ 0``
    because ``∫g₊ = ∫h·g₀ ≤ h(λ̃)·∫g₀``. The same computation with the acceptance integrands
    ``Φ((Δ − τ)/σ_Z)``, ``Φ(−τ/σ_Z)``, whose ratio is non-decreasing in τ, gives ``dℓ2/dλ̃ ≥ 0``. The
    reverse orderings are ≤ 0 and ``max(·, 0)`` keeps both monotone.

    **Method.** Hence on a grid cell ``[a, b]``: ``(n−1)ℓ1 + ℓ2 ≤ (n−1)ℓ1(a) + ℓ2(b)``, and
    ``n·ℓ1 ≤ n·ℓ1(−β)`` everywhere. The bound is the max of these cell bounds over a ``grid_size`` grid,
    with the (at most 16) cells whose bound exceeds the best grid value refined on a 65-point sub-grid,
    plus a small floating-point allowance. It is an upper bound by construction (not a heuristic margin),
    and exceeds the true supremum by at most about one sub-cell's variation of ``(n−1)ℓ1`` and ``ℓ2``.

    Returns:
      ``(upper_bound, argmax_lambda)`` where ``argmax_lambda`` maximises the objective among the points
      evaluated.
    """
    return phase2_worst_cases(
        [n], beta=beta, r_max=r_max, sensitivity=sensitivity, sigma_z=sigma_z, L=L, grid_size=grid_size
    )[0]


def phase2_worst_cases(
    ns, *, beta: float, r_max: float, sensitivity: float, sigma_z: float, L: float, grid_size: int = 2049
) -> list[tuple[float, float]]:
    """:func:`phase2_worst_case` for each ``n`` of ``ns``, the same values bit for bit (the same arithmetic):
    ``ℓ1``, ``ℓ2`` on the grid, and on each refined cell, do not depend on ``n`` and are evaluated once and
    shared by all ``n``."""
    ns = [check_int(n, "n", low=1) for n in ns]
    grid_size = check_int(grid_size, "grid_size", low=2)
    kw = dict(r_max=r_max, sensitivity=sensitivity, sigma_z=sigma_z, L=L)
    lo, hi = -beta, r_max - beta
    grid = np.linspace(lo, hi, grid_size)
    l1, l2 = _ells(grid, **kw)
    upper_fallback_l1 = np.max(l1)
    sub_cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    out = []
    for n in ns:
        f = np.maximum((n - 1) * l1 + l2, n * l1)
        k = int(np.argmax(f))
        best, arg = float(f[k]), float(grid[k])
        upper_fallback = float(n * upper_fallback_l1)  # = n·ℓ1(−β) in exact arithmetic
        cells = _cell_upper_bounds(l1, l2, n)
        order = np.argsort(cells)[::-1]
        refine = [int(c) for c in order[:16] if cells[c] > best]
        rest = np.delete(cells, refine)
        upper = float(rest.max()) if rest.size else -np.inf
        for c in refine:
            if c not in sub_cache:
                sub = np.linspace(grid[c], grid[c + 1], 65)
                sub_cache[c] = (sub, *_ells(sub, **kw))
            sub, s1, s2 = sub_cache[c]
            fs = np.maximum((n - 1) * s1 + s2, n * s1)
            j = int(np.argmax(fs))
            if fs[j] > best:
                best, arg = float(fs[j]), float(sub[j])
            upper = max(upper, float(_cell_upper_bounds(s1, s2, n).max()), float(n * np.max(s1)))
        upper = max(upper, upper_fallback, best)
        out.append((upper * (1.0 + _FP_REL) + _FP_ABS * (n + 1), arg))
    return out


#: Relative width of the normaliser's certificate (``privalign.alignment.normalizer``): for scores in
#: ``[0, R_max]`` the computed λ̂ is within ``τ = NORMALIZER_CERTIFICATE_REL·(R_max + β)`` of the exact root.
NORMALIZER_CERTIFICATE_REL = 2.0**-40


def phase1_sensitivity(sensitivity: float, r_max: float, beta: float) -> float:
    """The ℓ∞ sensitivity of the *computed* λ̂: ``Δ + 2τ`` with ``τ = 2⁻⁴⁰·(R_max + β)``.

    The exact root is 1-Lipschitz (``docs/privacy/privitp.md``); the floating-point solver is certified
    within τ of it on every input in ``[0, R_max]``, so two neighbours' computed roots differ by at most
    ``Δ + 2τ``. The slack is added (rounded up) so that the phase-1 accounting never relies on exact
    arithmetic.
    """
    tau = NORMALIZER_CERTIFICATE_REL * (float(r_max) + float(beta))
    return float(np.nextafter(float(sensitivity) + 2.0 * tau, np.inf))


def phase1_rho(sensitivity: float, sigma_x: float) -> float:
    """ρ1 = Δ²/(2σ_X²): zCDP of the Gaussian on λ̂ (Bun & Steinke 2016, arXiv 1605.02065v1, Prop. 1.6)."""
    return sensitivity**2 / (2.0 * sigma_x**2)


def phase1_epsilon(sensitivity: float, sigma_x: float, delta: float) -> float:
    """Smallest ε1 with the Gaussian on λ̂ (sensitivity Δ, std σ_X) (ε1, δ)-DP.

    Uses the analytic Gaussian mechanism (Balle & Wang 2018, arXiv 1805.06530v2, Thm. 8) via
    ``privalign.accounting.conversions.gaussian_epsilon(noise_multiplier=σ_X/Δ, delta)``.
    """
    from privalign.accounting.conversions import gaussian_epsilon

    return float(gaussian_epsilon(sigma_x / sensitivity, delta))


@dataclass(frozen=True)
class PrivITPAccountant:
    """All of PrivITP's per-prompt accounting for fixed public parameters.

    Args:
      beta, r_max, sensitivity, sigma_x, sigma_z, L, delta: The mechanism's public parameters (the
        *same* values the mechanism samples with: build it from the mechanism, never separately).
    """

    beta: float
    r_max: float
    sensitivity: float
    sigma_x: float
    sigma_z: float
    L: float
    delta: float

    @property
    def phase1_sensitivity(self) -> float:
        """Δ + 2τ: the sensitivity of the computed λ̂ (see :func:`phase1_sensitivity`)."""
        return phase1_sensitivity(self.sensitivity, self.r_max, self.beta)

    @property
    def epsilon1(self) -> float:
        return phase1_epsilon(self.phase1_sensitivity, self.sigma_x, self.delta)

    @property
    def rho1(self) -> float:
        return phase1_rho(self.phase1_sensitivity, self.sigma_x)

    def width(self, lam_tilde: ArrayLike) -> np.ndarray:
        return self.r_max + self.sigma_z * self.L - np.asarray(lam_tilde, dtype=np.float64)

    def epsilon2(self, t: ArrayLike, n: int, lam_tilde: ArrayLike) -> np.ndarray:
        return epsilon2(
            t,
            n,
            lam_tilde,
            width=self.width(lam_tilde),
            r_max=self.r_max,
            sensitivity=self.sensitivity,
            sigma_z=self.sigma_z,
        )

    def epsilon2_max(self, n: int) -> float:
        return phase2_worst_case(
            n, beta=self.beta, r_max=self.r_max, sensitivity=self.sensitivity, sigma_z=self.sigma_z, L=self.L
        )[0]

    def epsilon_max(self, n: int) -> float:
        """Data-independent worst case ε1(δ) + sup ε2, reserved before running on a pool of n."""
        return self.epsilon1 + self.epsilon2_max(n)

    def epsilon_max_many(self, ns) -> list[float]:
        """``[epsilon_max(n) for n in ns]``, the same values bit for bit, with the n-independent work of
        :func:`phase2_worst_case` done once (:func:`phase2_worst_cases`)."""
        e1 = self.epsilon1
        worst = phase2_worst_cases(
            ns, beta=self.beta, r_max=self.r_max, sensitivity=self.sensitivity, sigma_z=self.sigma_z, L=self.L
        )
        return [e1 + w for w, _ in worst]

    def realized(self, t: ArrayLike, n: int, lam_tilde: ArrayLike) -> np.ndarray:
        """ε1(δ) + ε2(t; λ̃), capped at :meth:`epsilon_max` (never above it)."""
        return np.minimum(self.epsilon1 + self.epsilon2(t, n, lam_tilde), self.epsilon_max(n))


def calibrate_privitp_sigma(
    epsilon: float,
    delta: float,
    n: int,
    *,
    beta: float,
    r_max: float = 1.0,
    sensitivity: float | None = None,
    L: float = 3.0,
    ratio: float = 1.0,
    rtol: float = 1e-4,
) -> float:
    """Smallest common scale σ (σ_X = σ, σ_Z = ratio·σ) whose worst case ``ε_max(n) ≤ epsilon`` at δ.

    Used to compare PrivITP with other mechanisms at equal *worst-case* (ε, δ) instead of equal σ (a σ
    never converted to ε is no privacy comparison). Bisection on σ (ε_max is non-increasing in σ: ε1
    decreases in σ_X, and the phase-2 ratios shrink as σ_Z grows, checked numerically); the returned σ
    satisfies ``ε_max ≤ epsilon``.

    Raises:
      PrivacyParameterError: bad parameters, or no σ ≤ 1e6·Δ reaches ``epsilon``.
    """
    from privalign.errors import PrivacyParameterError

    epsilon = check_real(epsilon, "epsilon", low=0.0, closed="neither")
    d = r_max if sensitivity is None else check_real(sensitivity, "sensitivity", low=0.0, closed="neither")

    def eps_max(s: float) -> float:
        acc = PrivITPAccountant(
            beta=beta, r_max=r_max, sensitivity=d, sigma_x=s, sigma_z=ratio * s, L=L, delta=delta
        )
        return acc.epsilon_max(n)

    try:
        return bisect_monotone(
            lambda s: eps_max(s) <= epsilon, 1e-3 * d, d, feasible="above", rtol=rtol, limit=1e6 * d
        )
    except CalibrationLimitError:
        raise PrivacyParameterError(
            f"The 'epsilon' parameter {epsilon!r} is not reachable for n={n}, delta={delta!r}."
        ) from None
