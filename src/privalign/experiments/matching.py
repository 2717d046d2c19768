"""Equal-privacy matching of PrivITP to PrivBoN (at equal (ε, δ), not equal σ), used wherever the
experiments compare the two mechanisms.

PrivBoN at ε is pure ε-DP per query (Gumbel scale 2Δ_r/ε). PrivITP is (ε1(δ) + ε2(t; λ̃), δ) ex-post DP:
its privacy loss depends on the realised stopping time. Three ways to put it next to PrivBoN at ε
(config key ``privitp_match``):

* ``"worst"`` (default): the common scale σ (σ_X = σ, σ_Z = ratio·σ) is calibrated so that PrivITP's
  data-independent worst case ``ε_max(N) = ε1(δ) + sup ε2`` at δ equals PrivBoN's ε (bisection on σ,
  :func:`calibrate_worst`; the achieved ε_max is within 1e-6 relative of the target and never above it).
  This is an (ε, δ)-DP guarantee per query: equal privacy up to δ.
* ``"expected"``: σ is calibrated so that the *expected* realised loss E[ε1 + ε2(t)] on a calibration
  prompt set (disjoint from the evaluation prompts) equals ε (:func:`calibrate_expected`). This is **not
  an ε-DP guarantee**: single queries may realise up to ε_max(N) ≫ ε; it matches average spend under an
  ex-post filter.
* ``"sigma"``: the authors' rule σ_X = σ_Z = PrivBoN's Gumbel scale (their script's pairing). **Not equal
  privacy**: PrivITP's ε_max and E[ε] are then several times PrivBoN's ε; every label says so.

Nothing here is a mechanism: these functions choose public noise scales for offline comparisons. The
``"expected"`` calibration reads the calibration prompts' private scores (an offline study choice; a
deployment would calibrate on public data).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MATCHINGS", "MATCH_NOTE", "calibrate_worst", "calibrate_expected", "sigma_rule", "privitp_for"]

MATCHINGS = ("worst", "expected", "sigma")

#: One-line description of each matching, used in legends, records and verdicts.
MATCH_NOTE = {
    "worst": "equal privacy: PrivITP's worst-case ε_max(N) at δ = PrivBoN's ε",
    "expected": "PrivITP's expected realised E[ε1+ε2] = PrivBoN's ε (not an ε-DP guarantee)",
    "sigma": "authors' σ rule σ_X = σ_Z = PrivBoN's scale: NOT equal privacy",
}


def calibrate_worst(
    epsilon: float,
    delta: float,
    n: int,
    *,
    beta: float,
    r_max: float,
    sensitivity: float,
    L: float,
    ratio: float = 1.0,
    rtol: float = 1e-10,
) -> dict:
    """σ_X (σ_Z = ratio·σ_X) with PrivITP's worst case ``ε_max(n)`` at ``delta`` equal to ``epsilon``.

    Reuses :func:`privalign.accounting.expost.calibrate_privitp_sigma` (bisection on σ, ε_max
    non-increasing in σ) with a relative σ tolerance ``rtol`` (default 1e-10; coarser only for tuning
    trials, whose winner is recalibrated at the default), so the achieved ε_max is ≤ ``epsilon`` and
    within about 1e-9 relative of it (checked: the returned ``rel_error`` is asserted ≤ 1e-6 in the tests).

    Returns:
      ``{"sigma_x", "sigma_z", "L", "epsilon1", "epsilon_max", "rel_error"}``.
    """
    from privalign.accounting.expost import PrivITPAccountant, calibrate_privitp_sigma

    s = calibrate_privitp_sigma(
        epsilon, delta, n, beta=beta, r_max=r_max, sensitivity=sensitivity, L=L, ratio=ratio, rtol=rtol
    )
    acc = PrivITPAccountant(
        beta=beta, r_max=r_max, sensitivity=sensitivity, sigma_x=s, sigma_z=ratio * s, L=L, delta=delta
    )
    e = acc.epsilon_max(n)
    return {
        "sigma_x": s,
        "sigma_z": ratio * s,
        "L": L,
        "epsilon1": acc.epsilon1,
        "epsilon_max": e,
        "rel_error": abs(e - epsilon) / epsilon,
    }


def sigma_rule(epsilon: float, sensitivity: float) -> dict:
    """The authors' pairing: σ_X = σ_Z = PrivBoN's Gumbel scale 2Δ_r/ε (not equal privacy)."""
    s = 2.0 * sensitivity / epsilon
    return {"sigma_x": s, "sigma_z": s}


def calibrate_expected(
    epsilon: float,
    delta: float,
    n: int,
    calib_pool,
    *,
    beta: float,
    r_max_range: tuple,
    sensitivity: float,
    L: float,
    ratio: float,
    transform: str,
    replicates: int,
    quad_order: int,
    seed: np.random.SeedSequence,
    rtol: float = 1e-3,
    max_iter: int = 40,
) -> dict:
    """σ_X with the expected realised loss E[ε1 + ε2(t)] of PrivITP at pool size ``n``, averaged over the
    prompts of ``calib_pool`` (and ``replicates`` subsets each, common random numbers: the same seed for
    every σ), equal to ``epsilon`` within ``rtol`` relative.

    Bisection on log σ between the worst-case-matched σ (whose E[ε] ≤ ε_max = ε) and a σ halved until
    E[ε] > ε. Not an ε-DP guarantee (see the module docstring).

    Returns:
      ``{"sigma_x", "sigma_z", "L", "epsilon1", "expected_epsilon_calib", "epsilon_max", "rel_error",
      "iterations"}``; ``expected_epsilon_calib`` is measured on the calibration prompts.
    """
    from privalign.accounting.expost import PrivITPAccountant
    from privalign.alignment.simulation import MethodSpec, run_protocol

    lo_r, hi_r = r_max_range
    r_max = hi_r - lo_r

    def expected(sx: float) -> float:
        spec = MethodSpec("privitp", beta=beta, sigma_x=sx, sigma_z=ratio * sx, L=L, delta=delta)
        res = run_protocol(
            calib_pool,
            [spec],
            n_grid=[n],
            replicates=replicates,
            random_state=seed,
            transform=transform,
            score_range=r_max_range,
            sensitivity=sensitivity,
            skip_short=True,
            quad_order=quad_order,
            progress=False,
        )
        m = res["methods"][0]
        return float(m["privacy"]["epsilon1"] + m["privacy"]["expected_epsilon2_realized"][0])

    hi = calibrate_worst(
        epsilon, delta, n, beta=beta, r_max=r_max, sensitivity=sensitivity, L=L, ratio=ratio
    )["sigma_x"]
    e_hi = expected(hi)
    lo, e_lo, it = hi, e_hi, 0
    while e_lo <= epsilon:
        lo /= 2.0
        e_lo = expected(lo)
        it += 1
        if it > 60:  # pragma: no cover - would need σ below 1e-18·σ_worst
            raise ValueError(f"calibrate_expected: E[ε] stays below epsilon={epsilon!r} for every σ tried.")
    best, e_best = (hi, e_hi)
    while it < max_iter and abs(e_best - epsilon) > rtol * epsilon:
        mid = math.sqrt(lo * hi)
        e_mid = expected(mid)
        it += 1
        if e_mid > epsilon:
            lo, e_lo = mid, e_mid
        else:
            hi, e_hi = mid, e_mid
        best, e_best = (lo, e_lo) if abs(e_lo - epsilon) < abs(e_hi - epsilon) else (hi, e_hi)
    acc = PrivITPAccountant(
        beta=beta, r_max=r_max, sensitivity=sensitivity, sigma_x=best, sigma_z=ratio * best, L=L, delta=delta
    )
    return {
        "sigma_x": best,
        "sigma_z": ratio * best,
        "L": L,
        "epsilon1": acc.epsilon1,
        "expected_epsilon_calib": e_best,
        "epsilon_max": acc.epsilon_max(n),
        "rel_error": abs(e_best - epsilon) / epsilon,
        "iterations": it,
    }


def privitp_for(
    cfg: dict, n: int, eps: float, match: str, *, ratio: float, L: float, calib, ss, rtol: float = 1e-10
) -> dict:
    """PrivITP's parameters matched to PrivBoN at ``eps`` for pool size ``n`` (the config's
    ``privitp_beta``, ``privitp_delta``, ``sensitivity``, ``score_low``/``score_high`` and, for 'expected',
    ``transform``, ``calib_replicates``, ``quad_order``). ``calib`` is the calibration pool ('expected'
    matching); when it is ``None`` the caller passes the evaluation pool and the record says so."""
    common = dict(beta=cfg["privitp_beta"], sensitivity=cfg["sensitivity"], L=L)
    if match == "worst":
        return calibrate_worst(
            eps,
            cfg["privitp_delta"],
            n,
            r_max=cfg["score_high"] - cfg["score_low"],
            ratio=ratio,
            rtol=rtol,
            **common,
        )
    if match == "expected":
        return calibrate_expected(
            eps,
            cfg["privitp_delta"],
            n,
            calib,
            r_max_range=(cfg["score_low"], cfg["score_high"]),
            ratio=ratio,
            transform=cfg["transform"],
            replicates=cfg["calib_replicates"],
            quad_order=cfg["quad_order"],
            seed=ss,
            **common,
        )
    out = sigma_rule(eps, cfg["sensitivity"])
    out["L"] = L
    return out
