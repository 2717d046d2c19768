"""Conversions between privacy notions, all one-sided (they never understate the privacy loss).

* :func:`zcdp_to_approx_dp` — ρ-zCDP ⇒ (ε, δ)-DP. **Default**: the conversion of Canonne, Kamath &
  Steinke 2020 (arXiv 2004.00010, Proposition 12 as numbered in v4, the version dp_accounting cites;
  stated for RDP and applied to the zCDP curve τ(α) = ρα), minimised numerically over the order α > 1,
  and never worse than :func:`zcdp_to_approx_dp_bun_steinke` (the minimum of the two valid bounds is
  returned).
* :func:`zcdp_to_approx_dp_bun_steinke` — ε = ρ + 2·sqrt(ρ·log(1/δ)) (Bun & Steinke 2016,
  arXiv 1605.02065v1, Proposition 1.3).
* :func:`gaussian_delta` / :func:`gaussian_epsilon` — the exact (ε, δ) curve of the Gaussian mechanism
  (Balle & Wang 2018, arXiv 1805.06530v2, Theorem 8), δ evaluated with an explicit upward error
  allowance and ε found by bisection and rounded up.
* :func:`pure_to_zcdp` — ε-DP ⇒ ε²/2-zCDP (Bun & Steinke 2016, Proposition 1.4).

Every function validates its input and raises :class:`~privalign.errors.PrivacyParameterError` naming the
parameter, the constraint and the value.
"""

from __future__ import annotations

import math
from fractions import Fraction

from privalign._validation import check_real
from privalign.accounting.calibration import CalibrationLimitError, bisect_monotone
from privalign.accounting.normal import log_ndtr

__all__ = [
    "zcdp_to_approx_dp",
    "zcdp_to_approx_dp_bun_steinke",
    "zcdp_to_approx_dp_cks",
    "approx_dp_to_zcdp",
    "gaussian_delta",
    "gaussian_epsilon",
    "pure_to_zcdp",
    "round_up",
    "fraction_to_float_up",
]

_ULP = 2.0**-52


def round_up(x: float, ulps: int = 1) -> float:
    """``x`` moved ``ulps`` floats towards +∞ (OpenDP's ``inf_add`` idea: out ≥ exact value)."""
    for _ in range(ulps):
        x = math.nextafter(x, math.inf)
    return x


def fraction_to_float_up(q: Fraction | float) -> float:
    """The smallest float ≥ ``q`` (a float, e.g. ``inf``, is returned unchanged)."""
    if isinstance(q, float):
        return q
    f = float(q)
    if Fraction(f) < q:
        f = math.nextafter(f, math.inf)
    return f


def _check_delta(delta: float) -> float:
    return check_real(delta, "delta", low=0.0, high=1.0, closed="neither")


def zcdp_to_approx_dp_bun_steinke(rho: float, delta: float) -> float:
    """ε = ρ + 2·sqrt(ρ·log(1/δ)): ρ-zCDP ⇒ (ε, δ)-DP.

    Args:
      rho: zCDP parameter, ``rho >= 0``.
      delta: target δ in (0, 1).

    Returns:
      ε, rounded up.

    Raises:
      PrivacyParameterError: ``rho`` negative/NaN/infinite or ``delta`` outside (0, 1).

    References:
      Bun & Steinke 2016, "Concentrated Differential Privacy: Simplifications, Extensions, and Lower
      Bounds", arXiv 1605.02065v1, Proposition 1.3.
    """
    rho = check_real(rho, "rho", low=0.0, closed="left", allow_inf=True)
    delta = _check_delta(delta)
    if math.isinf(rho):
        return math.inf
    if rho == 0.0:
        return 0.0
    return round_up(rho + 2.0 * math.sqrt(rho * -math.log(delta)), 4)


def _cks_epsilon_at(alpha: float, rho: float, log_delta: float) -> float:
    # CKS20 Prop. 12 applied to (α, ρα)-RDP:
    #   ε(α) = ρα + log(1 − 1/α) − (log δ + log α)/(α − 1).
    return rho * alpha + math.log1p(-1.0 / alpha) - (log_delta + math.log(alpha)) / (alpha - 1.0)


def zcdp_to_approx_dp_cks(rho: float, delta: float) -> float:
    """ε from Canonne–Kamath–Steinke's RDP→DP conversion on the zCDP curve, minimised over α.

    Any α > 1 gives a valid bound, so an imperfect numerical minimum is still sound (only looser).

    Args:
      rho: zCDP parameter, ``rho >= 0``.
      delta: target δ in (0, 1).

    Returns:
      ε (≥ 0), rounded up.

    References:
      Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy", arXiv
      2004.00010 (Proposition 12 in v4, as cited by dp_accounting's ``rdp_privacy_accountant.py``).
    """
    rho = check_real(rho, "rho", low=0.0, closed="left", allow_inf=True)
    delta = _check_delta(delta)
    if math.isinf(rho):
        return math.inf
    if rho == 0.0:
        return 0.0
    from scipy import optimize  # lazy: keeps `import privalign.accounting` light

    log_delta = math.log(delta)
    # The unconstrained minimiser is near α* ≈ 1 + sqrt(log(1/δ)/ρ); search a generous log-bracket.
    guess = 1.0 + math.sqrt(max(-log_delta, 1e-12) / rho)
    lo, hi = math.log(1.0 + 1e-9), math.log(max(guess * 100.0, 2.0))
    res = optimize.minimize_scalar(
        lambda la: _cks_epsilon_at(1.0 + math.exp(la), rho, log_delta),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-10},
    )
    alpha = 1.0 + math.exp(float(res.x))
    eps = min(_cks_epsilon_at(alpha, rho, log_delta), _cks_epsilon_at(guess, rho, log_delta))
    # Float evaluation of a handful of terms: allow a relative error of 64 ulps plus 8 ulps of ρα.
    eps = eps + 64 * _ULP * (abs(eps) + rho * alpha + abs(log_delta))
    return max(0.0, round_up(eps))


def zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """ρ-zCDP ⇒ (ε, δ)-DP: the smaller of the CKS20 and BS16 conversions (both valid upper bounds).

    This is the conversion :class:`~privalign.accounting.accountant.ZCDPAccountant` uses.

    Args:
      rho: zCDP parameter, ``rho >= 0`` (``inf`` gives ``inf``).
      delta: target δ in (0, 1).

    Returns:
      ε, rounded up; 0 when ρ = 0.

    Raises:
      PrivacyParameterError: invalid ``rho`` or ``delta``.

    References:
      Canonne, Kamath & Steinke 2020, arXiv 2004.00010 (Prop. 12 in v4); Bun & Steinke 2016,
      arXiv 1605.02065v1, Prop. 1.3.
    """
    return min(zcdp_to_approx_dp_cks(rho, delta), zcdp_to_approx_dp_bun_steinke(rho, delta))


def approx_dp_to_zcdp(epsilon: float, delta: float) -> float:
    """The largest ρ (to bisection precision, rounded *down*) with ``zcdp_to_approx_dp(ρ, δ) ≤ ε``.

    Used to turn an (ε, δ) budget into a zCDP budget (``ZCDPFilter.from_epsilon_delta``): spending at
    most the returned ρ guarantees (ε, δ)-DP.

    Args:
      epsilon: target ε > 0.
      delta: target δ in (0, 1).

    Returns:
      ρ ≥ 0.
    """
    epsilon = check_real(epsilon, "epsilon", low=0.0, closed="neither")
    delta = _check_delta(delta)
    return bisect_monotone(
        lambda rho: zcdp_to_approx_dp(rho, delta) <= epsilon, 0.0, max(epsilon, 1.0), feasible="below"
    )


def pure_to_zcdp(epsilon: float) -> float:
    """ε-DP ⇒ (ε²/2)-zCDP, rounded up.

    References:
      Bun & Steinke 2016, arXiv 1605.02065v1, Proposition 1.4.
    """
    epsilon = check_real(epsilon, "epsilon", low=0.0, closed="left", allow_inf=True)
    if math.isinf(epsilon):
        return math.inf
    return fraction_to_float_up(Fraction(epsilon) ** 2 / 2)


# Relative error allowed for ``log_ndtr`` (``privalign.accounting.normal``; scipy's before) + ``exp`` on each
# term; the worst observed against a 60-digit mpmath oracle is below 1e-13 for results above 1e-280 (tests:
# test_accounting_soundness.py, test_accounting_normal.py), for scipy's function and for ours alike.
_TERM_RTOL = 2e-12
_DELTA_FLOOR = 1e-280


def _gaussian_delta_terms(noise_multiplier: float, epsilon: float) -> tuple[float, float]:
    a = 1.0 / (2.0 * noise_multiplier)
    b = epsilon * noise_multiplier
    log_first = float(log_ndtr(a - b))
    log_second = epsilon + float(log_ndtr(-a - b))
    first = math.exp(log_first)
    second = math.exp(log_second) if log_second < 700 else math.inf
    return first, second


def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """The smallest δ for which the Gaussian mechanism is (ε, δ)-DP, rounded up.

    δ(ε) = Φ(1/(2·nm) − ε·nm) − e^ε·Φ(−1/(2·nm) − ε·nm), with nm = σ/Δ₂.

    The two terms are computed with ``privalign.accounting.normal.log_ndtr`` (observed relative error
    < 1e-13 after ``exp``); the first is inflated and the second deflated by a relative 2e-12, and results
    below 1e-280 are reported as 1e-280, so the returned value is never below the exact curve (checked against
    a 60-digit mpmath oracle in the tests); it exceeds it by at most a relative ~1e-6 when the two terms
    nearly cancel.

    Args:
      noise_multiplier: σ/Δ₂ > 0.
      epsilon: ε ≥ 0.

    Returns:
      δ in [0, 1].

    Raises:
      PrivacyParameterError: invalid ``noise_multiplier`` or ``epsilon``.

    References:
      Balle & Wang 2018, "Improving the Gaussian Mechanism for Differential Privacy: Analytical
      Calibration and Optimal Denoising", arXiv 1805.06530v2, Theorem 8.
    """
    noise_multiplier = check_real(noise_multiplier, "noise_multiplier", low=0.0, closed="neither")
    epsilon = check_real(epsilon, "epsilon", low=0.0, closed="left")
    first, second = _gaussian_delta_terms(noise_multiplier, epsilon)
    if math.isinf(second):
        return 1.0 if first > 0 else _DELTA_FLOOR
    delta = first * (1.0 + _TERM_RTOL) - second * (1.0 - _TERM_RTOL)
    return min(1.0, max(_DELTA_FLOOR, round_up(delta)))


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """The smallest ε (rounded up) for which the Gaussian mechanism is (ε, δ)-DP.

    Bisection on :func:`gaussian_delta`, which is non-increasing in ε; the returned ε always satisfies
    ``gaussian_delta(noise_multiplier, ε) ≤ delta``.

    Args:
      noise_multiplier: σ/Δ₂ > 0.
      delta: target δ in (0, 1).

    Returns:
      ε ≥ 0.

    References:
      Balle & Wang 2018, arXiv 1805.06530v2, Theorem 8.
    """
    noise_multiplier = check_real(noise_multiplier, "noise_multiplier", low=0.0, closed="neither")
    delta = _check_delta(delta)
    try:
        return bisect_monotone(
            lambda eps: gaussian_delta(noise_multiplier, eps) <= delta,
            0.0,
            1.0,
            feasible="above",
            rtol=1e-13,
            limit=1e6,
        )
    except CalibrationLimitError:
        return math.inf
