"""Benchmark: the four-method §5.4 protocol, vectorized engine vs a straightforward per-replicate loop.

Usage:
  python benchmarks/bench_alignment_protocol.py [--prompts 100] [--candidates 8192] [--max-log2-n 12]
      [--replicates 50] [--loop-prompts 4] [--loop-replicates 10] [--check]

The loop baseline (``loop_protocol`` below) draws each replicate with ``rng.permutation`` and evaluates
every method's exact law for that replicate alone, with the same quadrature nodes as the engine (order 6,
panels of 3·min(σ_X, σ_Z)) but computing PrivITP's acceptance probabilities from the closed form each time
(no per-prompt precompute, no early stop). It is too slow to run at full size, so it is timed on
``--loop-prompts`` prompts × ``--loop-replicates`` replicates (all N) and extrapolated linearly in
prompts × replicates; the output says so. ``--check`` also runs both on a smaller configuration and reports
the largest standardized difference between their lift estimates.

Timing on a shared machine: the loop's prompts are timed half just before and half just after the engine
run (so that a change of load during the run affects both sides), and both wall-clock and process CPU
time (``time.process_time``, all threads of this process) are reported; ``speedup`` is the wall-clock
ratio, ``speedup_cpu`` the CPU-time ratio (less sensitive to other jobs on the machine).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy import special

from privalign.alignment.laws import lambda_quadrature, privitp_acceptance, sequential_law
from privalign.alignment.normalizer import solve_normalizer
from privalign.alignment.simulation import MethodSpec, run_protocol
from privalign.alignment.synthetic import make_synthetic_pool
from privalign.data.pools import ScoredPool

BETA, EPS, SX, SZ, L = 0.05, 8.0, 0.1, 0.1, 3.0


def specs():
    return [
        MethodSpec("bon"),
        MethodSpec("itp", beta=BETA),
        MethodSpec("privbon", epsilon=EPS),
        MethodSpec("privitp", beta=BETA, sigma_x=SX, sigma_z=SZ, L=L),
    ]


def loop_protocol(pool, n_grid, replicates, seed, prompts=None):
    """Straightforward implementation: for prompt, for N, for replicate: draw, then each law."""
    rng = np.random.default_rng(seed)
    P = pool.proxy.shape[0] if prompts is None else prompts
    out = np.zeros((4, P, len(n_grid)))
    r_max = 1.0
    nodes, _ = lambda_quadrature(
        np.array([0.0]), SX, -BETA, r_max - BETA, panel_width=3 * min(SX, SZ), order=6, max_panels=400
    )
    w_nodes = r_max + SZ * L - nodes
    for p in range(P):
        c = int(pool.counts[p])
        r, t = pool.proxy[p, :c], pool.true[p, :c]
        base = t.mean()
        for g, n in enumerate(n_grid):
            acc = np.zeros(4)
            for _ in range(replicates):
                perm = rng.permutation(c)
                A, B = perm[:n], perm[n : 2 * n]
                acc[0] += t[A][np.argmax(r[A])]
                acc[1] += special.softmax(r[A] / (2 * r_max / EPS)) @ t[A]
                lam = solve_normalizer(r[A], BETA)
                pr, fb = sequential_law(np.clip((r[B] - lam) / (r_max - lam), 0, 1))
                acc[2] += pr @ t[B] + fb * base
                _, wts = lambda_quadrature(
                    np.array([lam]),
                    SX,
                    -BETA,
                    r_max - BETA,
                    panel_width=3 * min(SX, SZ),
                    order=6,
                    max_panels=400,
                )
                a = privitp_acceptance(r[B][None, :], nodes[:, None], w_nodes[:, None], SZ)
                pr, fb = sequential_law(a)
                acc[3] += wts[0] @ (pr @ t[B] + fb * base)
            out[:, p, g] = acc / replicates - base
    return out[[0, 2, 1, 3]]  # order: bon, itp, privbon, privitp


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--candidates", type=int, default=8192)
    ap.add_argument("--max-log2-n", type=int, default=12)
    ap.add_argument("--replicates", type=int, default=50)
    ap.add_argument("--loop-prompts", type=int, default=4)
    ap.add_argument("--loop-replicates", type=int, default=10)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    grid = [2**k for k in range(args.max_log2_n + 1)]
    pool = make_synthetic_pool(args.prompts, args.candidates, random_state=0)
    rows = {}
    if args.check:
        small = make_synthetic_pool(20, 512, random_state=1)
        g = [2**k for k in range(9)]
        v = run_protocol(small, specs(), n_grid=g, replicates=10, random_state=2, progress=False)
        lp = loop_protocol(small, g, 10, 3)
        zmax = 0.0
        for k, m in enumerate(v["methods"]):
            lv, sv = np.array(m["true_lift"]), np.array(m["true_lift_se"])
            ll = lp[k].mean(0)
            sl = lp[k].std(0, ddof=1) / math.sqrt(lp.shape[1])
            zmax = max(zmax, float(np.max(np.abs(lv - ll) / np.hypot(sv, sl))))
        from scipy.stats import norm

        crit = float(norm.isf(0.01 / (2 * 4 * len(g))))
        rows["agreement"] = {
            "config": "20 prompts × 512 candidates, N ≤ 256, 10 replicates",
            "max_abs_z": zmax,
            "critical_z(α=0.01, Bonferroni)": crit,
            "agree": zmax <= crit,
        }
    half = args.loop_prompts // 2
    loop_wall, loop_cpu = [], []

    def time_loop(lo, hi):  # the loop on prompts lo..hi−1 (all N), wall and CPU seconds
        if hi <= lo:
            return
        part = ScoredPool(pool.proxy[lo:hi], pool.true[lo:hi], pool.counts[lo:hi])
        w0, c0 = time.perf_counter(), time.process_time()
        loop_protocol(part, grid, args.loop_replicates, 1 + lo)
        loop_wall.append(time.perf_counter() - w0)
        loop_cpu.append(time.process_time() - c0)

    time_loop(0, half)
    w0, c0 = time.perf_counter(), time.process_time()
    res = run_protocol(pool, specs(), n_grid=grid, replicates=args.replicates, random_state=0, progress=True)
    t_vec, c_vec = time.perf_counter() - w0, time.process_time() - c0
    time_loop(half, args.loop_prompts)
    scale = (args.prompts / args.loop_prompts) * (args.replicates / args.loop_replicates)
    t_loop, c_loop = sum(loop_wall) * scale, sum(loop_cpu) * scale
    rows.update(
        {
            "pool": f"{args.prompts} prompts × {args.candidates} candidates (synthetic)",
            "protocol": f"N = 2^0..2^{args.max_log2_n}, {args.replicates} replicates, 4 methods",
            "vectorized_seconds": t_vec,
            "vectorized_cpu_seconds": c_vec,
            "loop_seconds_measured": sum(loop_wall),
            "loop_seconds_measured_before_after": loop_wall,
            "loop_cpu_seconds_measured": sum(loop_cpu),
            "loop_fraction": f"{args.loop_prompts} prompts × {args.loop_replicates} replicates (all N), "
            f"{half} timed before and {args.loop_prompts - half} after the engine",
            "loop_seconds_extrapolated": t_loop,
            "loop_cpu_seconds_extrapolated": c_loop,
            "speedup": t_loop / t_vec,
            "speedup_cpu": c_loop / c_vec,
            "lift_at_max_n": {m["name"]: m["true_lift"][-1] for m in res["methods"]},
        }
    )
    print(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
