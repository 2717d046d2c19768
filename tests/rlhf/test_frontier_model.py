"""``beyond-frontier`` end to end with the real SmolLM2 and MiniLM on a tiny configuration (``model``,
``slow``): every route family, the records' guarantees, and a rerun that reuses every record. The fast tests
(tiny random Llama, fake gold) are in test_frontier.py."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

TINY = {
    "routes": ["dpo:sample@8", "bon:TRM-sample@8", "privbon:MLE@8", "grpo:RRIHT@8"],
    "eval_prompts": 2,
    "grpo_prompts": 1,
    "n_pairs": 16,
    "delta": 1e-3,
    "max_new_tokens": 4,
    "reference_samples": 4,
    "eval_samples": 1,
    "bon_ns": [1, 2, 4],
    "dpo_batch": 8,
    "dpo_eval_every": 1,
    "trm_batch": 8,
    "grpo_steps": 1,
    "grpo_eval_every": 1,
    "grpo_lora_rank": 2,
    "bon_seeds": 1,
    "n_bootstrap": 100,
}


def test_frontier_tiny_end_to_end_with_the_real_models(tmp_path):
    from privalign.experiments.runner import read_results, run_experiment

    out = tmp_path / "run"
    summary = run_experiment("beyond-frontier", out=out, quick=True, overrides=TINY, progress=False)
    assert summary["verdict"] in ("holds", "does not hold", "inconclusive")
    recs = read_results(out)
    assert recs[0]["kind"] == "data" and recs[0]["disjoint"]["checked"]
    curves = {r["route"]: r for r in recs if r["kind"] == "frontier"}
    assert set(curves) == set(TINY["routes"])
    assert curves["dpo:sample@8"]["guarantee"]["unit"].startswith("(ε, δ)-DP")
    assert curves["dpo:sample@8"]["guarantee"]["epsilon_accounted"] <= 8.0 + 1e-9
    assert curves["privbon:MLE@8"]["guarantee"]["per_answer"]
    assert [p["x"] for p in curves["grpo:RRIHT@8"]["points"]] == [0, 1]
    assert curves["bon:TRM-sample@8"]["guarantee"]["overlap_check"]["checked"]
    man = json.loads((out / "manifest.json").read_text())
    assert man["figures"] == ["frontier_gold_vs_kl"]
    # nothing is retrained in a fresh directory given the records (prior_results)
    out2 = tmp_path / "run2"
    run_experiment(
        "beyond-frontier",
        out=out2,
        quick=True,
        overrides={**TINY, "prior_results": str(out / "records")},
        progress=False,
    )
    assert not (out2 / "policies").exists()
    assert not (out2 / "reward_models").exists()  # GRPO's reward model: its privacy event is a record
    again = read_results(out2)
    assert [r.get("points") for r in again] == [r.get("points") for r in recs]
    assert [r.get("guarantee") for r in again] == [r.get("guarantee") for r in recs]
    assert curves["grpo:RRIHT@8"]["guarantee"]["privacy_event"] is not None
