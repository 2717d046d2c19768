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
* **Best point on a KL path** (:func:`best_on_path`): the best gold at KL ≤ budget along a policy's path,
  a segment crossing the budget counting as the mixture of its end policies that spends the budget.

numpy only (no scipy at import: this module sits low, under ``rlhf`` and ``experiments``).
"""

from __future__ import annotations

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
]

#: The family-wise false-positive rate of the experiments' verdicts.
ALPHA = 0.05


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
