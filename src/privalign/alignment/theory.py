"""Theory helpers: the critical budget ε*, the regularisation temperature σ_reg, and estimators of the
coverage coefficient C^{π*} and of the reward-model error ε_RM from a pool with true rewards.

Conventions (spec-inference-time §1.2): ``χ²(p‖q) = ½·E_q[(p/q − 1)²]`` so ``C^π = E_π[π/π0] = 1 + 2χ²``.
On a pool of n samples from π0 each sample is an atom of π0-mass 1/n, so ``C^π = n·Σ_i π_i²``; for the
comparator, the best-true-reward policy on the pool (uniform over the k maximisers), ``C = n/k``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from privalign._validation import check_real
from privalign.errors import PrivacyParameterError

__all__ = [
    "epsilon_star",
    "sigma_reg",
    "coverage",
    "best_policy_coverage",
    "reward_model_error",
    "estimate_theory",
]


def epsilon_star(sensitivity: float, coverage: float, eps_rm: float) -> float:
    """``ε* = 2Δ·√C/ε_RM`` (paper 1, arXiv 2608.26324): above it PrivBoN's noise costs no extra regret."""
    d = check_real(sensitivity, "sensitivity", low=0.0, closed="neither")
    c = check_real(coverage, "coverage", low=1.0, closed="left")
    e = check_real(eps_rm, "eps_rm", low=0.0, closed="neither")
    return 2.0 * d * math.sqrt(c) / e


def sigma_reg(coverage: float, eps_rm: float) -> float:
    """The regret-optimal temperature ``σ_reg = ε_RM/√C`` implied by ε* (``2Δ/ε ≤ σ_reg ⇔ ε ≥ ε*``)."""
    c = check_real(coverage, "coverage", low=1.0, closed="left")
    e = check_real(eps_rm, "eps_rm", low=0.0, closed="left")
    return e / math.sqrt(c)


def coverage(policy: ArrayLike, base: ArrayLike | None = None) -> np.ndarray:
    """``C^π = Σ_i π_i²/π0_i`` row-wise (``base`` default: uniform over the pool, i.e. ``n·Σ π_i²``)."""
    p = np.atleast_2d(np.asarray(policy, dtype=np.float64))
    if np.any(p < 0) or not np.allclose(p.sum(axis=1), 1.0, atol=1e-9):
        raise PrivacyParameterError(
            "The 'policy' parameter must hold probability vectors (non-negative, summing to 1)."
        )
    q = (
        np.full_like(p, 1.0 / p.shape[1])
        if base is None
        else np.atleast_2d(np.asarray(base, dtype=np.float64))
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * p / q, 0.0)
    return terms.sum(axis=1)


def best_policy_coverage(true_rewards: ArrayLike) -> np.ndarray:
    """Coverage of the best-true-reward policy on each prompt's pool: ``n/k`` (k = number of maximisers)."""
    t = np.atleast_2d(np.asarray(true_rewards, dtype=np.float64))
    if not np.isfinite(t).all():
        raise PrivacyParameterError(
            "The 'true_rewards' parameter must be finite (pools without true rewards cannot estimate C)."
        )
    k = np.sum(t == t.max(axis=1, keepdims=True), axis=1)
    return t.shape[1] / k


def reward_model_error(proxy: ArrayLike, true_rewards: ArrayLike) -> np.ndarray:
    """``ε_RM(x) = sqrt(E_{π0}[(r* − r̂)²])`` per prompt (both on the same scale, e.g. [0, R_max])."""
    p = np.atleast_2d(np.asarray(proxy, dtype=np.float64))
    t = np.atleast_2d(np.asarray(true_rewards, dtype=np.float64))
    if p.shape != t.shape:
        raise PrivacyParameterError(
            f"The 'true_rewards' parameter must have shape {p.shape}. Got {t.shape} instead."
        )
    return np.sqrt(np.nanmean((t - p) ** 2, axis=1))


def estimate_theory(proxy: ArrayLike, true_rewards: ArrayLike, *, sensitivity: float) -> dict[str, float]:
    """Pool-level estimates: mean C of the best policy, RMS ε_RM, and the implied ε* and σ_reg."""
    c = float(np.mean(best_policy_coverage(true_rewards)))
    e = float(np.sqrt(np.mean(reward_model_error(proxy, true_rewards) ** 2)))
    out = {"coverage": c, "eps_rm": e, "sigma_reg": sigma_reg(c, e)}
    out["epsilon_star"] = epsilon_star(sensitivity, c, e) if e > 0 else math.inf
    return out
