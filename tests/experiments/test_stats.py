"""The one statistics module of the verdicts (:mod:`privalign.stats`): the bootstrap draws in a fixed order
(the same generator gives the same replicates in every caller), Holm's step-down, Bonferroni intervals,
equivalence by an interval and the best point on a KL path."""

from __future__ import annotations

import numpy as np
import pytest

from privalign.stats import (
    best_on_path,
    bootstrap_diff,
    bootstrap_means,
    bootstrap_p_value,
    holm,
    interval,
    stream,
    within,
)


def _reference_boot(rng, mats, B):
    """The loop the experiments used before (prompts jointly, each matrix's seeds independently)."""
    P = mats[0].shape[1]
    out = np.empty((B, len(mats)))
    for b in range(B):
        p = rng.integers(0, P, P)
        for k, W in enumerate(mats):
            out[b, k] = W[rng.integers(0, W.shape[0], W.shape[0])][:, p].mean()
    return out


def test_bootstrap_draws_are_those_of_the_experiments_loop():
    g = np.random.default_rng(3)
    a, b = g.normal(size=(3, 11)), g.normal(size=(2, 11))
    want = _reference_boot(stream(7, 2**30, 8000, 1000), [a, b], 50)
    np.testing.assert_array_equal(bootstrap_means(stream(7, 2**30, 8000, 1000), [a, b], 50), want)
    np.testing.assert_array_equal(
        bootstrap_diff(stream(7, 2**30, 8000, 1000), a, b, 50), want[:, 0] - want[:, 1]
    )
    # the stream is the SeedSequence child the verdicts always used
    x = np.random.default_rng(np.random.SeedSequence(7, spawn_key=(2**30, 8000, 1000))).random(4)
    np.testing.assert_array_equal(stream(7, 2**30, 8000, 1000).random(4), x)


def test_bootstrap_resamples_prompts_jointly():
    # two matrices equal up to a constant: every replicate's difference is that constant (shared prompts)
    W = np.random.default_rng(0).normal(size=(1, 20))
    np.testing.assert_allclose(bootstrap_diff(np.random.default_rng(1), W + 0.3, W, 200), 0.3, atol=1e-12)


def test_intervals_and_p_value():
    d = np.random.default_rng(0).normal(size=2001)
    assert interval(d) == tuple(float(q) for q in np.quantile(d, [0.025, 0.975]))
    assert interval(d, 0.05, 4) == tuple(float(q) for q in np.quantile(d, [0.05 / 8, 1 - 0.05 / 8]))
    lo, hi = interval(d)
    lo4, hi4 = interval(d, k=4)
    assert lo4 < lo < hi < hi4  # Bonferroni widens
    assert bootstrap_p_value(np.array([-1.0, 0.0, 1.0, 2.0])) == 3 / 5
    assert bootstrap_p_value(np.ones(99)) == 1 / 100  # never 0


def test_holm_step_down():
    assert holm([0.04, 0.001, 0.03]) == [(0.05, False), (0.05 / 3, True), (0.025, False)]
    assert holm([0.01, 0.02, 0.03]) == [(0.05 / 3, True), (0.025, True), (0.05, True)]
    assert holm([0.5, 0.001]) == [(0.05, False), (0.025, True)]
    assert holm([]) == []
    # it stops at the first acceptance even if a later p-value is below its own level
    assert [r for _, r in holm([0.001, 0.03, 0.049], alpha=0.05)] == [True, False, False]


def _holm_adjusted_reject(p: np.ndarray, alpha: float) -> list[bool]:
    """Reference: Holm by adjusted p-values (Wright 1992), p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)),
    rejected iff p̃ ≤ α: another algorithm than the step-down loop of :func:`holm`."""
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m, dtype=bool)
    out[order] = adj <= alpha
    return out.tolist()


def test_holm_agrees_with_adjusted_p_values():
    # always runs (was a statsmodels comparison, skipped where statsmodels is absent); α = 0.05 and 0.1
    rng = np.random.default_rng(5)
    for _ in range(200):
        p = rng.uniform(0, 0.06, size=int(rng.integers(1, 15)))
        for alpha in (0.05, 0.1):
            assert [r for _, r in holm(list(p), alpha=alpha)] == _holm_adjusted_reject(p, alpha)
    # a hand-worked case: sorted 0.005 ≤ 0.05/4, 0.01 ≤ 0.05/3, then 0.03 > 0.05/2 stops
    assert _holm_adjusted_reject(np.array([0.01, 0.04, 0.03, 0.005]), 0.05) == [True, False, False, True]


def test_t_quantiles_and_replicated_test():
    from scipy import stats

    from privalign.stats import Z80, mdd, replicated_test, t_crit, t_quantile

    assert Z80 == float(stats.norm.ppf(0.8))
    assert t_quantile(0.975, 7.5) == pytest.approx(float(stats.t.ppf(0.975, 7.5)))  # a fractional df
    assert t_quantile(0.95, 0.2) == t_quantile(0.95, 1.0)  # df below 1 counts as 1
    assert t_crit(10, 0.05, 5) == t_quantile(0.99, 10)
    assert mdd(0.1, 10) == pytest.approx((t_crit(10) + Z80) * 0.1)
    c = {"mean": 0.05, "se": 0.01, "df": 9.0, "R": 3}
    t = replicated_test(c, alpha=0.05, margin=0.03)
    assert t["better"] and not t["worse"] and not t["equivalent"]
    assert t["p_better"] == pytest.approx(float(stats.t.sf(5.0, 9.0)))
    assert t["lo"] == pytest.approx(0.05 - float(stats.t.ppf(0.95, 9.0)) * 0.01)
    tie = replicated_test({**c, "mean": 0.001}, alpha=0.05, margin=0.03)
    assert tie["equivalent"] and not tie["better"]
    assert replicated_test({**c, "R": 1}, alpha=0.05, margin=0.03) == {"ok": False}  # one seed: no test
    assert replicated_test({**c, "R": 2}, alpha=0.05, margin=0.03, min_seeds=3) == {"ok": False}


def test_within_is_strict():
    assert within(-0.01, 0.01, 0.02) and not within(-0.02, 0.01, 0.02) and not within(-0.01, 0.03, 0.02)


def test_best_on_path_takes_points_and_the_budget_crossing_mixture():
    kls = np.array([0.0, 0.5, 2.0])
    mats = [np.full((1, 3), g) for g in (0.5, 0.6, 0.9)]
    W, where = best_on_path(kls, mats, [0, 10, 20], 1.0)
    lam = (1.0 - 0.5) / (2.0 - 0.5)
    assert where == {"x": [10, 20], "mix": pytest.approx(lam), "kl": 1.0}
    np.testing.assert_allclose(W, (1 - lam) * 0.6 + lam * 0.9)
    W, where = best_on_path(kls, mats, [0, 10, 20], 0.5)
    assert where == {"x": 10, "kl": 0.5} and W.mean() == pytest.approx(0.6)
    assert best_on_path(np.array([1.0]), mats[:1], [5], 0.5) is None


def test_winrate_bonferroni_interval_is_at_alpha_over_k():
    """The winrate gaps' (1 − 0.05/k) interval: k is the number of gaps (it was shadowed by the bootstrap
    loop's counter, so the interval was read at 1 − 0.05/(B − 1) whatever k was)."""
    from privalign.experiments.winrate import _paired_diff_ci

    g = np.random.default_rng(2)
    rows = [
        {
            "dataset": "imdb",
            "method": m,
            "epsilon": 8.0,
            "per_prompt": list(g.uniform(size=15)),
            "n_bootstrap": 400,
        }
        for m in ("a", "b")
        for _ in range(2)
    ]
    lo, hi, lo1, hi1 = _paired_diff_ci(rows, "imdb", "a", "b", 8.0, k=1)
    assert (lo1, hi1) == (lo, hi)
    lo, hi, lo3, hi3 = _paired_diff_ci(rows, "imdb", "a", "b", 8.0, k=3)
    Wa = np.array([r["per_prompt"] for r in rows[:2]])
    Wb = np.array([r["per_prompt"] for r in rows[2:]])
    d = _reference_boot(stream(0, 2**24), [Wa, Wb], 400)
    d = d[:, 0] - d[:, 1]
    assert (lo3, hi3) == tuple(float(q) for q in np.quantile(d, [0.05 / 6, 1 - 0.05 / 6]))
