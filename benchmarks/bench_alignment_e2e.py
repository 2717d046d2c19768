"""Benchmark: ``privalign simulate`` end to end against the authors' comparison script, same pool and
protocol.

Usage:
  python benchmarks/bench_alignment_e2e.py --authors-script /path/outside/repo/comparison.py
      [--pools 3,10] [--candidates 8192] [--repeats 3] [--workdir DIR]
  python benchmarks/bench_alignment_e2e.py --memory-pool 1000x4096 [--workdir DIR]

The authors' script (``experiments/Comparison_of ITP_BON_PrivITP_ PrivBON.py`` of
NandiniBhattad13/Privacy-Without-Regret-Differentially-Private-Inference-Time-Alignment, with its
``plot_utils.py`` next to it) is public but not part of this repository: fetch it into a scratch folder
outside the repository and pass its path. It is run from its own folder. Without ``--authors-script`` the
baseline is the suite's per-replicate loop (``loop_protocol`` of ``bench_alignment_protocol.py``, the same
Monte-Carlo protocol), timed on a subset and extrapolated (the output says so).

Protocol (both sides): BoN, ITP (β = 0.05), PrivBoN (Gumbel scale σ = 1), PrivITP (σ_X = σ_Z = 0.5, the
script's σ_phase = σ/2); N = 2^0..2^12; 50 replicates; rewards z-normalised over the pool; synthetic pools
of P prompts × 8,192 candidates (binary correctness, ``make_synthetic_pool(seed 0)``) written in the
authors' JSONL schema. Each process is timed from start to exit (wall clock, and user + system CPU of that
process from ``os.wait4``; peak RSS likewise). ``privalign simulate`` is run once cold (it builds the
columnar pool cache) and ``--repeats`` times warm, interleaved with the authors' runs so that a change of
machine load affects both. Ratios: authors / ours.

``--before-src DIR`` also times ``privalign simulate`` run from another source tree (``PYTHONPATH=DIR``; e.g.
``git archive <commit> src | tar -x`` in a scratch folder), interleaved in the same rounds.

``--bytecode-cache`` also times each ``privalign simulate`` (ours, and ``--before-src``) with Python's
bytecode cache as an installed package has it (``PYTHONDONTWRITEBYTECODE`` unset, ``PYTHONPYCACHEPREFIX`` in
the work folder, filled by an untimed run first), in the same rounds: with ``PYTHONDONTWRITEBYTECODE=1`` in
the environment and an editable install, every run compiles privalign's modules from source.

``--memory-pool PxC`` measures reading a P × C JSONL pool: the JSON reader (``ScoredPool.read``), the cache's
first read (parse + write the columns) and a later read (memory-mapped), each in its own process; reported
as the tracemalloc peak during the read (Python and numpy allocations) and the process's peak RSS minus its
RSS just before the read, against the size of the score arrays (proxy + true, float64).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BETA, SIGMA_GUMBEL, SIGMA_PHASE, MAX_LOG2_N, REPLICATES = 0.05, 1.0, 0.5, 12, 50


def write_authors_pool(path: Path, prompts: int, candidates: int) -> None:
    from privalign.alignment.synthetic import make_synthetic_pool

    pool = make_synthetic_pool(prompts, candidates, random_state=0)
    with open(path, "w", encoding="utf-8") as fh:
        for p in range(prompts):
            resp = [
                {
                    "text": f"... The answer is {'AB'[int(t)]}.",
                    "predicted_answer": "AB"[int(t)],
                    "is_correct": bool(t),
                    "proxy_reward": float(r),
                }
                for r, t in zip(pool.proxy[p], pool.true[p])
            ]
            fh.write(
                json.dumps(
                    {
                        "prompt": f"q{p}",
                        "choices": ["a", "b", "c", "d"],
                        "subject": "s",
                        "gt_answer": "B",
                        "responses": resp,
                    }
                )
                + "\n"
            )


def timed(cmd: list[str], *, cwd=None, env=None) -> dict:
    """Run ``cmd`` to completion; wall seconds, CPU seconds (user + sys) and peak RSS of that process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}):\n{err[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "max_rss_mb": ru.ru_maxrss / 1024,
        "stdout": out,
    }


def _with_pyc(env: dict, work: Path) -> dict:
    """``env`` with Python's bytecode cache on, kept in ``work/pycache`` (nothing written into the source)."""
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    return out


def ours_cmd(pool: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "privalign",
        "simulate",
        "--pool",
        str(pool),
        "--out",
        str(out),
        "--methods",
        "bon,itp,privbon,privitp",
        "--beta",
        str(BETA),
        "--sigma-gumbel",
        str(SIGMA_GUMBEL),
        "--sigma-x",
        str(SIGMA_PHASE),
        "--sigma-z",
        str(SIGMA_PHASE),
        "--max-log2-n",
        str(MAX_LOG2_N),
        "--replicates",
        str(REPLICATES),
        "--no-progress",
    ]


def authors_cmd(script: Path, pool: Path, out_base: Path) -> list[str]:
    return [
        sys.executable,
        str(script),
        "--input_file",
        str(pool),
        "--output_basename",
        str(out_base),
        "--sigma_gumbel",
        str(SIGMA_GUMBEL),
        "--beta",
        str(BETA),
        "--n_max_exp",
        str(MAX_LOG2_N),
        "--m_replicates",
        str(REPLICATES),
    ]


def loop_baseline(pool_path: Path, prompts: int, replicates: int) -> dict:
    """The suite's per-replicate loop on ``prompts`` prompts × ``replicates`` replicates (all N), timed in
    this process after reading the pool; extrapolated to the full protocol by the caller."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_alignment_protocol as bp
    from privalign.alignment.simulation import prepare_scores
    from privalign.data.pools import ScoredPool

    pool = ScoredPool.read(pool_path)
    _, clipped, r_max = prepare_scores(pool, transform="global_z", score_range=(-4.0, 4.0))
    part = ScoredPool(clipped[:prompts] / r_max, pool.true[:prompts], pool.counts[:prompts])
    grid = [2**k for k in range(MAX_LOG2_N + 1)]
    w0, c0 = time.perf_counter(), time.process_time()
    bp.loop_protocol(part, grid, replicates, 0)
    return {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}


def _add_series(row: dict, series: dict[str, list[dict]], base: list[dict], *, store: bool = True) -> None:
    """Each series' runs (``store``) and, with the authors' runs, its per-round ratios (authors / it)."""
    for side, runs in series.items():
        if not runs:
            continue
        name = f"{side}_bytecode_cache" if store else side
        if store:
            row[name] = [{k: v for k, v in b.items() if k != "stdout"} for b in runs]
        for k in ("cpu_s", "wall_s") if base else ():
            row[f"{name}_ratio_per_round_{k[:-2]}"] = [b[k] / w[k] for b, w in zip(base, runs, strict=True)]


def _clear_pool_cache(cache: Path) -> None:
    import shutil

    for d in cache.glob("*"):
        if d.is_dir():
            shutil.rmtree(d)


def run_e2e(args) -> dict:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="privalign-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PRIVALIGN_CACHE_DIR=str(work / "cache"))
    rows = []
    for prompts in [int(x) for x in args.pools.split(",")]:
        pool = work / f"pool_{prompts}x{args.candidates}.jsonl"
        if not pool.exists():
            write_authors_pool(pool, prompts, args.candidates)
        _clear_pool_cache(work / "cache")  # cold start: no cache entry for this pool
        cold = timed(ours_cmd(pool, work / f"ours_{prompts}_cold"), env=env)
        warm, base, before = [], [], []
        pyc: dict[str, list[dict]] = {"ours": [], "before": []}
        env_b = dict(env, PYTHONPATH=str(Path(args.before_src).resolve())) if args.before_src else None
        if args.bytecode_cache:  # untimed runs that fill the bytecode cache
            for e in (env, env_b):
                if e is not None:
                    timed(ours_cmd(pool, work / f"pyc_fill_{prompts}"), env=_with_pyc(e, work))
        for r in range(args.repeats):
            warm.append(timed(ours_cmd(pool, work / f"ours_{prompts}_{r}"), env=env))
            if env_b is not None:  # the same command on another source tree (e.g. the code before a change)
                before.append(timed(ours_cmd(pool, work / f"before_{prompts}_{r}"), env=env_b))
            if args.bytecode_cache:
                for side, e in (("ours", env), ("before", env_b)):
                    if e is not None:
                        out = work / f"{side}_pyc_{prompts}_{r}"
                        pyc[side].append(timed(ours_cmd(pool, out), env=_with_pyc(e, work)))
            if args.authors_script:
                script = Path(args.authors_script).resolve()
                base.append(
                    timed(authors_cmd(script, pool, work / f"authors_{prompts}_{r}"), cwd=script.parent)
                )
        row = {
            "pool": f"{prompts} × {args.candidates}",
            "pool_mb": pool.stat().st_size / 2**20,
            "ours_cold": {k: v for k, v in cold.items() if k != "stdout"},
            "ours_warm": [{k: v for k, v in w.items() if k != "stdout"} for w in warm],
        }
        med = {k: statistics.median(w[k] for w in warm) for k in ("wall_s", "cpu_s")}
        _add_series(row, pyc, base)
        if before:
            row["before_src"] = [{k: v for k, v in b.items() if k != "stdout"} for b in before]
            row["before_median"] = {k: statistics.median(b[k] for b in before) for k in ("wall_s", "cpu_s")}
        if base:
            row["baseline"] = "authors' comparison script"
            row["authors"] = [{k: v for k, v in b.items() if k != "stdout"} for b in base]
            bmed = {k: statistics.median(b[k] for b in base) for k in ("wall_s", "cpu_s")}
            row["ratio_per_round_wall"] = [b["wall_s"] / w["wall_s"] for b, w in zip(base, warm, strict=True)]
            row["ratio_per_round_cpu"] = [b["cpu_s"] / w["cpu_s"] for b, w in zip(base, warm, strict=True)]
        else:
            lp, lr = args.loop_prompts, args.loop_replicates
            m = loop_baseline(pool, lp, lr)
            scale = prompts / lp * REPLICATES / lr
            row["baseline"] = (
                f"suite loop (loop_protocol), {lp} prompt(s) × {lr} replicates timed, "
                f"extrapolated ×{scale:g}; pool read and imports not included"
            )
            bmed = {k: m[k] * scale for k in ("wall_s", "cpu_s")}
            row["loop_measured"] = m
        _add_series(row, {"before": before}, base, store=False)
        row["baseline_median"] = bmed
        row["ours_warm_median"] = med
        row["ratio_warm_median_wall"] = bmed["wall_s"] / med["wall_s"]
        row["ratio_warm_median_cpu"] = bmed["cpu_s"] / med["cpu_s"]
        row["ratio_cold_wall"] = bmed["wall_s"] / cold["wall_s"]
        row["ratio_cold_cpu"] = bmed["cpu_s"] / cold["cpu_s"]
        rows.append(row)
    return {
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "loadavg": os.getloadavg(),
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "protocol": f"BoN, ITP β={BETA}, PrivBoN σ={SIGMA_GUMBEL}, PrivITP σx=σz={SIGMA_PHASE}; "
        f"N = 2^0..2^{MAX_LOG2_N}; {REPLICATES} replicates",
        "runs": rows,
    }


_MEM_CHILD = r"""
import json, resource, sys, time, tracemalloc
import numpy as np
from privalign.data.pools import ScoredPool
from privalign.data.pool_cache import read_scored_pool
mode, path, cache = sys.argv[1], sys.argv[2], sys.argv[3]
with open("/proc/self/statm") as fh:
    rss_before = int(fh.read().split()[1]) * resource.getpagesize() / 2**20
tracemalloc.start()
t0 = time.perf_counter()
pool = ScoredPool.read(path) if mode == "json" else read_scored_pool(path, cache_dir=cache)
secs = time.perf_counter() - t0
_, peak = tracemalloc.get_traced_memory()
s = 0.0  # touch every score (pages a memory map in), 64 rows at a time so the check adds no big temporary
for i in range(0, pool.proxy.shape[0], 64):
    s += float(np.nansum(pool.proxy[i:i + 64])) + float(np.nansum(pool.true[i:i + 64]))
print(json.dumps({"seconds": secs, "tracemalloc_peak_mb": peak / 2**20, "rss_before_read_mb": rss_before,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "score_arrays_mb": (pool.proxy.nbytes + pool.true.nbytes) / 2**20, "checksum": s}))
"""


def run_memory(args) -> dict:
    p, c = (int(x) for x in args.memory_pool.lower().split("x"))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="privalign-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    pool = work / f"pool_{p}x{c}.jsonl"
    if not pool.exists():
        write_authors_pool(pool, p, c)
    cache = work / "memcache"
    out = {
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "loadavg": os.getloadavg(),
        "pool": f"{p} × {c}",
        "pool_file_mb": pool.stat().st_size / 2**20,
    }
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    for mode in args.memory_modes.split(","):
        res = subprocess.run(
            [sys.executable, "-c", _MEM_CHILD, "json" if mode == "json" else "cache", str(pool), str(cache)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(res.stdout)
        r["tracemalloc_peak_over_scores"] = r["tracemalloc_peak_mb"] / r["score_arrays_mb"]
        r["peak_rss_minus_rss_before_over_scores"] = (r["max_rss_mb"] - r["rss_before_read_mb"]) / r[
            "score_arrays_mb"
        ]
        out[mode] = r
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--authors-script", default=None, help="path of the authors' comparison script (outside the repo)"
    )
    ap.add_argument("--pools", default="3,10", help="prompt counts of the pools (comma-separated)")
    ap.add_argument("--candidates", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loop-prompts", type=int, default=1)
    ap.add_argument("--loop-replicates", type=int, default=5)
    ap.add_argument("--workdir", default=None)
    ap.add_argument(
        "--before-src",
        default=None,
        help=(
            "also time `privalign simulate` from this src/ folder (PYTHONPATH), e.g. the code before a change"
        ),
    )
    ap.add_argument(
        "--bytecode-cache",
        action="store_true",
        help="also time `privalign simulate` with the bytecode cache on (PYTHONDONTWRITEBYTECODE unset)",
    )
    ap.add_argument("--memory-pool", default=None, help="PxC: measure pool-reading memory instead")
    ap.add_argument(
        "--memory-modes",
        default="json,cache_first_read,cache_later_read",
        help="which reads to measure (comma-separated; cache_later_read needs cache_first_read before it)",
    )
    args = ap.parse_args(argv)
    rows = run_memory(args) if args.memory_pool else run_e2e(args)
    print(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
