"""Benchmark: batch selection with seeded noise.

Usage:
  python benchmarks/bench_alignment_batch.py [--prompts 10000] [--candidates 1024] [--loop-prompts 10000]
      [--runs 5] [--skip-privitp] [--skip-privbon] [--privbon-epsilon 2]

* **PrivITP**: vectorized ``select_batch`` vs a per-prompt loop of ``select`` (``SeededNoise``; β = 0.05,
  σ_X = σ_Z = 0.5). Both paths consume the same kind of noise; the loop is timed on ``--loop-prompts``
  prompts (all of them by default) and, if fewer, extrapolated linearly (the output says so). ``--runs``
  repeats the pair (batch first, then the loop, each run on a fresh generator) and reports every run.
* **PrivBoN** (ε = ``--privbon-epsilon``, Δ = R_max = 1): ``select_batch`` with the default ``SeededNoise``
  (numpy's Gumbel draw, one per candidate) and with the opt-in ``FastSeededNoise`` (exact rejection
  sampler of the Gumbel-max law, with an exact Gumbel fallback), against the **memory-bandwidth floor**:
  one streaming read of the score array (``scores.sum()``), measured in the same rounds (floor, default,
  fast; ``max(--runs, 5)`` rounds). Ratios: best / best and median / median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from privalign.alignment import PrivBoN, PrivITP
from privalign.rng import FastSeededNoise, SeededNoise


def bench_privitp(a, b, loop_prompts: int, runs: int) -> dict:
    m = PrivITP(0.05, sigma_x=0.5, sigma_z=0.5)
    m.epsilon_max(a.shape[1])  # the worst case is data-independent and cached: compute it up front
    k = min(loop_prompts, a.shape[0])
    rows = []
    for r in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        out = m.select_batch(a, rng=np.random.default_rng(1 + r), pool_b_scores=b)
        t_vec, c_vec = time.perf_counter() - t0, time.process_time() - c0
        rng = np.random.default_rng(1 + r)
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(k):
            m.select(a[i], rng=rng, pool_b_scores=b[i])
        scale = a.shape[0] / k
        t_loop, c_loop = (time.perf_counter() - t0) * scale, (time.process_time() - c0) * scale
        rows.append(
            {
                "run": r + 1,
                "vectorized_seconds": t_vec,
                "loop_seconds": t_loop,
                "speedup": t_loop / t_vec,
                "vectorized_cpu_seconds": c_vec,
                "loop_cpu_seconds": c_loop,
                "speedup_cpu": c_loop / c_vec,
                "fallback_rate": float(np.mean(out.indices == -1)),
                "loadavg": os.getloadavg()[0],
            }
        )
    return {
        "config": f"{a.shape[0]} prompts × {a.shape[1]} candidates, PrivITP β=0.05 σx=σz=0.5, SeededNoise",
        "loop_measured_prompts": k,
        "loop_extrapolated": k < a.shape[0],
        "runs": rows,
        "min_speedup": min(x["speedup"] for x in rows),
        "min_speedup_cpu": min(x["speedup_cpu"] for x in rows),
    }


def bench_privbon(a, epsilon: float, runs: int) -> dict:
    """Rounds of (floor, default, fast), interleaved so that a change of machine load hits all three."""
    sel = PrivBoN(epsilon)
    names = ("floor: streaming read a.sum()", "SeededNoise (default)", "FastSeededNoise (opt-in)")
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(max(runs, 5)):
        t0 = time.perf_counter()
        a.sum()
        times[names[0]].append(time.perf_counter() - t0)
        for name, make in ((names[1], SeededNoise), (names[2], FastSeededNoise)):
            src = make(np.random.default_rng(10 + r))
            t0 = time.perf_counter()
            sel.select_batch(a, rng=src)
            times[name].append(time.perf_counter() - t0)
    fmin, fmed = min(times[names[0]]), statistics.median(times[names[0]])
    res = {
        "config": (
            f"{a.shape[0]} prompts × {a.shape[1]} candidates ({a.nbytes / 2**20:.0f} MB), "
            f"PrivBoN ε={epsilon:g}"
        ),
        "floor_GB_per_s_best": a.nbytes / fmin / 1e9,
    }
    for name in names:
        t = times[name]
        res[name] = {
            "seconds": t,
            "min_seconds": min(t),
            "median_seconds": statistics.median(t),
            "min_over_floor_min": min(t) / fmin,
            "median_over_floor_median": statistics.median(t) / fmed,
        }
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--candidates", type=int, default=1024)
    ap.add_argument("--loop-prompts", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--privbon-epsilon", type=float, default=2.0)
    ap.add_argument("--skip-privitp", action="store_true")
    ap.add_argument("--skip-privbon", action="store_true")
    args = ap.parse_args(argv)
    gen = np.random.default_rng(0)
    a = gen.uniform(0, 1, (args.prompts, args.candidates))
    b = gen.uniform(0, 1, (args.prompts, args.candidates))
    rows = {"utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "loadavg_start": os.getloadavg()}
    if not args.skip_privbon:
        rows["privbon"] = bench_privbon(a, args.privbon_epsilon, args.runs)
    if not args.skip_privitp:
        rows["privitp"] = bench_privitp(a, b, args.loop_prompts, args.runs)
    rows["loadavg_end"] = os.getloadavg()
    print(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
