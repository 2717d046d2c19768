"""Benchmark: the transformer reward model (``fit-reward --model minilm``) against the linear one, training
cost on this CPU.

Both train on the same HH-RLHF harmless pairs (the first ``--n-pairs``), sample-DP at the same (ε, δ):

* transformer: ``DPTransformerRM(privacy="sample")`` (MiniLM, the upper ``--top-layers`` trained under Opacus
  DP-SGD, batch ``--batch-size``); its fit is a one-off pass of the frozen lower layers over every text (the
  cache) plus the DP-SGD steps. Steps per minute = steps / the DP-SGD loop's wall time (timed inside the fit;
  the cache, the backbone load and the noise calibration do not count); the cache's cost is reported on its
  own (texts per second), and the whole fit's time too.
* linear: ``DPSGDLinear`` on hashed n-gram comparison features (d = 4096, the fit-reward default), 4× the
  epochs; steps per minute = steps_ / fit time, the noise calibration done beforehand; featurisation on its
  own.

Steps per CPU-minute (``time.process_time``, one thread) are reported too: on a shared machine they depend
much less on the load than wall-clock steps per minute. Peak memory: each model runs in a subprocess of its
own and reports its peak resident set size
(``resource.getrusage``, ru_maxrss), which includes the interpreter, torch and the data.
Scoring cost (``serve`` / ``build-pool``): texts per second of each model's feature map on held texts.

Usage: ``nice -n 15 python benchmarks/bench_reward_transformer.py [--n-pairs 256] [--json]`` with
``OMP_NUM_THREADS=1`` (torch threads are set to 1 too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time


def _pairs(n: int):
    import numpy as np

    from privalign.data.preferences_io import load_hh_rlhf_pairs

    p = load_hh_rlhf_pairs(limit=n)
    rng = np.random.default_rng(0)
    y = (rng.random(len(p.chosen)) < 0.5).astype(np.float64)
    X = [(k, r, c) if yi else (k, c, r) for k, c, r, yi in zip(p.prompts, p.chosen, p.rejected, y)]
    return X, y


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_transformer(a: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from privalign.estimation import transformer as T
    from privalign.estimation.transformer import DPTransformerRM, TransformerFeatures, _Backbone

    torch.set_num_threads(1)
    X, y = _pairs(a.n_pairs)

    class Timed(DPTransformerRM):
        """Times the DP-SGD loop alone (Opacus wrapping included; the cache and the calibration not)."""

        def _fit_sample(self, *args, **kw):  # noqa: ANN002, ANN003
            t0, c0 = time.perf_counter(), time.process_time()
            super()._fit_sample(*args, **kw)
            self.loop_s = time.perf_counter() - t0
            self.loop_cpu_s = time.process_time() - c0

    n = len(X)
    steps = math.ceil(a.epochs * n / a.batch_size)
    T._calibrated_noise(8.0, 1e-5, a.batch_size / n, steps)  # kept per process: not a step's cost
    est = Timed(
        privacy="sample",
        epsilon=8.0,
        delta=1e-5,
        backbone=a.backbone,
        top_layers=a.top_layers,
        batch_size=a.batch_size,
        epochs=a.epochs,
        random_state=np.random.default_rng(1),
    )
    t0 = time.perf_counter()
    est.fit(X, y)
    fit_s = time.perf_counter() - t0

    net = _Backbone(a.backbone, a.top_layers, 64)
    texts = [t[1] for t in X] + [t[2] for t in X]
    t0 = time.perf_counter()
    net.cache(texts)
    cache_s = time.perf_counter() - t0
    # scoring cost: the pretrained upper layers cost the same as trained ones
    feats = TransformerFeatures(a.backbone, a.top_layers, 64)
    t0 = time.perf_counter()
    feats.transform(texts[: a.score_texts])
    score_s = time.perf_counter() - t0
    return {
        "model": f"transformer ({a.backbone}, top {a.top_layers} layer(s), Opacus DP-SGD)",
        "steps_per_min": 60.0 * est.steps_ / est.loop_s,
        "steps_per_cpu_min": 60.0 * est.steps_ / est.loop_cpu_s,
        "steps": est.steps_,
        "loop_s": est.loop_s,
        "fit_s": fit_s,
        "cache_texts_per_s": len(texts) / cache_s,
        "score_texts_per_s": a.score_texts / score_s,
        "peak_rss_mb": _peak_mb(),
        "trainable_params": int(sum(p.numel() for p in net.top.parameters())),
    }


def run_linear(a: argparse.Namespace) -> dict:
    import numpy as np

    from privalign.estimation.baselines import DPSGDLinear
    from privalign.estimation.features import HashedNgramFeatures

    X, y = _pairs(a.n_pairs)
    fm = HashedNgramFeatures(n_features=4096)
    t0 = time.perf_counter()
    Z = fm.transform_pairs([t[0] for t in X], [t[2] for t in X]) - fm.transform_pairs(
        [t[0] for t in X], [t[1] for t in X]
    )
    feat_s = time.perf_counter() - t0
    import functools

    from privalign.estimation import baselines

    # the fit calibrates its noise (a PLD bisection) before its first step: kept per process and computed
    # here first, so that the fit's time is its steps'
    baselines.calibrate_dpsgd_noise = functools.lru_cache(baselines.calibrate_dpsgd_noise)
    steps = math.ceil(4 * a.epochs * len(X) / a.batch_size)
    baselines.calibrate_dpsgd_noise(8.0, 1e-5, a.batch_size / len(X), steps)
    est = DPSGDLinear(
        epsilon=8.0,
        delta=1e-5,
        batch_size=a.batch_size,
        epochs=4 * a.epochs,
        random_state=np.random.default_rng(1),
    )
    t0, c0 = time.perf_counter(), time.process_time()
    est.fit(Z, y)
    fit_s = time.perf_counter() - t0
    fit_cpu_s = time.process_time() - c0
    texts = [t[1] for t in X] + [t[2] for t in X]
    t0 = time.perf_counter()
    fm.transform(texts[: a.score_texts])
    score_s = time.perf_counter() - t0
    return {
        "model": "linear (hashed n-grams d=4096, DPSGDLinear)",
        "steps_per_min": 60.0 * est.steps_ / fit_s,
        "steps_per_cpu_min": 60.0 * est.steps_ / fit_cpu_s,
        "steps": est.steps_,
        "loop_s": fit_s,
        "fit_s": fit_s,
        "featurise_texts_per_s": 2 * len(X) / feat_s,
        "score_texts_per_s": a.score_texts / score_s,
        "peak_rss_mb": _peak_mb(),
        "trainable_params": 4096,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n-pairs", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--backbone", default="minilm")
    p.add_argument("--top-layers", type=int, default=1)
    p.add_argument("--score-texts", type=int, default=128)
    p.add_argument("--only", choices=("transformer", "linear"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.only:
        res = run_transformer(a) if a.only == "transformer" else run_linear(a)
        print(json.dumps(res))
        return 0
    rows = []
    for which in ("linear", "transformer"):
        cmd = [sys.executable, __file__, "--only", which, *(argv if argv is not None else sys.argv[1:])]
        cmd = [c for c in cmd if c != "--json"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    result = {"rows": rows, "load_average": os.getloadavg(), "args": vars(a)}
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        for r in rows:
            print(
                f"{r['model']}: {r['steps_per_min']:.1f} steps/min "
                f"({r['steps_per_cpu_min']:.1f} per CPU-min), "
                f"peak RSS {r['peak_rss_mb']:.0f} MB, "
                f"scoring {r['score_texts_per_s']:.1f} texts/s"
            )
        print(f"load average {result['load_average']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
