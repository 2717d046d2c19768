"""p2-accuracy's sparsity check: the power of the paired exact McNemar test, the sparse-vs-dense
table and its verdicts, the Peeling signal-to-noise diagnostic, and the d-aware default T of Sample-DP IHT."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privalign.estimation.iht import NOISE_SCALE_TARGET, _peeling, default_n_iter
from privalign.experiments.paper2 import mcnemar_power, peeling_snr, sparse_dense_pairs, sparse_dense_table


def test_mcnemar_power_exact_small_case():
    # D = 10 discordant of n = 100; a +0.05 gain means b ~ Binomial(10, 0.75). Exact one-sided critical value
    # at α = 0.05: P(X ≥ 9 | ½) = 11/1024 ≤ 0.05 < P(X ≥ 8 | ½) = 56/1024,
    # so power = P(Binomial(10, 0.75) ≥ 9).
    want = 10 * 0.75**9 * 0.25 + 0.75**10
    assert mcnemar_power(6, 4, 100, gain=0.05, alpha=0.05) == pytest.approx(want, rel=1e-12)
    assert mcnemar_power(0, 0, 100) == 0.0
    # more discordant pairs at the same gain and n: the alternative is closer to ½, power falls
    assert mcnemar_power(60, 40, 400) < mcnemar_power(15, 10, 400)
    # a large gain relative to D saturates at p1 = 1
    assert mcnemar_power(5, 5, 1000, gain=0.5) == pytest.approx(1.0)


def _rec(ds, fm, method, eps, correct):
    return {
        "kind": "accuracy",
        "dataset": ds,
        "features": fm,
        "method": method,
        "epsilon": eps,
        "accuracy": correct.count("1") / len(correct),
        "correct": correct,
    }


def test_sparse_dense_table_verdicts_follow_the_discordant_pairs():
    n = 200
    strong = "1" * 150 + "0" * 50  # sparse right on 150
    weak = "0" * 60 + "1" * 90 + "0" * 50  # dense right on 90 of the same
    recs = [
        _rec("hh-rlhf", "harm-lexicon", "RRIHT", 8.0, strong),
        _rec("hh-rlhf", "harm-lexicon", "DenseRR", 8.0, weak),
        _rec("hh-rlhf", "harm-lexicon", "SampleDPIHT", 8.0, weak),
        _rec("hh-rlhf", "harm-lexicon", "DPSGDLinear", 8.0, strong),
        _rec("hh-rlhf", "hashed-ngram", "RRIHT", 8.0, strong),
        _rec("hh-rlhf", "hashed-ngram", "DenseRR", 8.0, strong),
    ]
    pairs = sparse_dense_pairs(recs, epsilons=(8.0,))
    assert {p["dataset"] for p in pairs} == {"hh-rlhf", "hh-rlhf[harm-lexicon]"}
    rows = {(r["dataset"], r["sparse"]): r for r in sparse_dense_table(recs)}
    assert len(rows) == 3
    r = rows[("hh-rlhf[harm-lexicon]", "RRIHT")]
    assert (r["only_sparse_right"], r["only_dense_right"]) == (60, 0) and r["verdict"] == "sparse better"
    assert r["diff"] == pytest.approx(60 / n) and r["diff_ci95"][0] > 0
    assert r["alpha_per_test"] == pytest.approx(0.05 / 3)
    assert rows[("hh-rlhf[harm-lexicon]", "SampleDPIHT")]["verdict"] == "dense better"
    tie = rows[("hh-rlhf", "RRIHT")]
    assert tie["p_sparse_better"] == 1.0 and tie["verdict"].startswith(
        "no significant difference (power 0.00"
    )


def test_peeling_snr_matches_its_formula():
    rng = np.random.default_rng(0)
    n, d = 400, 50
    X = rng.choice([-1.0, 0.0, 1.0], size=(n, d))
    y = (X[:, 0] + 0.3 * rng.standard_normal(n) > 0).astype(float)
    r = peeling_snr(
        X, y, epsilon=4.0, delta=1e-5, sparsity=2, step_size=4.0, feature_bound=1.0, n_candidates=2
    )
    nu = _peeling(2, 2.0, 0.5e-5, 1.0).noise_multiplier
    g = np.sort(np.abs(X.T @ (0.5 - y)) / n)[::-1]
    h = sum(1.0 / k for k in range(1, d + 1))
    assert r["noise_multiplier"] == pytest.approx(nu)
    assert r["signal_top1"] == pytest.approx(4.0 * g[0]) and r["signal_top_s"] == pytest.approx(4.0 * g[1])
    assert r["n_needed_top1"] == pytest.approx(2.0 * nu * h / g[0])
    T = r["T"]
    assert r["expected_max_noise"] == pytest.approx(nu * 8.0 / (n // T) * h)
    assert r["selectable_top_s"] == (r["signal_top_s"] > r["expected_max_noise"])


def test_default_n_iter_noise_target_shrinks_with_log_d():
    nu, n = 6.0, 8000
    base = default_n_iter(n, noise_multiplier=nu, step_size=4.0)
    assert default_n_iter(n, noise_multiplier=nu, step_size=4.0, n_features=200) == base
    assert (
        default_n_iter(n, noise_multiplier=nu, step_size=4.0, n_features=50) == base
    )  # no change for d ≤ 200
    h = lambda d: sum(1.0 / k for k in range(1, d + 1))  # noqa: E731
    tau = NOISE_SCALE_TARGET * h(200) / h(6400)
    want = max(1, min(math.ceil(3 * math.log(n)), math.floor(tau * n / (8.0 * nu))))
    assert default_n_iter(n, noise_multiplier=nu, step_size=4.0, n_features=6400) == want < base


def test_sample_dp_reading_marks_where_the_need_is_met_and_chance():
    from privalign.experiments.paper2 import _sample_dp_reading

    snr = [
        {"dataset": "imdb", "features": "hashed-ngram", "epsilon": e, "n_fit": 1000, "n_needed_top_s": need}
        for e, need in ((2.0, 5000.0), (8.0, 800.0))
    ]
    acc = [
        {
            "dataset": "imdb",
            "features": "hashed-ngram",
            "method": "SampleDPIHT",
            "epsilon": 2.0,
            "accuracy": 0.51,
            "accuracy_se": 0.02,
        },
        {
            "dataset": "imdb",
            "features": "hashed-ngram",
            "method": "SampleDPIHT",
            "epsilon": 8.0,
            "accuracy": 0.70,
            "accuracy_se": 0.02,
        },
    ]
    text = _sample_dp_reading(snr, acc, [])
    assert "ε=2: need 5,000 > 1,000, accuracy 0.510 (chance)" in text
    assert "ε=8: need 800 ≤ 1,000, accuracy 0.700" in text and "0.700 (chance)" not in text
