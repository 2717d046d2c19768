"""``p2-rlhf-bon``: the exact best-of-n expectation (against brute force over subsets, ties included),
the three-valued sparse-vs-dense verdict on constructed records, and P2-6 in the report (best-of-n decides,
GRPO is reported beside it)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from privalign.experiments.report import evaluate_claims
from privalign.experiments.rlhf_bon import (
    bon_expected_gold,
    bon_kl_ties,
    bon_selection_weights,
    bon_verdict,
)


def _brute(s: np.ndarray, g: np.ndarray, n: int) -> np.ndarray:
    out = []
    for p in range(s.shape[0]):
        vals = []
        for sub in itertools.combinations(range(s.shape[1]), n):
            sub = list(sub)
            top = [i for i in sub if s[p, i] == s[p, sub].max()]
            vals.append(g[p, top].mean())
        out.append(np.mean(vals))
    return np.array(out)


@pytest.mark.parametrize("levels", [2, 3, 1000])  # many ties, some ties, (almost surely) none
def test_bon_expected_gold_equals_brute_force_over_subsets(levels):
    rng = np.random.default_rng(levels)
    s = rng.integers(0, levels, size=(6, 7)).astype(float)
    g = rng.random((6, 7))
    for n in range(1, 8):
        np.testing.assert_allclose(bon_expected_gold(s, g, n), _brute(s, g, n), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bon_expected_gold(s, g, 1), g.mean(axis=1))


def test_selection_probabilities_sum_to_one():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 4, size=(20, 16)).astype(float)
    m = 16
    diff = s[:, None, :] - s[:, :, None]
    below, ties = (diff < 0).sum(2), (diff == 0).sum(2)
    for n in (1, 2, 5, 16):
        p = bon_selection_weights(m, n)[below, ties]
        np.testing.assert_allclose(p.sum(axis=1), 1.0)


def test_tie_aware_kl():
    distinct = np.arange(16.0)[None]
    for n in (2, 4, 16):  # no ties: the discrete analogue of log n − (n − 1)/n, a little below it
        v = bon_kl_ties(distinct, n)[0]
        assert 0.95 * (math.log(n) - (n - 1) / n) < v < math.log(n) - (n - 1) / n
    assert bon_kl_ties(np.zeros((1, 16)), 16)[0] == 0.0  # one level: best-of-n is the reference
    two = np.array([[0.0] * 8 + [1.0] * 8])  # two equal levels: q = (1/2^n, 1 − 1/2^n) against (1/2, 1/2)
    q = np.array([0.5**4, 1 - 0.5**4])
    assert bon_kl_ties(two, 4)[0] == pytest.approx(float((q * np.log(q / 0.5)).sum()))
    assert bon_kl_ties(two, 4)[0] < bon_kl_ties(distinct, 4)[0]


def test_bon_expected_gold_rejects_bad_shapes():
    with pytest.raises(ValueError):
        bon_expected_gold(np.zeros((2, 3)), np.zeros((2, 4)), 1)
    with pytest.raises(ValueError):
        bon_expected_gold(np.zeros((2, 3)), np.zeros((2, 3)), 4)


def _records(shift_rr: float, shift_dp: float, *, P: int = 300, R: int = 3, sd: float = 0.05) -> list[dict]:
    """Best-of-n records at ε = 8: per prompt, each sparse method's gold = the dense one's + ``shift`` +
    ``sd`` × z with z of mean 0 and standard deviation 1 exactly (the same for every fit seed), so the
    bootstrap SE of the difference is ≈ sd/√P."""
    rng = np.random.default_rng(11)
    base = rng.uniform(0.3, 0.8, P)
    z = rng.standard_normal(P)
    z = (z - z.mean()) / z.std(ddof=1)
    recs = []
    for method, shift in (
        ("RRIHT", shift_rr),
        ("DenseRR", 0.0),
        ("SampleDPIHT", shift_dp),
        ("DPSGDLinear", 0.0),
    ):
        for r in range(R):
            g16 = base + (shift + sd * z if method in ("RRIHT", "SampleDPIHT") else 0.0)
            recs.append(
                {
                    "kind": "bon",
                    "dataset": "imdb",
                    "method": method,
                    "epsilon": 8.0,
                    "rep": r,
                    "ns": [1, 16],
                    "kl": [0.0, math.log(16) - 15 / 16],
                    "per_prompt_gold": {"1": list(base), "16": list(g16)},
                    "distinct_selector_values": 10.0,
                    "root_seed": 0,
                    "n_bootstrap": 4000,
                }
            )
    return recs


def test_bon_verdict_three_values_and_power():
    v, m = bon_verdict(_records(0.03, 0.03))
    assert v == "holds" and "KL 1.835" in m and "300 prompts, 3 fit seeds" in m
    assert m.startswith("powered") or m.startswith("UNDERPOWERED")
    assert bon_verdict(_records(0.03, -0.03))[0] == "does not hold"
    assert bon_verdict(_records(0.03, 0.0))[0] == "inconclusive"
    # a reversal inside the 95% interval but not the Bonferroni (97.5%) one is not "does not hold"
    v, m = bon_verdict(_records(0.03, -2.1 * 0.05 / math.sqrt(300), sd=0.05))
    assert v == "inconclusive", m
    assert bon_verdict([])[0] == "inconclusive"


def test_a_selector_with_ties_is_compared_at_its_own_lower_kl():
    """Equal n is not equal KL when the sparse selector ties: the dense curve is read at the sparse one's
    largest KL (interpolated between its n), where its gold is lower."""
    recs = _records(0.0, 0.0, sd=0.0)
    for r in recs:
        r["ns"], r["kl"] = [1, 2, 16], [0.0, 0.193, 1.835]
        g1 = np.array(r["per_prompt_gold"]["1"])
        r["per_prompt_gold"] = {"1": list(g1), "2": list(g1 + 0.05), "16": list(g1 + 0.10)}
        r["kl_ties"] = [0.0, 0.19, 1.79]
        if r["method"] in ("RRIHT", "SampleDPIHT"):  # ties: its best-of-16 is only 0.19 nats away
            r["kl_ties"] = [0.0, 0.1, 0.19]
    v, m = bon_verdict(recs)
    # at KL 0.19 the dense curve gives g1 + 0.05 exactly; the sparse best-of-16 gives g1 + 0.10
    assert v == "holds" and "KL 0.190: +0.0500" in m, m
    v, m = bon_verdict(recs, n=16)  # at equal n the two are equal
    assert v == "inconclusive" and "+0.0000" in m


def test_underpowered_is_said():
    v, m = bon_verdict(_records(0.0, 0.0, P=20, sd=0.2))
    assert v == "inconclusive" and m.startswith("UNDERPOWERED")


def test_p2_6_claim_reads_best_of_n_first_and_grpo_beside_it():
    bon = _records(0.03, 0.03)
    grpo = [
        {
            "kind": "policy",
            "method": m,
            "epsilon": 8.0,
            "per_prompt_gold": [0.5, 0.6, 0.55, 0.52],
            "kl": 0.5,
            "kl_se": 0.1,
            "n_prompts": 4,
            "steps": 50,
            "root_seed": 0,
            "n_bootstrap": 200,
        }
        for m in ("RRIHT", "DenseRR")
    ]
    row = {c["id"]: c for c in evaluate_claims({"p2-rlhf-bon": bon, "p2-rlhf": grpo})}["P2-6"]
    assert row["verdict"] == "holds"
    assert (
        "best-of-n at exact KL" in row["measured"]
        and "GRPO (p2-rlhf; reported, not combined)" in row["measured"]
    )
    row = {c["id"]: c for c in evaluate_claims({"p2-rlhf": grpo})}["P2-6"]
    assert row["verdict"] == "inconclusive" and row["measured"].startswith("GRPO only")
