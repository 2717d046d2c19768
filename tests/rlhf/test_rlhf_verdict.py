"""Evaluation statistics and the p2-rlhf verdict on constructed results (no model)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privalign.experiments.base import ExperimentError
from privalign.experiments.rlhf import parse_policy, rlhf_verdict
from privalign.rlhf.evaluate import (
    best_of_n_gold,
    bon_kl,
    kl_estimate,
    paired_bootstrap_ci,
    sparse_vs_dense_verdict,
    win_probability,
)


def test_bon_kl_closed_form():
    assert bon_kl(1) == 0.0
    assert bon_kl(2) == pytest.approx(math.log(2) - 0.5)
    assert bon_kl(16) == pytest.approx(math.log(16) - 15 / 16)


def test_win_probability_exact():
    a = np.array([[1.0, 0.0], [0.5, 0.5]])
    b = np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    np.testing.assert_allclose(win_probability(a, b), [0.5, 0.5])  # (1 + 0)/2 ; all ties
    np.testing.assert_allclose(win_probability(np.ones((1, 2)), np.zeros((1, 3))), [1.0])


def test_kl_estimate_mean_and_se():
    lp = np.array([[1.0, 2.0], [3.0, 4.0]])
    m, se = kl_estimate(lp, np.zeros_like(lp))
    assert m == 2.5 and se == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)


def test_best_of_n_picks_by_selector_in_disjoint_blocks():
    sel = np.array([[0.0, 1.0, 0.5, 2.0], [3.0, 0.0, 0.0, 0.0]])
    gold = np.array([[0.1, 0.9, 0.3, 0.2], [0.7, 0.1, 0.1, 0.1]])
    out = best_of_n_gold(sel, gold, [1, 2, 4])
    assert [o["n"] for o in out] == [1, 2, 4] and [o["blocks"] for o in out] == [4, 2, 1]
    assert out[0]["gold"] == pytest.approx(gold.mean()) and out[0]["win_rate"] == pytest.approx(0.5)
    # N = 2: blocks (0.1, 0.9) -> 0.9, (0.3, 0.2) -> 0.2; (0.7, 0.1) -> 0.7, ties (0.1, 0.1) -> 0.1
    assert out[1]["gold"] == pytest.approx(((0.9 + 0.2) / 2 + (0.7 + 0.1) / 2) / 2)
    assert out[2]["gold"] == pytest.approx((0.2 + 0.7) / 2)
    assert out[2]["kl"] == pytest.approx(bon_kl(4))
    with pytest.raises(Exception, match="ns"):
        best_of_n_gold(sel, gold, [8])


def test_bootstrap_ci_covers_mean(rng):
    x = rng.normal(0.3, 1.0, size=400)
    lo, hi, se = paired_bootstrap_ci(x, n_boot=2000, rng=rng)
    assert lo < x.mean() < hi and se > 0
    assert hi - lo == pytest.approx(2 * 1.96 * x.std() / 20, rel=0.2)


def _rec(method, eps, gold, kl, kl_se=0.01):
    return {
        "kind": "policy",
        "method": method,
        "epsilon": eps,
        "per_prompt_gold": list(gold),
        "kl": kl,
        "kl_se": kl_se,
        "n_prompts": len(gold),
        "steps": 10,
        "root_seed": 0,
        "n_bootstrap": 1000,
    }


@pytest.fixture
def base(rng):
    return rng.uniform(0.2, 0.8, size=200)


def test_sparse_vs_dense_three_values(base, rng):
    up = _rec("RRIHT", 8.0, base + 0.1, kl=1.0)
    down = _rec("DenseRR", 8.0, base, kl=1.0)
    assert sparse_vs_dense_verdict(up, down, n_boot=1000, rng=rng)[0] == "holds"
    assert sparse_vs_dense_verdict(down, up, n_boot=1000, rng=rng)[0] == "does not hold"
    # higher reward but bought with much more KL: not "at the same KL"
    far = _rec("RRIHT", 8.0, base + 0.1, kl=3.0)
    assert sparse_vs_dense_verdict(far, down, n_boot=1000, rng=rng)[0] == "inconclusive"
    # no difference beyond noise
    noisy = _rec("RRIHT", 8.0, base + rng.normal(0, 0.2, size=base.size), kl=1.0)
    v, msg = sparse_vs_dense_verdict(noisy, down, n_boot=1000, rng=rng)
    assert v in ("inconclusive", "holds", "does not hold")  # the value depends on the draw ...
    lo, hi = (float(s) for s in msg.split("[95% CI ")[1].split("]")[0].split(", "))
    assert v == (
        "holds" if lo > 0 else "does not hold" if hi < 0 else "inconclusive"
    )  # ... but follows the rule
    assert "80% power" in msg


def test_rlhf_verdict_combines_pairs(base):
    recs = [
        _rec("RRIHT", 8.0, base + 0.1, 1.0),
        _rec("DenseRR", 8.0, base, 1.0),
        _rec("RRIHT", 2.0, base + 0.1, 1.0),
        _rec("DenseRR", 2.0, base, 1.0),
        _rec("IHT", None, base, 1.0),
    ]
    assert rlhf_verdict(recs)[0] == "holds"
    recs[3] = _rec("DenseRR", 2.0, base + 0.2, 1.0)
    v, m = rlhf_verdict(recs)
    assert v == "does not hold" and "ε = 2" in m
    recs[3] = _rec("DenseRR", 2.0, base + 0.1, 1.0)  # identical: interval straddles 0
    assert rlhf_verdict(recs)[0] == "inconclusive"
    assert rlhf_verdict([_rec("RRIHT", 8.0, base, 1.0)])[0] == "inconclusive"  # no dense partner
    assert rlhf_verdict([])[0] == "inconclusive"


def test_parse_policy():
    assert parse_policy("RRIHT@8") == ("RRIHT", 8.0)
    assert parse_policy("IHT") == ("IHT", None)
    for bad in ("RRIHT", "Foo@2", "RRIHT@0", "RRIHT@x", "DenseRR@inf"):
        with pytest.raises(ExperimentError, match="policies"):
            parse_policy(bad)


def test_packaged_configs_load_and_preflight_refuses_overlap(tmp_path):
    from privalign.experiments.registry import get_experiment
    from privalign.experiments.runner import prepare, resolve_config

    exp = get_experiment("p2-rlhf")
    q = resolve_config(exp, None, True)
    full = resolve_config(exp, None, False)
    assert q["train_prompts"] + q["eval_prompts"] <= q["reserve"] and q["beta"] > 0
    assert set(full["policies"]) > set(q["policies"])
    with pytest.raises(ExperimentError, match="reserve"):
        prepare(
            "p2-rlhf", out=tmp_path / "r", quick=True, overrides={"train_prompts": 150, "eval_prompts": 100}
        )
    with pytest.raises(ExperimentError, match="bon_ns"):
        prepare("p2-rlhf", out=tmp_path / "r", quick=True, overrides={"bon_ns": [1, 64]})
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------------------------------------
# the equal-KL comparison (rlhf_equal_kl_verdict) on constructed paths
# ---------------------------------------------------------------------------------------------------------


def _path_rec(method, eps, points, *, budgets=(0.5, 1.0, 2.0)):
    """A policy record whose curve is ``points`` = [(kl, per-prompt gold), ...] at steps 50, 100, ..."""
    curve = [{"step": 50 * (j + 1), "kl": kl, "per_prompt_gold": list(g)} for j, (kl, g) in enumerate(points)]
    return {
        **_rec(method, eps, points[-1][1], points[-1][0]),
        "curve": curve,
        "steps": curve[-1]["step"],
        "kl_budgets": list(budgets),
        "equivalence_margin": 0.02,
    }


def _ref(gold):
    return {"kind": "reference", "per_prompt_gold": list(gold), "kl": 0.0}


def test_equal_kl_verdict_three_values(base, rng):
    from privalign.experiments.rlhf import rlhf_equal_kl_verdict

    ref = _ref(base)
    sparse = _path_rec("RRIHT", 8.0, [(0.5, base + 0.05), (1.0, base + 0.10), (2.0, base + 0.15)])
    dense = _path_rec("DenseRR", 8.0, [(0.5, base + 0.01), (1.0, base + 0.02), (2.0, base + 0.03)])
    res = rlhf_equal_kl_verdict([ref, sparse, dense])
    assert res[0] == "holds" and len(res.facts["comparisons"]) == 3
    assert "KL ≤ 1" in res[1] and "80% power" in res[1]
    # the dense policy ahead at every budget: does not hold
    res = rlhf_equal_kl_verdict([ref, dense | {"method": "RRIHT"}, sparse | {"method": "DenseRR"}])
    assert res[0] == "does not hold"
    # identical paths: the Bonferroni interval is [0, 0], inside the ± 0.02 margin: a tie shown
    assert rlhf_equal_kl_verdict([ref, sparse, sparse | {"method": "DenseRR"}])[0] == "does not hold"
    # a small difference drowned in per-prompt noise: neither shown
    noise = rng.normal(0, 0.3, size=base.size)
    wobble = _path_rec("DenseRR", 8.0, [(0.5, base + 0.05 + noise), (1.0, base + 0.1 + noise)])
    res = rlhf_equal_kl_verdict([ref, sparse, wobble], budgets=[1.0])
    assert res[0] == "inconclusive"
    c = res.facts["comparisons"][0]
    lo_k, hi_k = c["ci_bonferroni"]
    assert c["ci"][0] < 0 < c["ci"][1] and not (-0.02 < lo_k and hi_k < 0.02)
    # nothing to compare
    assert rlhf_equal_kl_verdict([sparse, dense])[0] == "inconclusive"  # no reference
    assert rlhf_equal_kl_verdict([ref, sparse])[0] == "inconclusive"  # no dense partner


def test_equal_kl_compares_at_the_budget_not_at_the_end(base):
    """The sparse policy ends higher only because it went further: at KL ≤ 1 the dense one is ahead."""
    from privalign.experiments.rlhf import rlhf_equal_kl_verdict

    ref = _ref(base)
    sparse = _path_rec("RRIHT", 8.0, [(0.5, base + 0.0), (1.0, base + 0.01), (3.0, base + 0.3)])
    dense = _path_rec("DenseRR", 8.0, [(0.5, base + 0.1), (1.0, base + 0.15)])
    res = rlhf_equal_kl_verdict([ref, sparse, dense], budgets=[1.0])
    c = res.facts["comparisons"][0]
    assert c["diff"] == pytest.approx(0.01 - 0.15) and res[0] == "does not hold"
    # at KL ≤ 2 the sparse path's segment 1 → 3 nats counts as the mixture spending exactly 2 nats
    res = rlhf_equal_kl_verdict([ref, sparse, dense], budgets=[2.0])
    c = res.facts["comparisons"][0]
    assert c["sparse_at"]["mix"] == pytest.approx(0.5) and c["sparse_at"]["kl"] == 2.0
    assert c["sparse_gold"] == pytest.approx(float(np.mean(base)) + (0.01 + 0.3) / 2)
    # a budget neither path reaches repeats a smaller one and is not compared
    res = rlhf_equal_kl_verdict([ref, sparse, dense], budgets=[1.0, 5.0])
    assert [c["budget"] for c in res.facts["comparisons"]] == [1.0]
