"""Statistical assertions with exact critical values and a stated false-positive rate α.

Each ``*_test`` function returns a :class:`StatTestResult`; each ``assert_*`` function raises
:class:`StatisticalAssertionError` (an ``AssertionError``) when H0 is rejected. Under H0 (the sampler
has the stated law) a rejection happens with probability ≤ α: the critical values come from the exact
null distributions in ``scipy.stats`` (``chi2.isf`` for the asymptotic chi-square law after merging bins
with expected count < 5, ``kstwo.isf`` for the exact one-sample KS law, ``binomtest`` for the exact
binomial test, ``beta.ppf`` for Clopper–Pearson). Running K assertions in one test? Pass ``alpha / K``
to each (Bonferroni).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

from privalign._validation import check_int, check_probability
from privalign.errors import PrivacyParameterError

__all__ = [
    "StatTestResult",
    "StatisticalAssertionError",
    "clopper_pearson",
    "merge_bins",
    "chi_square_test",
    "ks_test",
    "binomial_test",
    "assert_chi_square",
    "assert_ks",
    "assert_binomial",
]


class StatisticalAssertionError(AssertionError):
    """A statistical assertion rejected H0 (false-positive probability ≤ α under H0)."""


@dataclass(frozen=True)
class StatTestResult:
    """Outcome of one test.

    Attributes:
      name: Which test ("chi-square", "ks", "binomial").
      statistic: The test statistic.
      critical_value: Reject when ``statistic > critical_value`` (None for the binomial test, which
        rejects on ``pvalue < alpha``).
      pvalue: Exact (KS, binomial) or asymptotic (chi-square) p-value.
      alpha: The false-positive rate.
      rejected: Whether H0 was rejected.
      details: Extra facts (degrees of freedom, merged bins, n).
    """

    name: str
    statistic: float
    critical_value: float | None
    pvalue: float
    alpha: float
    rejected: bool
    details: dict

    def message(self) -> str:
        verdict = "REJECTED" if self.rejected else "not rejected"
        crit = "" if self.critical_value is None else f", critical value {self.critical_value:.6g}"
        return (
            f"{self.name} test: H0 {verdict} (statistic {self.statistic:.6g}{crit}, p-value "
            f"{self.pvalue:.3g}, alpha {self.alpha:g}; false-positive probability ≤ alpha under H0; "
            f"{self.details})"
        )


def _alpha(alpha: float) -> float:
    return check_probability(alpha, "alpha")


def clopper_pearson(k: Any, n: Any, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided exact (Clopper–Pearson) interval for a binomial proportion, coverage ≥ 1 − α.

    Each tail gets α/2: ``lo = Beta(α/2; k, n−k+1)``, ``hi = Beta(1−α/2; k+1, n−k)`` (0 and 1 at the
    edges; the upper end via the inverse survival function, so a tiny α/2 is not lost to rounding in 1 − α/2).
    Vectorized over ``k`` and ``n``.

    Args:
      k: Successes (0 ≤ k ≤ n).
      n: Trials (≥ 1).
      alpha: Miscoverage in (0, 1).

    Returns:
      ``(lo, hi)`` arrays (0-d arrays for scalar input).
    """
    alpha = _alpha(alpha)
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise PrivacyParameterError(
            f"clopper_pearson needs 0 ≤ k ≤ n and n ≥ 1. Got k={k!r}, n={n!r} instead."
        )
    with np.errstate(invalid="ignore"):
        lo = np.where(k > 0, _st.beta.ppf(alpha / 2.0, k, n - k + 1.0), 0.0)
        hi = np.where(k < n, _st.beta.isf(alpha / 2.0, k + 1.0, n - k), 1.0)  # isf: no 1 − α/2 rounding
    return lo, hi


def merge_bins(expected: Any, observed: Any, min_expected: float = 5.0) -> tuple[np.ndarray, np.ndarray, int]:
    """Merge bins so that every merged bin has expected count ≥ ``min_expected``.

    Bins are sorted by expected count and grouped greedily from the smallest; a final group still below
    the minimum is merged into the previous one. The grouping depends only on ``expected`` (the null
    law), never on the observations, so the test's α is unaffected.

    Returns:
      ``(expected_merged, observed_merged, n_merged_away)``.
    """
    e = np.asarray(expected, dtype=np.float64)
    o = np.asarray(observed, dtype=np.float64)
    order = np.argsort(e, kind="stable")
    groups: list[list[int]] = []
    cur: list[int] = []
    acc = 0.0
    for i in order:
        cur.append(int(i))
        acc += e[i]
        if acc >= min_expected:
            groups.append(cur)
            cur, acc = [], 0.0
    if cur:
        if groups:
            groups[-1].extend(cur)
        else:
            groups.append(cur)
    em = np.array([e[g].sum() for g in groups])
    om = np.array([o[g].sum() for g in groups])
    return em, om, len(e) - len(groups)


def chi_square_test(
    observed: Any, probabilities: Any, alpha: float, *, min_expected: float = 5.0
) -> StatTestResult:
    """Pearson chi-square goodness of fit of counts against a closed-form law.

    Args:
      observed: Counts per category (non-negative integers).
      probabilities: The null law (non-negative, sums to 1 within 1e-9).
      alpha: False-positive rate; critical value ``chi2.isf(alpha, df)`` with df = merged bins − 1.
      min_expected: Bins are merged until every expected count is ≥ this (default 5).

    Returns:
      The result. A category with null probability 0 and a positive count rejects outright.
    """
    alpha = _alpha(alpha)
    o = np.asarray(observed, dtype=np.float64).ravel()
    p = np.asarray(probabilities, dtype=np.float64).ravel()
    if o.shape != p.shape or o.size < 2:
        raise PrivacyParameterError(
            f"chi_square_test needs observed and probabilities of the same length ≥ 2. Got {o.shape} and "
            f"{p.shape} instead."
        )
    if np.any(p < 0) or abs(p.sum() - 1.0) > 1e-9:
        raise PrivacyParameterError(
            f"The 'probabilities' parameter must be a law summing to 1. Got sum {p.sum()!r} instead."
        )
    n = o.sum()
    impossible = (p == 0) & (o > 0)
    if impossible.any():
        return StatTestResult(
            "chi-square",
            float("inf"),
            0.0,
            0.0,
            alpha,
            True,
            {"reason": f"count {o[impossible][0]:g} in a category of null probability 0", "n": int(n)},
        )
    keep = p > 0
    em, om, merged = merge_bins(n * p[keep], o[keep], min_expected)
    df = len(em) - 1
    if df < 1:
        raise PrivacyParameterError(
            f"chi_square_test: after merging bins with expected count < {min_expected:g} only one bin "
            f"remains (n={n:g}); use more samples."
        )
    stat = float(np.sum((om - em) ** 2 / em))
    crit = float(_st.chi2.isf(alpha, df))
    pval = float(_st.chi2.sf(stat, df))
    return StatTestResult(
        "chi-square", stat, crit, pval, alpha, stat > crit, {"df": df, "bins_merged": merged, "n": int(n)}
    )


def ks_test(
    samples: Any, cdf: Callable[[np.ndarray], np.ndarray] | str, alpha: float, args: tuple = ()
) -> StatTestResult:
    """One-sample Kolmogorov–Smirnov test against a continuous law.

    Args:
      samples: 1-D sample.
      cdf: A callable CDF or a ``scipy.stats`` distribution name (with ``args``).
      alpha: False-positive rate; critical value ``kstwo(n).isf(alpha)`` (the exact law of D_n).
    """
    alpha = _alpha(alpha)
    x = np.asarray(samples, dtype=np.float64).ravel()
    n = x.size
    if n < 1:
        raise PrivacyParameterError("ks_test needs at least one sample. Got 0 instead.")
    res = _st.kstest(x, cdf, args=args, method="exact")
    crit = float(_st.kstwo.isf(alpha, n))
    stat = float(res.statistic)
    return StatTestResult("ks", stat, crit, float(res.pvalue), alpha, stat > crit, {"n": int(n)})


def binomial_test(k: int, n: int, p: float, alpha: float) -> StatTestResult:
    """Exact two-sided binomial test of ``k`` successes in ``n`` trials against success probability ``p``."""
    alpha = _alpha(alpha)
    n = check_int(n, "n", low=1)
    k = check_int(k, "k", low=0, high=n)
    p = check_probability(p, "p", closed="both")
    res = _st.binomtest(k, n, p, alternative="two-sided")
    return StatTestResult(
        "binomial", k / n, None, float(res.pvalue), alpha, bool(res.pvalue < alpha), {"k": k, "n": n, "p": p}
    )


def _raise_if(res: StatTestResult) -> StatTestResult:
    if res.rejected:
        raise StatisticalAssertionError(res.message())
    return res


def assert_chi_square(
    observed: Any, probabilities: Any, alpha: float, *, min_expected: float = 5.0
) -> StatTestResult:
    """Raise :class:`StatisticalAssertionError` if :func:`chi_square_test` rejects."""
    return _raise_if(chi_square_test(observed, probabilities, alpha, min_expected=min_expected))


def assert_ks(samples: Any, cdf: Callable | str, alpha: float, args: tuple = ()) -> StatTestResult:
    """Raise :class:`StatisticalAssertionError` if :func:`ks_test` rejects."""
    return _raise_if(ks_test(samples, cdf, alpha, args))


def assert_binomial(k: int, n: int, p: float, alpha: float) -> StatTestResult:
    """Raise :class:`StatisticalAssertionError` if :func:`binomial_test` rejects."""
    return _raise_if(binomial_test(k, n, p, alpha))
