"""Rate experiments on synthetic sparse BTL data: ‖θ̂ − θ*‖₂² versus n, d, s* and ε for every estimator.

The claim to show (spec-reward-estimation.md §8): the sparse private estimators'
error barely grows with d while DP-SGD and dense RR grow with d, and Label-DP (RR-IHT) beats Sample-DP
(Sample-DP IHT) at equal ε. **The guarantees differ**: label-DP protects only labels (features public),
sample-DP protects whole comparisons; plots say so in the legend.

Seeds: every (scan, value, repetition) problem and every estimator gets a child of one
``numpy.random.SeedSequence(entropy)``; the entropy is stored in ``results.json``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

import privalign.estimation.registry as registry
from privalign._json import to_jsonable
from privalign.errors import PrivacyParameterError
from privalign.rng import entropy_int

__all__ = ["METHODS", "make_estimator", "run_rates", "fit_slopes", "plot_rates", "RATE_GRIDS"]

#: The estimators' short spellings (each class's first alias: ``mle``, ``iht``, ``dp-iht``, ``rr-iht``,
#: ``rr``, ``dp-sgd``), the scans' default; any spelling of :func:`privalign.estimation.registry.spellings`
#: is accepted.
METHODS = tuple(registry.short_name(n) for n in registry.names())
#: The legend's privacy text of each privacy kind.
_KIND_TEXT = {"none": "(non-private)", "label": "[label-DP ε]", "sample": "[sample-DP (ε,δ)]"}


def label(method: str) -> str:
    """The legend label of ``method``: its class's title and what it protects (``RR-IHT [label-DP ε]``)."""
    return f"{registry.estimator_class(method).title} {_KIND_TEXT[registry.privacy_kind(method)]}"


#: The base rate problem (d = 200, s* = 5, ε = 8 at the base point; n up to 128k). DP-SGD's
#: hyper-parameters for it (``overrides``) were chosen on independent synthetic draws (seeds 0–1, estimator
#: seeds 100–101; est's notes): clip norm C = 1 clips every per-example gradient (‖x‖₂ ≈ 8 at d = 200) and
#: biases the fixed point (error ≈ 4 at every n), so C = 8, batch 1024, 10 epochs, noise-aware η
#: (``auto_learning_rate``), tail averaging.
RATE_GRIDS: dict[str, dict[str, Any]] = {
    "full": {
        "base": {"n": 8000, "d": 200, "s_star": 5, "epsilon": 8.0},
        "n": [2000, 8000, 32000, 128000],
        "d": [200, 800, 3200],
        "s_star": [2, 5, 10, 20],
        "epsilon": [0.5, 1.0, 2.0, 4.0, 8.0],
        "reps": 3,
        "d_scan_n": 8000,
        "overrides": {
            "dp-sgd": {"clip_norm": 8.0, "batch_size": 1024, "epochs": 10.0, "learning_rate": None}
        },
    },
    "quick": {
        "base": {"n": 2000, "d": 100, "s_star": 4, "epsilon": 8.0},
        "n": [500, 2000],
        "d": [50, 200],
        "s_star": [2, 4],
        "epsilon": [1.0, 8.0],
        "reps": 1,
        "d_scan_n": 1000,
        "overrides": {"dp-sgd": {"clip_norm": 8.0, "batch_size": 256, "epochs": 10.0, "learning_rate": None}},
    },
}


#: ‖0 − θ*‖² = ‖θ*‖² = 3² of make_btl's default: the error of the estimator that learns nothing.
ZERO_ESTIMATOR_ERROR = 9.0


def make_estimator(
    method: str,
    *,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    sparsity: int = 16,
    feature_bound: float = 1.0,
    random_state: Any = None,
    **overrides: Any,
) -> Any:
    """Build the estimator behind a CLI/experiment method name with privalign's defaults.

    Args:
      method: an estimator's name or alias (:func:`privalign.estimation.registry.spellings`): ``mle``,
        ``iht``, ``dp-iht`` (SampleDPIHT), ``rr-iht`` (RRIHT), ``rr`` (DenseRR), ``dp-sgd`` (DPSGDLinear), or
        a registered one.
      epsilon, delta, sparsity, feature_bound, random_state: passed where the estimator has them.
      overrides: further constructor parameters (e.g. ``step_size``).
    """
    est = registry.make_estimator(
        method,
        epsilon=epsilon,
        delta=delta,
        sparsity=sparsity,
        feature_bound=feature_bound,
        random_state=random_state,
    )
    valid = set(est.get_params())
    est.set_params(**{k: v for k, v in overrides.items() if k in valid})
    return est


def fit_slopes(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) on log(x) (NaN if fewer than two positive points)."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    ok = (x > 0) & (y > 0) & np.isfinite(y)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def run_rates(
    out_dir: str | os.PathLike,
    *,
    quick: bool = False,
    methods: tuple[str, ...] = METHODS,
    entropy: int | None = None,
    grid: dict[str, Any] | None = None,
    delta: float = 1e-5,
    progress: bool = True,
    plot: bool = True,
) -> dict[str, Any]:
    """Run the four scans (n, d, s*, ε), write ``results.json`` and ``rates.png`` into ``out_dir``.

    Args:
      out_dir: output directory (created).
      quick: use the small ``RATE_GRIDS["quick"]`` grid (CI/smoke) instead of ``"full"``.
      methods: subset of ``METHODS``.
      entropy: SeedSequence entropy (default: fresh, recorded).
      grid: a custom grid with the keys of ``RATE_GRIDS["full"]`` (overrides ``quick``).
      delta: δ for the sample-DP methods.
      progress: show a tqdm bar on stderr.
      plot: also write ``rates.png``.

    Returns:
      The results dict (as written): ``rows`` (one per fit: scan, value, rep, method, error, seconds),
      ``summary`` (mean and standard error per scan/value/method), ``slopes`` (log-log slope per
      scan/method), ``config`` and ``entropy``.
    """
    from privalign.estimation.synthetic import make_btl

    for m in methods:
        registry.check_name(m, "methods")
    g = grid if grid is not None else RATE_GRIDS["quick" if quick else "full"]
    ss = np.random.SeedSequence(entropy)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, Any, dict[str, Any]]] = []
    for scan in ("n", "d", "s_star", "epsilon"):
        for value in g[scan]:
            cfg = dict(g["base"])
            if scan == "d":
                cfg["n"] = g["d_scan_n"]
            cfg[scan] = value
            jobs.append((scan, value, cfg))
    total = len(jobs) * int(g["reps"]) * len(methods)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="rates", leave=False)
    rows: list[dict[str, Any]] = []
    # the grid's per-estimator overrides, keyed by any spelling
    overrides = {registry.canonical(k): v for k, v in g.get("overrides", {}).items()}
    job_seeds = ss.spawn(len(jobs))
    for (scan, value, cfg), js in zip(jobs, job_seeds):
        for rep, rs in enumerate(js.spawn(int(g["reps"]))):
            data_seed, *est_seeds = rs.spawn(1 + len(methods))
            prob = make_btl(cfg["n"], cfg["d"], cfg["s_star"], random_state=np.random.default_rng(data_seed))
            for method, es in zip(methods, est_seeds):
                est = make_estimator(
                    method,
                    epsilon=cfg["epsilon"],
                    delta=delta,
                    sparsity=cfg["s_star"],
                    random_state=np.random.default_rng(es),
                    **overrides.get(registry.canonical(method), {}),
                )
                t0 = time.perf_counter()
                est.fit(prob.X, prob.y)
                dt = time.perf_counter() - t0
                rows.append(
                    {
                        "scan": scan,
                        "value": value,
                        "rep": rep,
                        "method": method,
                        "unit": registry.privacy_kind(method),
                        "n": cfg["n"],
                        "d": cfg["d"],
                        "s_star": cfg["s_star"],
                        "epsilon": cfg["epsilon"],
                        "sq_error": prob.squared_error(est.coef_),
                        "seconds": dt,
                        "event": est.privacy_event_.to_dict(),
                    }
                )
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    summary: list[dict[str, Any]] = []
    slopes: dict[str, dict[str, float]] = {}
    for scan in ("n", "d", "s_star", "epsilon"):
        slopes[scan] = {}
        for method in methods:
            xs, ys = [], []
            for value in g[scan]:
                errs = [
                    r["sq_error"]
                    for r in rows
                    if r["scan"] == scan and r["value"] == value and r["method"] == method
                ]
                mean = float(np.mean(errs))
                se = float(np.std(errs, ddof=1) / math.sqrt(len(errs))) if len(errs) > 1 else float("nan")
                summary.append(
                    {
                        "scan": scan,
                        "value": value,
                        "method": method,
                        "mean_sq_error": mean,
                        "se": se,
                        "reps": len(errs),
                        "below_zero_estimator": bool(mean < ZERO_ESTIMATOR_ERROR),
                    }
                )
                xs.append(float(value))
                ys.append(mean)
            slopes[scan][method] = fit_slopes(xs, ys)
    result = {
        "config": {k: v for k, v in g.items()},
        "entropy": entropy_int(ss),
        "delta": delta,
        "methods": list(methods),
        "rows": rows,
        "summary": summary,
        "slopes": slopes,
        "theta_norm": 3.0,
        "zero_estimator_error": ZERO_ESTIMATOR_ERROR,
        "design": "uniform[-1,1]^d",
    }
    (out / "results.json").write_text(json.dumps(to_jsonable(result), indent=1, allow_nan=False))
    if plot:
        plot_rates(result, out / "rates.png")
    return result


def plot_rates(result: dict[str, Any], path: str | os.PathLike) -> Path:
    """Four log-log panels (error vs n, d, s*, ε), one line per method, slopes in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not result.get("summary"):
        raise PrivacyParameterError("The 'result' parameter has no summary rows to plot.")
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    base = result["config"]["base"]
    titles = {
        "n": f"vs n (d={base['d']}, s*={base['s_star']}, ε={base['epsilon']})",
        "d": f"vs d (n={result['config']['d_scan_n']}, s*={base['s_star']}, ε={base['epsilon']})",
        "s_star": f"vs s* (n={base['n']}, d={base['d']}, ε={base['epsilon']})",
        "epsilon": f"vs ε (n={base['n']}, d={base['d']}, s*={base['s_star']})",
    }
    for ax, scan in zip(axes, ("n", "d", "s_star", "epsilon")):
        for method in result["methods"]:
            pts = [r for r in result["summary"] if r["scan"] == scan and r["method"] == method]
            xs = [p["value"] for p in pts]
            ys = [p["mean_sq_error"] for p in pts]
            es = [
                0.0 if (p["se"] is None or (isinstance(p["se"], float) and math.isnan(p["se"]))) else p["se"]
                for p in pts
            ]
            slope = result["slopes"][scan][method]
            slope_txt = (
                "n/a"
                if slope is None or (isinstance(slope, float) and math.isnan(slope))
                else f"{slope:+.2f}"
            )
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=f"{label(method)} (slope {slope_txt})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(titles[scan], fontsize=9)
        ax.set_xlabel(scan)
        ax.set_ylabel("‖θ̂ − θ*‖²")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(
        "Sparse BTL rates; label-DP (RR) and sample-DP ((ε,δ)) curves share the ε axis but protect different "
        "units"
    )
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.12, top=0.86, wspace=0.25)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
