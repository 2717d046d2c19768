"""Overhead of the experiment harness over a direct call of the evaluation protocol.

Baseline: one call of ``privalign.alignment.simulation.run_protocol`` on the whole N grid (what a script
would do). Harness: ``privalign.experiments.runner.run_experiment("p1-scaling", ...)`` on the same pool
size, methods and grid, which runs one protocol call per N (so that runs can resume), writes
results.jsonl, summary.json, the manifest and the figure (PNG + PDF). Prints a markdown table with the
ratio harness / baseline (median of ``--repeats`` runs).

    python benchmarks/bench_experiments_harness.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def _config(path: Path) -> dict:
    cfg = {
        "seed": 1,
        "pool": "synthetic",
        "n_prompts": 20,
        "pool_size": 256,
        "n_max_log2": 7,
        "replicates": 10,
        "methods": ["BoN", "ITP", "PrivBoN", "PrivITP"],
        "sigmas_gumbel": [0.1],
        "privitp_sigmas": [0.2],
    }
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg.items()), encoding="utf-8")
    return cfg


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from privalign.alignment.simulation import MethodSpec, run_protocol
    from privalign.alignment.synthetic import make_synthetic_pool
    from privalign.experiments.runner import run_experiment

    base_t, harness_t = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg = _config(tmp / "c.toml")
        for r in range(args.repeats):
            pool = make_synthetic_pool(cfg["n_prompts"], cfg["pool_size"], random_state=r)
            specs = [
                MethodSpec("bon"),
                MethodSpec("itp", beta=0.05),
                MethodSpec("privbon", sigma=0.1),
                MethodSpec("privitp", beta=0.05, sigma_x=0.1, sigma_z=0.1, L=4.0, delta=1e-5),
            ]
            t = time.perf_counter()
            run_protocol(
                pool,
                specs,
                n_grid=[2**k for k in range(cfg["n_max_log2"] + 1)],
                replicates=cfg["replicates"],
                random_state=r,
                progress=False,
            )
            base_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            run_experiment("p1-scaling", config_path=tmp / "c.toml", out=tmp / f"run{r}", progress=False)
            harness_t.append(time.perf_counter() - t)
    b, h = statistics.median(base_t), statistics.median(harness_t)
    print("| what | median seconds |")
    print("|---|---|")
    print(f"| baseline: run_protocol, whole N grid in one call | {b:.2f} |")
    print(f"| harness: privalign reproduce p1-scaling (per-N cells, files, figure) | {h:.2f} |")
    print(f"| ratio harness / baseline | {h / b:.2f} |")


if __name__ == "__main__":
    main()
