"""End to end through the CLI: every experiment on a tiny configuration, then the report.

Each tiny config is the packaged quick config with a few keys overridden (smaller pools, grids and
replicate counts), written to a TOML file the way a user would. Outputs are checked: files exist, every
number in results.jsonl/summary.json is finite, the manifest is complete, figures exist as PNG and PDF,
and the report renders with the claims table and embedded figures.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path

import pytest

from privalign.cli import main
from privalign.experiments.config import packaged_config_path
from privalign.experiments.manifest import REQUIRED_KEYS
from privalign.experiments.registry import EXPERIMENTS

TINY: dict[str, dict] = {
    "p1-scaling": {"pool": "synthetic", "n_prompts": 8, "pool_size": 64, "n_max_log2": 4, "replicates": 4},
    "p1-scaling-imdb": {"n_prompts": 8, "n_max_log2": 3, "replicates": 3},
    "p1-privacy-sweep": {
        "n_prompts": 6,
        "n_calib_prompts": 4,
        "pool_size": 32,
        "replicates": 3,
        "n_grid": [4, 16],
        "epsilons": [2.0, 20.0],
        "tune_ratios": [1.0],
        "tune_Ls": [4.0],
        "calib_replicates": 2,
    },
    "p1-privacy-sweep-imdb": {
        "n_prompts": 6,
        "n_calib_prompts": 4,
        "replicates": 3,
        "n_grid": [4, 8],
        "epsilons": [2.0, 20.0],
        "tune_ratios": [1.0],
        "tune_Ls": [4.0],
        "calib_replicates": 2,
    },
    "p1-sigma-sweep": {"n_prompts": 8, "pool_size": 32, "n_max_log2": 3, "replicates": 4, "mc_draws": 5},
    "p1-beta-sweep": {"n_prompts": 8, "pool_size": 32, "n_max_log2": 3, "replicates": 4},
    "p1-itp-vs-privitp": {
        "n_prompts": 8,
        "pool_size": 32,
        "n_max_log2": 3,
        "replicates": 4,
        "privitp_sigmas": [0.2],
    },
    "p1-epsilon-star": {"n_prompts": 10, "pool_size": 64, "N": 16, "replicates": 4, "epsilons": [1.0, 64.0]},
    "p1-budget": {"n_prompts": 60, "n_seeds": 1, "sigmas": [8.0], "budget_epsilon": 20.0},
    "p2-rates": {
        "base_n": 300,
        "base_d": 40,
        "base_s": 3,
        "n_grid": [200, 400],
        "d_grid": [20, 40],
        "s_grid": [2, 3],
        "eps_grid": [2.0, 8.0],
        "replicates": 1,
        "dpsgd_epochs": 1.0,
        "methods": ["IHT", "SampleDPIHT", "RRIHT", "DenseRR", "DPSGDLinear"],
    },
    "p2-accuracy": {
        "datasets": ["hh-rlhf", "imdb"],
        "n_pairs": 120,
        "epsilons": [8.0],
        "n_features": 512,
        "sparsity": 8,
        "dpsgd_epochs": 1.0,
        "feature_maps": ["hashed-ngram", "harm-lexicon"],
        "n_profane": 16,
        "sparsity_check": True,
        "sparsity_grid": [1, 4, 16],
        "n_curve_check": True,
        "n_curve": [40, 80],
        "n_curve_pairs": 200,
        "replicates": 2,
    },
    "p2-winrate": {
        "epsilons": [8.0],
        "replicates": 1,
        "n_features": 512,
        "sparsity": 8,
        "hh_n_pairs": 120,
        "dpsgd_epochs": 1.0,
        "n_bootstrap": 100,
        "max_prompts": 6,
    },
    "beyond-train-vs-inference": {"n": 300, "d": 40, "s_star": 3, "T_grid": [1, 100], "eval_queries": 20},
    "beyond-membership": {
        "n_train": 100,
        "n_features": 512,
        "samples": 500,
        "epsilons": [2.0],
        "queries": [1, 10],
    },
    "beyond-user-level": {
        "seeds": 2,
        "contributions": [1, 40, 10, 6, 30, 2],
        "n_test": 200,
        "n_features": 256,
        "methods": ["rr-iht"],
        "ks": [1, 10],
        "attack_others": 100,
        "attack_heavy": 30,
        "attack_k": 5,
        "attack_calibration": 4,
        "attack_fits": 12,
    },
    "beyond-planted-sweep": {"bonuses": [1.0, 10.0], "n_prompts": 6},
    "p2-rlhf-bon": {
        "epsilons": [8.0],
        "replicates": 2,
        "n_features": 512,
        "sparsity": 8,
        "hh_n_pairs": 120,
        "dpsgd_epochs": 1.0,
        "n_bootstrap": 100,
        "max_prompts": 6,
        "ns": [1, 2, 16],
    },
    "beyond-frontier": {
        "routes": ["dpo:label@8", "bon:RRIHT@8", "privbon:MLE@8"],
        "eval_prompts": 2,
        "grpo_prompts": 1,
        "n_pairs": 8,
        "max_new_tokens": 4,
        "reference_samples": 2,
        "eval_samples": 1,
        "bon_ns": [1, 2],
        "dpo_batch": 4,
        "trm_batch": 4,
        "dpo_eval_every": 2,
        "n_bootstrap": 100,
    },
    "p2-rlhf": {
        "policies": ["RRIHT@8", "DenseRR@8"],
        "steps": 1,
        "train_prompts": 1,
        "eval_prompts": 2,
        "eval_samples": 1,
        "reference_samples": 2,
        "bon_ns": [1, 2],
        "max_new_tokens": 4,
        "lora_rank": 2,
        "n_bootstrap": 100,
    },
}
#: experiments that load and train a language model: run end to end in tests/rlhf (marked model, slow), not
#: here.
MODEL_EXPERIMENTS = ("p2-rlhf", "beyond-frontier")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def write_tiny_config(name: str, path: Path, **extra) -> Path:
    exp = EXPERIMENTS[name]
    with packaged_config_path(exp.config_name + "_quick").open("rb") as fh:
        cfg = tomllib.load(fh)
    cfg.update(TINY[name])
    cfg.update(extra)
    path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in cfg.items()), encoding="utf-8")
    return path


def _all_finite(obj, where="") -> None:
    if isinstance(obj, float):
        assert math.isfinite(obj), f"non-finite number at {where}"
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _all_finite(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _all_finite(v, f"{where}[{i}]")


def test_tiny_configs_cover_every_registered_experiment():
    assert set(TINY) == set(EXPERIMENTS), "every experiment needs a tiny end-to-end config"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    """Run every experiment once (module scope: the report tests reuse the run directories)."""
    base = tmp_path_factory.mktemp("runs")
    out = {}
    for name in EXPERIMENTS:
        if name in MODEL_EXPERIMENTS:
            continue
        cfg = write_tiny_config(name, base / f"{name}.toml")
        rc = main(["reproduce", name, "--config", str(cfg), "--out", str(base / name), "--no-progress"])
        assert rc == 0, f"{name} exited with {rc}"
        out[name] = base / name
    return out


@pytest.mark.parametrize("name", sorted(set(TINY) - set(MODEL_EXPERIMENTS)))
def test_experiment_outputs(runs, name):
    d = runs[name]
    man = json.loads((d / "manifest.json").read_text())
    for key in REQUIRED_KEYS:
        assert key in man, f"manifest lacks {key}"
    assert man["status"] == "complete"
    assert man["experiment"] == name
    assert re.fullmatch(r"[0-9a-f]{64}", man["config_hash"])
    assert man["ended_at"] and man["started_at"] <= man["ended_at"]
    assert man["seed_entropy"] == man["config"]["seed"]
    assert "numpy" in man["packages"] and man["machine"]["cpu_count"]
    lines = (d / "results.jsonl").read_text().splitlines()
    assert lines, "no results"
    for line in lines:
        _all_finite(json.loads(line))
    summary = json.loads((d / "summary.json").read_text())
    _all_finite(summary)
    assert summary["experiment"] == name
    assert man["figures"], "no figures"
    for stem in man["figures"]:
        png, pdf = d / "figures" / f"{stem}.png", d / "figures" / f"{stem}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert pdf.read_bytes()[:4] == b"%PDF"


def test_p2_accuracy_replicates_every_cell_with_its_own_noise(runs):
    """Issue 27: every accuracy cell is fitted with `replicates` seeds, tuned and untuned; the seeds differ
    (the DP noise is redrawn), the tuned searches all have the same number of candidates."""
    recs = [json.loads(x) for x in (runs["p2-accuracy"] / "results.jsonl").read_text().splitlines()]
    acc = [r for r in recs if r.get("kind") == "accuracy"]
    keys = {(r["dataset"], r["features"], r["method"], r["epsilon"], r["variant"]) for r in acc}
    for k in keys:
        assert sorted(
            r["rep"]
            for r in acc
            if (r["dataset"], r["features"], r["method"], r["epsilon"], r["variant"]) == k
        ) == [0, 1], k
    assert {r["variant"] for r in acc} == {"tuned", "untuned"}
    assert {r["candidates"] for r in acc if r["variant"] == "tuned"} == {2}
    dp = [r for r in acc if r["method"] == "DPSGDLinear" and r["variant"] == "untuned"]
    by = {}
    for r in dp:
        by.setdefault((r["dataset"], r["features"], r["epsilon"]), []).append(r["correct"])
    assert any(len(set(v)) > 1 for v in by.values()), "fit seeds must redraw DP-SGD's noise"
    summary = json.loads((runs["p2-accuracy"] / "summary.json").read_text())
    rows = next(v for k, v in summary["tables"].items() if k.startswith("sparse vs dense"))
    assert {r["variant"] for r in rows} == {"tuned", "untuned"} and {r["seeds"] for r in rows} == {2}
    assert "sparse_vs_dense_verdict_tuned" in summary and "(ε/2, δ/2)" in summary["protocol"]


def test_report_renders_with_claims_table(runs, tmp_path):
    out = tmp_path / "report"
    rc = main(["report", *[str(p) for p in runs.values()], "--out", str(out)])
    assert rc == 0
    html = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    claims = json.loads((out / "claims.json").read_text())
    assert "<h2>Claims</h2>" in html and "| id | claim | experiment | rule | measured | verdict |" in md
    assert html.count("data:image/png;base64,") >= len(runs)
    assert 'src="http' not in html and "<script" not in html  # self-contained
    verdicts = {c["id"]: c["verdict"] for c in claims}
    allowed = {"holds", "does not hold", "inconclusive", "not run", "not testable here"}
    assert set(verdicts.values()) <= allowed
    # every claim whose experiment was run got a computed verdict, never "not run"
    for c in claims:
        if any(e in runs for e in c["experiment"].split(" + ")):
            assert c["verdict"] in {"holds", "does not hold", "inconclusive"}, c
            assert "quick configuration" not in c["measured"]  # tiny configs are explicit files, not --quick
            assert "custom configuration]" in c["measured"], c  # each verdict names its configuration
    assert verdicts["P1-10"] == "not testable here"
    # P2-6 is decided by best-of-n (p2-rlhf-bon, run here); the GRPO run (a model experiment) is not given
    p2_6 = next(c for c in claims if c["id"] == "P2-6")
    assert p2_6["verdict"] != "not run" and "best-of-n at exact KL" in p2_6["measured"]
    for c in claims:
        assert c["id"] in html and c["verdict"] in html
