"""The step counts ``benchmarks/bench_frontier_routes.py`` multiplies its measured CPU per step by are the
frontier's own (each route class's ``steps`` at n under the packaged configuration), and its extrapolated rows
follow the stated formulas (BENCHMARKS.md, "Frontier routes: CPU cost per route and n")."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_frontier_routes", ROOT / "benchmarks" / "bench_frontier_routes.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cfg():
    from privalign.experiments.config import load_config, packaged_config_path
    from privalign.experiments.frontier import _schema

    return load_config(packaged_config_path("beyond_frontier"), _schema())


@pytest.mark.parametrize("n", [400, 2000, 8000, 8003])
def test_route_steps_are_the_frontier_formulas(bench, cfg, tmp_path, n):
    data = {"pairs": SimpleNamespace(prompts=["p"] * n), "grpo": ["g"] * cfg["grpo_prompts"]}
    steps = bench.route_steps(cfg, data, tmp_path)
    b, e = cfg["dpo_batch"], cfg["dpo_epochs"]
    assert (b, e) == (8, 1)  # the formulas below are stated for the packaged configuration
    for m in ("none", "label", "sample"):
        assert steps[f"dpo:{m}"] == e * (n // b)
    halves = [n // 2 + n % 2, n // 2]  # np.array_split into props_stages = 2
    assert cfg["props_stages"] == 2
    assert steps["props"] == sum(e * (h // b) for h in halves)
    assert steps["dpprefsyn"] == e * (cfg["grpo_prompts"] // b) == 8  # independent of n
    assert steps["grpo"] == cfg["grpo_steps"] == 100


def test_trm_steps_and_extrapolated_rows(bench, cfg):
    got = [bench.trm_steps(n, cfg["trm_epochs"], cfg["trm_batch"]) for n in (400, 2000, 8000)]
    assert got == [13, 63, 250]
    per = {
        "dpo:none": {"step_cpu": 2.0},
        "dpo:label": {"step_cpu": 3.0},
        "dpo:sample": {"step_cpu": 5.0},
        "dpprefsyn:features_per_pair_cpu": 0.5,
        "grpo": {"step_cpu": 7.0},
    }
    steps = {"dpo:none": 50, "dpo:label": 50, "dpo:sample": 50, "props": 49, "dpprefsyn": 8, "grpo": 100}
    got = {r["route"]: r["cpu_s"] for r in bench.policy_rows(400, per, steps)}
    assert got == {
        "DPO training": 100.0,
        "label-DP DPO training": 150.0,
        "sample-DP DPO training": 250.0,
        "PROPS training (DPO steps)": 147.0,
        "DPPrefSyn (features of n pairs + DPO steps)": 0.5 * 400 + 8 * 2.0,
        "GRPO training (RM fit excluded)": 700.0,
    }
    assert all(r["how"] == "extrapolated" for r in bench.policy_rows(400, per, steps))
