"""The main job (``make demo`` → ``privalign demo --out DIR``): the quick configurations of the headline
experiments on the embedded defaults, then the report.

The shipped IMDb pool is used when present (``pools/imdb-smollm2.jsonl.gz``); otherwise the quick configs
fall back to a synthetic pool and the report labels the affected claims ``[synthetic pool: the shipped
pool was absent]``. Expected time on 2 CPU cores: see ``docs/experiments.md`` (measured, with the command).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

__all__ = ["DEMO_EXPERIMENTS", "run_demo"]

#: Headline experiments run by the demo, in order (those not registered in this build are skipped
#: with a message).
DEMO_EXPERIMENTS = (
    "p1-scaling",
    "p1-epsilon-star",
    "p1-budget",
    "p2-rates",
    "p2-accuracy",
    "p2-winrate",
    "beyond-membership",
    "beyond-train-vs-inference",
)


def run_demo(out: str | Path, *, progress: bool | None = None) -> dict:
    """Run the demo into ``out``; return ``{"report": path, "rows": [...], "seconds": float}``.

    All experiments are checked (config, output directory, inputs) before the first one starts.
    """
    from privalign.experiments.registry import EXPERIMENTS
    from privalign.experiments.report import write_report
    from privalign.experiments.runner import prepare, run_experiment

    out = Path(out)
    names = [n for n in DEMO_EXPERIMENTS if n in EXPERIMENTS]
    for n in DEMO_EXPERIMENTS:
        if n not in EXPERIMENTS:
            print(f"privalign demo: {n} is not available in this build; skipped", file=sys.stderr)
    from privalign.experiments.config import packaged_config_path
    from privalign.paths import repo_root

    # The shipped real pool, when present, replaces the synthetic fallback of p1-scaling's quick config.
    shipped = (repo_root() / "pools" / "imdb-smollm2.jsonl.gz").is_file()
    configs = {"p1-scaling": packaged_config_path("p1_scaling_shipped")} if shipped else {}
    for n in names:
        prepare(n, out=out / n, quick=True, config_path=configs.get(n), progress=progress)
    t0 = time.perf_counter()
    timings = {}
    for n in names:
        t = time.perf_counter()
        print(f"privalign demo: running {n} ({'shipped pool' if n in configs else 'quick'})…", file=sys.stderr)
        run_experiment(n, out=out / n, quick=True, config_path=configs.get(n), progress=progress)
        timings[n] = time.perf_counter() - t
    report = write_report([out / n for n in names], out / "report")
    import json

    claims = json.loads((out / "report" / "claims.json").read_text())
    return {"report": str(report), "claims": claims, "timings": timings, "seconds": time.perf_counter() - t0}
