"""p2-accuracy's sparsity check: the replicated sparse-vs-dense table and its verdicts,
the equal tuning protocol, the Peeling signal-to-noise diagnostic, and the d-aware default T of Sample-DP
IHT."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privalign.estimation.iht import NOISE_SCALE_TARGET, _peeling, default_n_iter, peeling_snr
from privalign.experiments.paper2 import replicated_comparisons, sparse_dense_table


def _rec(ds, fm, method, eps, correct, rep=0, variant="tuned"):
    return {
        "kind": "accuracy",
        "dataset": ds,
        "features": fm,
        "method": method,
        "epsilon": eps,
        "variant": variant,
        "rep": rep,
        "accuracy": correct.count("1") / len(correct),
        "correct": correct,
    }


def test_sparse_dense_table_replicated_verdicts():
    n = 200
    strong = ["1" * (150 - r) + "0" * (50 + r) for r in range(5)]  # sparse right on 150, 149, … (seeds)
    weak = ["0" * 60 + "1" * (90 - r) + "0" * (50 + r) for r in range(5)]  # dense right on 90, 89, …
    recs = []
    for r in range(5):
        recs += [
            _rec("hh-rlhf", "harm-lexicon", "RRIHT", 8.0, strong[r], r),
            _rec("hh-rlhf", "harm-lexicon", "DenseRR", 8.0, weak[r], r),
            _rec("hh-rlhf", "harm-lexicon", "SampleDPIHT", 8.0, weak[r], r),
            _rec("hh-rlhf", "harm-lexicon", "DPSGDLinear", 8.0, strong[r], r),
            _rec("hh-rlhf", "hashed-ngram", "RRIHT", 8.0, strong[0], r),
            _rec("hh-rlhf", "hashed-ngram", "DenseRR", 8.0, strong[0], r),
            _rec("hh-rlhf", "hashed-ngram", "RRIHT", 8.0, strong[0], r, "untuned"),
        ]
    comps = replicated_comparisons(recs)
    assert {c["dataset"] for c in comps} == {"hh-rlhf", "hh-rlhf[harm-lexicon]"} and len(comps) == 3
    assert all(c["R"] == 5 for c in comps)
    assert replicated_comparisons(recs, variant="untuned") == []  # DenseRR has no untuned cells
    rows = {(r["dataset"], r["sparse"]): r for r in sparse_dense_table(recs)}
    r = rows[("hh-rlhf[harm-lexicon]", "RRIHT")]
    assert r["diff"] == pytest.approx(60 / n) and r["verdict"] == "sparse better" and r["diff_ci95"][0] > 0
    assert r["seeds"] == 5 and r["alpha_per_test"] == pytest.approx(0.05 / 3)
    assert r["se"] == pytest.approx(math.hypot(r["se_seeds"], r["se_test_pairs"]), abs=2e-4)
    assert rows[("hh-rlhf[harm-lexicon]", "SampleDPIHT")]["verdict"] == "dense better"
    # identical predictions on 200 pairs: SE 0, difference 0 → equivalent within the margin
    assert rows[("hh-rlhf", "RRIHT")]["verdict"] == "equivalent within ±0.03"
    # one fit seed: the table says the comparison is unreplicated instead of testing it
    one = [x for x in recs if x["rep"] == 0]
    assert all(row["verdict"].startswith("unreplicated") for row in sparse_dense_table(one))


def test_experiment_grids_give_every_method_the_same_protocol():
    """Issue 27: DP-SGD searched 4 candidates at ε/4 while Sample-DP IHT searched 2 at ε/2. Every method now
    searches EXPERIMENT_CANDIDATES candidates, so a compared pair splits its budget alike."""
    from privalign.estimation.registry import names
    from privalign.estimation.tuning import (
        EXPERIMENT_CANDIDATES,
        expand_grid,
        experiment_param_grid,
        make_experiment_estimator,
    )
    from privalign.experiments.paper2 import _fit

    for s in (4, 32, 64):
        sizes = {m: len(expand_grid(experiment_param_grid(m, sparsity=s))) for m in names()}
        assert set(sizes.values()) == {EXPERIMENT_CANDIDATES}, sizes
    # the candidates actually run at (ε/2, δ/2) for both sample-DP methods of P2-4
    from privalign.estimation.preferences import PreferenceData

    rng = np.random.default_rng(0)
    X = rng.integers(0, 2, size=(400, 64)).astype(float) - rng.integers(0, 2, size=(400, 64))
    y = (X[:, 0] + 0.3 * rng.standard_normal(400) > 0).astype(int)
    data = PreferenceData(X=X, y=y, prompt_ids=np.arange(400))
    cfg = {
        "step_size": 4.0,
        "radius": 5.0,
        "alpha": 1e-3,
        "tune": True,
        "dpsgd_epochs": 1.0,
        "dpsgd_batch": 64,
        "dpsgd_clip": 1.0,
        "dpsgd_lr": 1.0,
    }
    for name in ("SampleDPIHT", "DPSGDLinear"):
        est = make_experiment_estimator(
            name,
            epsilon=4.0,
            delta=1e-5,
            sparsity=16,
            feature_bound=1.0,
            random_state=np.random.default_rng(1),
            cfg=cfg,
            n_train=400,
        )
        _fit(est, data)
        eps = [c.epsilon for c in (est.best_estimator_,)]
        assert eps == [pytest.approx(2.0)] and len(est.candidates_) == 2
        assert est.privacy_budget_["epsilon"] == pytest.approx(4.0)
        assert est.privacy_budget_["delta"] == pytest.approx(1e-5)


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
