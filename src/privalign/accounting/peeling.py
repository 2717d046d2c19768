"""Accounting for Peeling (Cai, Wang & Zhang 2021) from its 2s sub-mechanisms (spec-reward-estimation §4 (b)).

Peeling at Laplace scale b = nm·λ (λ = ℓ∞ sensitivity of the input vector v) runs

* ``s`` rounds of Laplace report-noisy-max over the not-yet-selected coordinates of |v| (|·| is
  1-Lipschitz, so |v_i| moves by ≤ λ). Laplace report-noisy-max with ℓ∞ sensitivity λ and scale b is
  ε0-DP with ε0 = 2λ/b = 2/nm (Dwork & Roth 2014, Claim 3.9 proves λ/b for monotone counting queries;
  without monotonicity the factor 2 is needed);
* one Laplace release of the ``s`` selected coordinates: ℓ1 sensitivity s·λ ⇒ pure s/nm; alternatively s
  Laplace coordinates, each 1/nm-DP, composed by advanced composition.

Candidates, all valid; :func:`peeling_epsilon` returns the one with the smallest ε (and its δ):

1. pure: 3s/nm at δ = 0 (basic composition);
2. selections by advanced composition at δ, release pure: ε_AC(s, 2/nm, δ) + s/nm;
3. selections at δ/2 and release at δ/2, both by advanced composition.

Advanced composition (Dwork, Rothblum & Vadhan 2010; Dwork & Roth 2014, Theorem 3.20): k adaptive
ε0-DP mechanisms are (ε0·sqrt(2k·ln(1/δ')) + k·ε0·(e^{ε0} − 1), δ')-DP.

Tighter accounting of the same event (PLD of the 2s sub-mechanisms) is available from
``RDPAccountant(method="pld").compose(PeelingEvent(...))``.
"""

from __future__ import annotations

import math
from fractions import Fraction

from privalign._validation import check_int, check_real
from privalign.accounting.calibration import bisect_monotone
from privalign.accounting.conversions import fraction_to_float_up, round_up

__all__ = [
    "advanced_composition_epsilon",
    "peeling_epsilon_parts",
    "peeling_epsilon",
    "calibrate_peeling",
    "cwz_noise_multiplier",
]


def advanced_composition_epsilon(epsilon0: float, count: int, delta: float) -> float:
    """ε of ``count`` adaptive ε0-DP mechanisms at slack δ' = ``delta`` (Dwork–Rothblum–Vadhan), rounded up.

    Args:
      epsilon0: per-mechanism ε0 > 0.
      count: number of mechanisms, ≥ 0.
      delta: slack δ' in (0, 1).

    Returns:
      ε0·sqrt(2k·ln(1/δ')) + k·ε0·(e^{ε0} − 1).

    References:
      Dwork, Rothblum & Vadhan 2010, "Boosting and Differential Privacy"; Dwork & Roth 2014, Theorem 3.20.
    """
    epsilon0 = check_real(epsilon0, "epsilon0", low=0.0, closed="neither")
    count = check_int(count, "count", low=0)
    delta = check_real(delta, "delta", low=0.0, high=1.0, closed="neither")
    if count == 0:
        return 0.0
    if epsilon0 > 700.0:  # e^{ε0} overflows: the bound is infinite (conservative), not an OverflowError
        return math.inf
    # -log(δ), not log(1/δ): 1/δ rounds, and for δ near 1 the relative error of log(1/δ) is large
    return round_up(
        epsilon0 * math.sqrt(2.0 * count * -math.log(delta)) + count * epsilon0 * math.expm1(epsilon0), 4
    )


def peeling_epsilon_parts(
    sparsity: int, noise_multiplier: float, delta_selection: float, delta_release: float | None = None
) -> dict[str, float]:
    """ε of Peeling's two parts at given δ's (the spec's table is ``delta_release=delta_selection``).

    Args:
      sparsity: s ≥ 1.
      noise_multiplier: Laplace scale over ℓ∞ sensitivity, b/λ > 0.
      delta_selection: δ for the advanced composition of the s selections, in (0, 1).
      delta_release: δ for the advanced composition of the release, in (0, 1), or ``None`` for the pure
        release only.

    Returns:
      ``{"selection": ε_sel, "release": ε_rel, "total": ε_sel + ε_rel, "delta": δ_sel + δ_rel}`` where the
      release is the smaller of pure s/nm and (when ``delta_release`` is given) advanced composition;
      ``delta`` counts ``delta_release`` only when advanced composition was the smaller.
    """
    s = check_int(sparsity, "sparsity", low=1)
    nm = check_real(noise_multiplier, "noise_multiplier", low=0.0, closed="neither")
    d_sel = check_real(delta_selection, "delta_selection", low=0.0, high=1.0, closed="neither")
    eps_sel = advanced_composition_epsilon(2.0 / nm, s, d_sel)
    eps_rel = fraction_to_float_up(Fraction(s) / Fraction(nm))
    d_used = d_sel
    if delta_release is not None:
        d_rel = check_real(delta_release, "delta_release", low=0.0, high=1.0, closed="neither")
        eps_ac = advanced_composition_epsilon(1.0 / nm, s, d_rel)
        if eps_ac < eps_rel:
            eps_rel = eps_ac
            d_used = d_sel + d_rel
    return {"selection": eps_sel, "release": eps_rel, "total": round_up(eps_sel + eps_rel), "delta": d_used}


def peeling_epsilon(sparsity: int, noise_multiplier: float, delta: float) -> tuple[float, float]:
    """The (ε, δ) Peeling costs at a total δ budget: min over the three candidates of the module docstring.

    Args:
      sparsity: s ≥ 1.
      noise_multiplier: Laplace scale over ℓ∞ sensitivity, b/λ > 0.
      delta: total δ budget in [0, 1). With ``delta == 0`` only the pure bound 3s/nm applies.

    Returns:
      ``(epsilon, total_delta)`` with ``total_delta ≤ delta``; ε rounded up.

    Raises:
      PrivacyParameterError: s < 1, nm ≤ 0, δ outside [0, 1) (message names the parameter and value).

    Privacy:
      Unit/relation: those under which λ bounds the ℓ∞ change of v. Guarantee: (ε, total_delta)-DP by
      adaptive composition of the 2s sub-mechanisms (see ``docs/privacy/peeling_accounting.md``).
    """
    s = check_int(sparsity, "sparsity", low=1)
    nm = check_real(noise_multiplier, "noise_multiplier", low=0.0, closed="neither")
    delta = check_real(delta, "delta", low=0.0, high=1.0, closed="left")
    best = (fraction_to_float_up(3 * Fraction(s) / Fraction(nm)), 0.0)
    if delta > 0.0:
        c2 = peeling_epsilon_parts(s, nm, delta, None)
        c3 = peeling_epsilon_parts(s, nm, delta / 2.0, delta / 2.0)
        for c in (c2, c3):
            if c["total"] < best[0] and c["delta"] <= delta:
                best = (c["total"], c["delta"])
    return best


def cwz_noise_multiplier(sparsity: int, epsilon: float, delta: float) -> float:
    """The Cai–Wang–Zhang Laplace scale over λ: 2·sqrt(3·s·ln(1/δ))/ε (spec-reward-estimation §4)."""
    s = check_int(sparsity, "sparsity", low=1)
    epsilon = check_real(epsilon, "epsilon", low=0.0, closed="neither")
    delta = check_real(delta, "delta", low=0.0, high=1.0, closed="neither")
    return 2.0 * math.sqrt(3.0 * s * -math.log(delta)) / epsilon


def calibrate_peeling(sparsity: int, epsilon: float, delta: float) -> float:
    """The smallest noise multiplier (to bisection precision, rounded towards *more* noise) whose
    accounted cost :func:`peeling_epsilon` is ≤ (ε, δ).

    Args:
      sparsity: s ≥ 1.
      epsilon: target ε > 0.
      delta: target total δ in [0, 1).

    Returns:
      nm = b/λ such that ``peeling_epsilon(s, nm, delta)`` ≤ (epsilon, delta) — checked before returning.
    """
    s = check_int(sparsity, "sparsity", low=1)
    epsilon = check_real(epsilon, "epsilon", low=0.0, closed="neither")
    delta = check_real(delta, "delta", low=0.0, high=1.0, closed="left")

    def ok(nm: float) -> bool:
        e, d = peeling_epsilon(s, nm, delta)
        return e <= epsilon and d <= delta

    hi = 3.0 * s / epsilon  # the pure bound alone meets ε here (up to rounding)
    return bisect_monotone(ok, hi / 2.0, hi, feasible="above", rtol=1e-12, grow=1.0001)
