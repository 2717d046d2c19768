"""``p2-rlhf`` end to end on a tiny configuration (loads SmolLM2 and trains: ``model``, ``slow``). The same
tiny overrides are listed in tests/experiments/test_experiments_e2e.py::TINY (which skips model
experiments)."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

TINY = {
    "policies": ["RRIHT@8", "DenseRR@8"],
    "steps": 2,
    "eval_every": 1,
    "train_prompts": 1,
    "eval_prompts": 2,
    "eval_samples": 1,
    "reference_samples": 2,
    "bon_ns": [1, 2],
    "max_new_tokens": 4,
    "lora_rank": 2,
    "n_bootstrap": 100,
}


def _finite(obj):
    if isinstance(obj, float):
        assert math.isfinite(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _finite(v)
    elif isinstance(obj, list):
        for v in obj:
            _finite(v)


def test_p2_rlhf_tiny_end_to_end(tmp_path):
    from privalign.experiments.runner import read_results, run_experiment

    out = tmp_path / "run"
    summary = run_experiment("p2-rlhf", out=out, quick=True, overrides=TINY, progress=False)
    assert summary["verdict"] in ("holds", "does not hold", "inconclusive")
    assert "RRIHT vs DenseRR at ε = 8" in summary["measured"] and "underpowered" in summary["measured"]
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "complete" and man["figures"] == ["rlhf_gold_vs_kl"]
    assert (out / "figures" / "rlhf_gold_vs_kl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recs = read_results(out)
    _finite(recs)
    assert [r["cell"] for r in recs] == ["reference", "RRIHT@8", "DenseRR@8"]
    for r in recs[1:]:
        assert r["privacy_event"]["epsilon"] == 8.0 and r["privacy_event"]["unit"] == "label"
        assert r["overlap_check"]["checked"] and r["overlap_check"]["overlapping_prompts"] == 0
        assert 0.0 <= r["win_rate"] <= 1.0 and r["win_ci"][0] <= r["win_rate"] <= r["win_ci"][1]
        assert [b["n"] for b in r["bon"]] == [1, 2] and r["bon"][0]["gold"] == pytest.approx(
            recs[0]["gold_mean"]
        )
        assert (out / "reward_models" / (r["policy"].replace("@", "_eps") + ".json")).is_file()
        assert not list(
            (out / "policies" / r["policy"].replace("@", "_eps") / "checkpoints").glob("checkpoint-*")
        )
        # evaluated at every checkpoint: one record per step, and the curve in the results
        assert [c["step"] for c in r["curve"]] == [1, 2] and r["steps"] == 2
        for step in (1, 2):
            rec = json.loads(
                (out / "evals" / r["policy"].replace("@", "_eps") / f"step-{step:06d}.json").read_text()
            )
            assert rec["step"] == step and rec["identity"] and len(rec["per_prompt_gold"]) == 2
    assert (out / "evals" / "reference.json").is_file()
    # rerunning the same configuration on the same directory does nothing new (every cell is recorded)
    run_experiment("p2-rlhf", out=out, quick=True, overrides=TINY, progress=False)
    assert len(read_results(out)) == 3
    # a new session with only the committed records (no checkpoints, no results) reuses them: no training
    out2 = tmp_path / "run2"
    summary2 = run_experiment(
        "p2-rlhf", out=out2, quick=True, overrides={**TINY, "prior_evals": str(out / "evals")}, progress=False
    )
    assert not (out2 / "policies").exists()
    recs2 = read_results(out2)
    assert [r["curve"] for r in recs2[1:]] == [r["curve"] for r in recs[1:]]
    assert summary2["verdict"] == summary["verdict"]
