"""Benchmark: Sample-DP IHT on dense float32 data (n = 50,000, d = 4,096) against one full pass X.T @ v,
and against DP-SGD on the same data at the same (ε, δ).

Baselines measured in the same run:
  * one full pass ``v @ X`` (= Xᵀv) over the same float32 matrix (BLAS sgemv), median of 5;
  * fit times are the median of ``--repeats`` fits (the first, which pays one-time costs, is reported too);
  * DPSGDLinear at the same (ε, δ) (PLD-calibrated, 5 epochs, batch 256): time ratio and error ratio.

Targets: fit time ≤ 5× one pass; peak extra memory during fit such that data + extra ≤ 2× data.
Peak memory is measured with ``tracemalloc`` (numpy reports its buffers to it), started after the data
exists, so "extra" is what fit allocates on top of the data.

Usage: ``python benchmarks/bench_estimation_sample_dp_iht.py [--n 50000] [--d 4096] [--json]``
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np


def make_dense(n: int, d: int, s_star: int, seed: int):
    from privalign.estimation.base import sigmoid
    from privalign.estimation.synthetic import sparse_theta

    rng = np.random.default_rng(seed)
    theta = sparse_theta(d, s_star, 3.0, rng)
    X = rng.random((n, d), dtype=np.float32)
    X *= 2.0
    X -= 1.0
    z = np.asarray(X @ theta.astype(np.float32), dtype=np.float64)
    y = (rng.random(n) < sigmoid(z)).astype(np.float64)
    return X, y, theta


def timed_fit(est, X, y):
    """Peak extra memory of one fit (tracemalloc, which slows numpy's allocations a little; not timed)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    est.fit(X, y)
    dt = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return dt, peak


def fit_times(make, X, y, repeats: int):
    """Wall time of ``repeats`` fits without tracing: (first, median of all). The first fit of a process
    also pays one-time costs (imports, the thread pool, Peeling's cached calibration)."""
    ts = []
    for _ in range(repeats):
        est = make()
        t0 = time.perf_counter()
        est.fit(X, y)
        ts.append(time.perf_counter() - t0)
    return ts[0], float(np.median(ts)), est


def main(argv: list[str] | None = None) -> dict:
    from privalign.estimation import DPSGDLinear, SampleDPIHT

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--d", type=int, default=4_096)
    ap.add_argument("--s-star", type=int, default=16)
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed fits per variant (median reported)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    X, y, theta = make_dense(a.n, a.d, a.s_star, a.seed)
    data_bytes = X.nbytes
    v = np.random.default_rng(1).standard_normal(a.n).astype(np.float32)
    passes = []
    for _ in range(5):
        t0 = time.perf_counter()
        _ = v @ X
        passes.append(time.perf_counter() - t0)
    one_pass = float(np.median(passes))

    # shuffle=False: contiguous row blocks (views; the rows are i.i.d., so already in random order);
    # shuffle=True (the estimator's default): random batches, gathered chunk by chunk.
    def make(sh):
        return lambda: SampleDPIHT(
            epsilon=a.epsilon, delta=a.delta, sparsity=a.s_star, shuffle=sh, random_state=a.seed
        )

    t_first, t_dp, dp = fit_times(make(False), X, y, a.repeats)
    t_first_sh, t_dp_sh, _ = fit_times(make(True), X, y, a.repeats)
    _, peak_dp = timed_fit(make(False)(), X, y)
    _, peak_dp_sh = timed_fit(make(True)(), X, y)
    t0 = time.perf_counter()
    _ = float(X.min()), float(X.max())
    t_check = time.perf_counter() - t0
    DPSGDLinear(epsilon=a.epsilon, delta=a.delta, epochs=0.001).fit(X[:2000], y[:2000])  # warm imports only
    _, t_sgd, sgd = fit_times(
        lambda: DPSGDLinear(epsilon=a.epsilon, delta=a.delta, random_state=a.seed), X, y, 1
    )
    _, peak_sgd = timed_fit(DPSGDLinear(epsilon=a.epsilon, delta=a.delta, random_state=a.seed), X, y)
    err_dp = float(np.sum((dp.coef_ - theta) ** 2))
    err_sgd = float(np.sum((sgd.coef_ - theta) ** 2))
    res = {
        "n": a.n,
        "d": a.d,
        "s_star": a.s_star,
        "epsilon": a.epsilon,
        "delta": a.delta,
        "dtype": "float32",
        "data_MB": data_bytes / 2**20,
        "one_pass_XTv_s": one_pass,
        "input_check_minmax_s": t_check,
        "sample_dp_iht_fit_s": t_dp,
        "n_iter": dp.n_iter_,
        "fit_over_pass": t_dp / one_pass,
        "first_fit_s": t_first,
        "first_fit_over_pass": t_first / one_pass,
        "sample_dp_iht_peak_extra_MB": peak_dp / 2**20,
        "peak_total_over_data": (data_bytes + peak_dp) / data_bytes,
        "shuffled_fit_s": t_dp_sh,
        "shuffled_fit_over_pass": t_dp_sh / one_pass,
        "shuffled_first_fit_over_pass": t_first_sh / one_pass,
        "shuffled_peak_extra_MB": peak_dp_sh / 2**20,
        "shuffled_peak_total_over_data": (data_bytes + peak_dp_sh) / data_bytes,
        "dpsgd_fit_s": t_sgd,
        "dpsgd_steps": sgd.steps_,
        "dpsgd_noise_multiplier": sgd.noise_multiplier_,
        "dpsgd_peak_extra_MB": peak_sgd / 2**20,
        "time_ratio_dpsgd_over_dpiht": t_sgd / t_dp,
        "sq_error_dp_iht": err_dp,
        "sq_error_dpsgd": err_sgd,
        "error_ratio_dpsgd_over_dpiht": err_sgd / err_dp,
        "theta_star_sq_norm": float(theta @ theta),
    }
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print("| quantity | value |\n|---|---|")
        for k, val in res.items():
            print(f"| {k} | {val:.4g} |" if isinstance(val, float) else f"| {k} | {val} |")
    return res


if __name__ == "__main__":
    main()
