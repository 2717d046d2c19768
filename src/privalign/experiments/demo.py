"""The main job (``make demo`` → ``privalign demo --out DIR``): the quick configurations of the headline
experiments on the embedded defaults, then the report.

It draws the papers' main figures: the four-way lift-vs-N figure (BoN, ITP, PrivBoN, PrivITP) on the
synthetic pool with planted reward hacking up to N = 1024 (``p1-scaling``) and on the shipped IMDb pool up
to N = 256 (``p1-scaling-imdb``), and the lift-vs-ε figure at equal privacy (``p1-privacy-sweep``: PrivITP's
ε_max(N) at δ = PrivBoN's ε). When the shipped IMDb pool (``pools/imdb-smollm2.jsonl.gz``) is absent, the
real-pool experiments fall back to a synthetic pool and the report labels the affected claims ``synthetic
pool: the shipped pool was absent``. Time on 2 CPU cores: see ``docs/experiments.md`` (measured, with the
command and the machine's load).
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
    "p1-scaling-imdb",
    "p1-privacy-sweep",
    "p1-privacy-sweep-imdb",
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
    configs: dict[str, Path] = {}
    for n in names:
        prepare(n, out=out / n, quick=True, config_path=configs.get(n), progress=progress)
    t0 = time.perf_counter()
    timings = {}
    for n in names:
        t = time.perf_counter()
        print(f"privalign demo: running {n} (quick)…", file=sys.stderr)
        run_experiment(n, out=out / n, quick=True, config_path=configs.get(n), progress=progress)
        timings[n] = time.perf_counter() - t
    report = write_report([out / n for n in names], out / "report")
    import json

    claims = json.loads((out / "report" / "claims.json").read_text())
    return {"report": str(report), "claims": claims, "timings": timings, "seconds": time.perf_counter() - t0}
