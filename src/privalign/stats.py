"""The statistics the experiments' verdicts share: bootstrap intervals, multiple testing, the best point on a
KL path, and equivalence by an interval.

Every function takes its randomness as an argument (a seeded ``numpy.random.Generator``; :func:`stream`
derives one from a root seed and a key) and draws in a fixed order, so the same generator gives the same
replicates in every caller.

* **Bootstrap** (:func:`bootstrap_means`, :func:`bootstrap_diff`): gold matrices ``(seeds, prompts)``; each
  replicate resamples the prompts once, jointly for all matrices (the prompts are shared, so the comparison
  is paired), and each matrix's seeds independently (its seeds are its own). :func:`paired_bootstrap_ci`
  resamples the rows of one per-prompt vector (a paired difference, one seed).
* **Intervals**: percentile intervals (:func:`interval`); at level α/k they are Bonferroni's over k
  comparisons. **One-sided bootstrap p-value** of ``H0: difference ≤ 0``: ``(1 + #{d* ≤ 0}) / (B + 1)``
  (:func:`bootstrap_p_value`; Davison & Hinkley 1997, §4.4, so a p-value is never 0).
* **Holm's step-down** over p-values at family-wise level α (:func:`holm`; Holm 1979).
* **Equivalence**: a difference is shown within ``± margin`` when a (1 − α/k) interval lies inside it
  (:func:`within`; the interval form of two one-sided tests, Schuirmann 1987).
* **Student-t tests** (scipy, imported when called): the exact quantile at a possibly fractional
  (Welch–Satterthwaite) df (:func:`t_quantile`), one-sided critical values at α/k (:func:`t_crit`), the
  minimal detectable difference at power ≈ 0.8 (:func:`mdd`), the paired TOST of two classifiers on the same
  test pairs (:func:`paired_tost`) and one replicated comparison over fit seeds (:func:`replicated_test`).
* **Best point on a KL path** (:func:`best_on_path`): the best gold at KL ≤ budget along a policy's path,
  a segment crossing the budget counting as the mixture of its end policies that spends the budget.

numpy only at import (scipy is imported inside the t-test functions: this module sits low, under ``rlhf``
and ``experiments``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from privalign._validation import check_int

__all__ = [
    "ALPHA",
    "stream",
    "bootstrap_means",
    "bootstrap_diff",
    "paired_bootstrap_ci",
    "interval",
    "bootstrap_p_value",
    "holm",
    "within",
    "best_on_path",
    "Z80",
    "t_quantile",
    "t_crit",
    "mdd",
    "paired_tost",
    "replicated_test",
]

#: The family-wise false-positive rate of the experiments' verdicts.
ALPHA = 0.05
#: z_{0.8}, the standard normal 0.8-quantile (scipy.stats.norm.ppf(0.8)): a one-sided test at critical value
#: c detects a true difference of (c + z_{0.8})·SE with power ≈ 0.8.
Z80 = 0.8416212335729143
#: An SE at or below this is zero (the tests then decide on the sign of the mean alone).
_TINY = 1e-12


def stream(root_seed: int, *key: int) -> np.random.Generator:
    """The generator of stream ``key`` of ``root_seed``, ``default_rng(SeedSequence(root_seed,
    spawn_key=key))`` (each verdict draws from its own key: adding a comparison moves no other's draws)."""
    return np.random.default_rng(np.random.SeedSequence(int(root_seed), spawn_key=tuple(int(k) for k in key)))


def bootstrap_means(rng: np.random.Generator, mats: Sequence[np.ndarray], B: int) -> np.ndarray:
    """``(B, len(mats))`` bootstrap means of ``(seeds, prompts)`` matrices sharing their prompts: per
    replicate, the prompts are resampled once for all matrices, and each matrix's seeds independently.

    >>> W = np.arange(6.0).reshape(2, 3)
    >>> bootstrap_means(np.random.default_rng(0), [W, W], 4).shape
    (4, 2)
    """
    P = mats[0].shape[1]
    out = np.empty((B, len(mats)))
    for b in range(B):
        p = rng.integers(0, P, P)
        for k, W in enumerate(mats):
            out[b, k] = W[rng.integers(0, W.shape[0], W.shape[0])][:, p].mean()
    return out


def bootstrap_diff(rng: np.random.Generator, a: np.ndarray, b: np.ndarray, B: int) -> np.ndarray:
    """``B`` bootstrap replicates of ``mean(a) − mean(b)`` (:func:`bootstrap_means` of ``[a, b]``)."""
    boot = bootstrap_means(rng, [a, b], B)
    return boot[:, 0] - boot[:, 1]


def paired_bootstrap_ci(
    per_prompt: np.ndarray, *, n_boot: int, rng: np.random.Generator, alpha: float = ALPHA
) -> tuple[float, float, float]:
    """``(lo, hi, se)``: the (1 − alpha) percentile bootstrap interval of the mean over prompts (rows
    resampled) and the replicates' standard deviation."""
    x = np.asarray(per_prompt, float)
    idx = rng.integers(0, x.shape[0], size=(check_int(n_boot, "n_boot", low=10), x.shape[0]))
    boot = x[idx].mean(axis=1)
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi), float(boot.std(ddof=1))


def interval(replicates: np.ndarray, alpha: float = ALPHA, k: int = 1) -> tuple[float, float]:
    """The two-sided ``1 − α/k`` percentile interval of bootstrap replicates (``k > 1``: Bonferroni over k
    comparisons)."""
    lo, hi = np.quantile(replicates, [alpha / (2 * k), 1 - alpha / (2 * k)])
    return float(lo), float(hi)


def bootstrap_p_value(diffs: np.ndarray) -> float:
    """One-sided bootstrap p-value of ``H0: difference ≤ 0``: ``(1 + #{d* ≤ 0}) / (B + 1)``."""
    d = np.asarray(diffs, float)
    return float((1 + np.sum(d <= 0)) / (d.size + 1))


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> list[tuple[float, bool]]:
    """Holm's step-down at family-wise level ``alpha``: per p-value (in the order given), its level
    ``α / (k − rank)`` and whether it is rejected (sorted ascending, ties in the order given; rejections stop
    at the first p-value above its level).

    >>> holm([0.04, 0.001, 0.03])
    [(0.05, False), (0.016666666666666666, True), (0.025, False)]
    """
    k = len(p_values)
    out: list[tuple[float, bool]] = [(0.0, False)] * k
    stop = False
    for rank, i in enumerate(sorted(range(k), key=lambda j: p_values[j])):
        level = alpha / (k - rank)
        reject = not stop and p_values[i] <= level
        stop = stop or not reject
        out[i] = (level, reject)
    return out


def within(lo: float, hi: float, margin: float) -> bool:
    """Whether the interval ``[lo, hi]`` lies strictly inside ``(−margin, margin)`` (equivalence shown)."""
    return bool(-margin < lo and hi < margin)


def best_on_path(
    kls: np.ndarray, mats: Sequence[np.ndarray], xs: Sequence[object], budget: float
) -> tuple[np.ndarray, dict] | None:
    """The best gold at KL ≤ ``budget`` along a policy's path: points ``(kls[j], mats[j])`` in training order
    (``mats[j]``: ``(seeds, prompts)`` per-prompt gold; ``xs[j]``: the point's label, e.g. its step). A point
    within the budget is a candidate as it is; a segment that crosses the budget contributes the mixture of
    its two end policies that spends exactly the budget: the mixture's gold is the interpolated gold and its
    KL is at most the interpolated KL (KL is convex in the policy), so it is a policy at KL ≤ budget.
    Returns the best candidate's ``(seeds, prompts)`` gold and where it lies (``{"x", "kl"}``, plus
    ``"mix"`` for a mixture), or ``None`` when no point is within the budget. KLs are taken as given (a
    Monte Carlo estimate's error is not propagated)."""
    best: tuple[float, np.ndarray, dict] | None = None
    for j in range(len(kls)):
        if kls[j] <= budget + 1e-12:
            cand = (float(mats[j].mean()), mats[j], {"x": xs[j], "kl": float(kls[j])})
        elif j > 0 and kls[j - 1] <= budget:
            lam = (budget - kls[j - 1]) / (kls[j] - kls[j - 1])
            W = (1 - lam) * mats[j - 1] + lam * mats[j]
            cand = (float(W.mean()), W, {"x": [xs[j - 1], xs[j]], "mix": float(lam), "kl": float(budget)})
        else:
            continue
        if best is None or cand[0] > best[0]:
            best = cand
    return None if best is None else (best[1], best[2])


def t_quantile(p: float, df: float) -> float:
    """Exact Student-t quantile ``t_{p, df}`` at a (possibly fractional, Welch–Satterthwaite) df ≥ 1."""
    from scipy import stats

    return float(stats.t.ppf(p, max(df, 1.0)))


def t_crit(df: int, alpha: float = ALPHA, k: int = 1) -> float:
    """One-sided critical value ``t_{1−α/k, df}`` (exact Student t quantile; Bonferroni over ``k``)."""
    return t_quantile(1.0 - alpha / k, df)


def mdd(se: float, df: int, alpha: float = ALPHA, k: int = 1) -> float:
    """Minimum detectable difference at power ≈ 0.8: ``(t_{1−α/k, df} + z_0.8)·se``."""
    return (t_crit(df, alpha, k) + Z80) * se


def paired_tost(b: int, c: int, n: int, *, margin: float, alpha: float = ALPHA) -> dict:
    """Paired TOST (two one-sided tests) that two classifiers' accuracies on the same ``n`` test pairs
    differ by less than ``margin``.

    The per-pair differences are +1 (``b`` pairs only the first gets right), −1 (``c`` pairs only the
    second) and 0 otherwise; D = (b − c)/n is their mean, SE its standard error. Equivalence is shown at
    level ``alpha`` when both ``(D + margin)/SE`` and ``(margin − D)/SE`` exceed the exact Student-t
    quantile ``t_{1−α, n−1}`` (equivalently, the (1 − 2α) interval lies inside ±margin). The p-value is the
    larger of the two one-sided p-values. With SE = 0 (no discordant pairs) equivalence holds iff
    |D| < margin.
    """
    from scipy import stats

    mean = (b - c) / n
    var = ((b + c) - n * mean**2) / max(n - 1, 1)
    se = math.sqrt(max(var, 0.0) / n)
    df = max(n - 1, 1)
    if se <= _TINY:
        p = 0.0 if abs(mean) < margin else 1.0
    else:
        p = float(max(stats.t.sf((mean + margin) / se, df), stats.t.sf((margin - mean) / se, df)))
    crit = t_crit(df, alpha)
    return {
        "diff": mean,
        "se": se,
        "p": p,
        "equivalent": p < alpha,
        "lo": mean - crit * se,
        "hi": mean + crit * se,
        "margin": margin,
        "alpha": alpha,
    }


def replicated_test(c: dict, *, alpha: float, margin: float, min_seeds: int = 2) -> dict:
    """One replicated comparison (fields ``mean``, ``se``, ``df``, ``R``: the seed-averaged paired difference,
    its SE, Welch–Satterthwaite df and number of fit seeds) at level ``alpha``: one-sided t-tests both ways,
    TOST within ±``margin``, the (1 − 2α) interval and the minimal detectable difference
    ``(t_{1−α, df} + z_0.8)·SE`` (power ≈ 0.8). ``{"ok": False}`` with no SE or fewer than ``min_seeds``
    fit seeds (one fit says nothing about the DP noise)."""
    from scipy import stats

    if c.get("se") is None or (c.get("R") or 0) < min_seeds:
        return {"ok": False}
    m, se, df = float(c["mean"]), float(c["se"]), float(c["df"])
    tq = t_quantile(1.0 - alpha, df)
    if se <= _TINY:
        better, worse, equiv = m > _TINY, m < -_TINY, abs(m) < margin
        p_b = 0.0 if better else 1.0
        p_w = 0.0 if worse else 1.0
        p_eq = 0.0 if equiv else 1.0
    else:
        p_b = float(stats.t.sf(m / se, df))
        p_w = float(stats.t.sf(-m / se, df))
        p_eq = float(max(stats.t.sf((m + margin) / se, df), stats.t.sf((margin - m) / se, df)))
        better, worse, equiv = p_b < alpha, p_w < alpha, p_eq < alpha
    return {
        "ok": True,
        "better": bool(better),
        "worse": bool(worse),
        "equivalent": bool(equiv),
        "p_better": p_b,
        "p_worse": p_w,
        "p_equivalent": p_eq,
        "lo": m - tq * se,
        "hi": m + tq * se,
        "mdd": (tq + Z80) * se,
    }
