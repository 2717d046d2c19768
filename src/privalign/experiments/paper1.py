"""Paper 1 experiments (private inference-time alignment, arXiv 2608.26324): scaling in N, σ and β
sweeps, ITP vs PrivITP, ε* on synthetic pools, and the fixed-budget session experiment
(:mod:`privalign.experiments.budget`).

The evaluation protocol (spec-inference-time §5.4, defects of §6 fixed) is
:func:`privalign.alignment.simulation.run_protocol` (engineer C): replicates drawn without replacement,
disjoint phase pools for ITP/PrivITP, exact selection laws (PrivITP: closed form given λ̃,
quadrature over λ̃), the fallback credited with a fresh base sample, scores clipped to a public range (the
mechanisms' bounds assume it). This module turns it into experiments: one cell per N (so an interrupted
run resumes at the next N), configs, summaries, figures. The only evaluation done here is the
**PrivBoN-Gaussian** ablation (argmax of r + N(0, σ²), Monte Carlo over ``mc_draws`` noise draws as in the
authors' ``sigma.py``; not calibrated to any ε, so it carries no privacy claim).

Metrics (per method and N): the **lift** = mean over prompts of (E[truth of the selected response] − the
prompt's mean truth), in percentage points for 0/1 correctness; the **expected proxy reward** of the
selected response (in the units of ``transform``); both with standard errors over prompts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from privalign.data.scored_pools import resolve_pool_spec
from privalign.experiments.base import Experiment, ExperimentError, RunContext
from privalign.experiments.config import Field
from privalign.experiments.matching import MATCHINGS, privitp_for
from privalign.experiments.pools import (
    POOL_FIELDS,
    CellProtocol,
    load_scored_pool,
    pool_kind,
    pool_label,
    pool_preflight,
    split_pool,
)
from privalign.experiments.records import fixed_label, is_method, of_method
from privalign.experiments.runner import read_results

__all__ = ["EXPERIMENTS", "gaussian_rnm_outcomes"]

METHODS = ("BoN", "ITP", "PrivBoN", "PrivBoN-Gaussian", "PrivITP")


def _with_defaults(schema: dict[str, Field], **defaults) -> dict[str, Field]:
    s = dict(schema)
    for k, v in defaults.items():
        f = s[k]
        s[k] = Field(f.type, v, f.help, f.choices, f.low)
    return s


def _scaling_schema(**defaults) -> dict[str, Field]:
    s = dict(POOL_FIELDS)
    s.update(
        {
            "n_max_log2": Field(
                "int",
                -1,
                "N grid 2^0 .. 2^n_max_log2; -1 (the default): 12 [authors' code] for a "
                "synthetic pool, else the largest the pool file supports (at most 12)",
                low=-1,
            ),
            "methods": Field("list[str]", ["BoN", "ITP", "PrivBoN", "PrivITP"], "methods", choices=METHODS),
            "betas": Field("list[float]", [0.05], "ITP β values (score units)", low=1e-12),
            "privitp_match": Field(
                "str",
                "worst",
                "how PrivITP is matched to PrivBoN: 'worst' (ε_max(N) at δ = ε), "
                "'expected' (E[ε1+ε2] = ε, not an ε-DP guarantee) or 'sigma' (authors' σ rule: "
                "not equal privacy; uses sigmas_gumbel and privitp_sigmas)",
                choices=MATCHINGS,
            ),
            "epsilons": Field(
                "list[float]",
                [10.0],
                "PrivBoN ε values (and PrivITP's matched target) unless privitp_match = 'sigma'",
                low=1e-12,
            ),
            "privitp_ratio": Field(
                "float", 1.0, "PrivITP σ_Z/σ_X under 'worst'/'expected' matching", low=1e-6
            ),
            "privitp_fixed_N": Field(
                "int",
                16,
                "also run PrivITP at one fixed σ for every N: the σ whose ε_max at this N "
                "equals the first ε (0 = off); P1-3 at fixed noise and P1-8 (E[realised ε] vs N)",
                low=0,
            ),
            "sigmas_gumbel": Field(
                "list[float]",
                [1.0],
                "PrivBoN Gumbel scales σ when privitp_match = 'sigma' (ε_eff = 2Δ_r/σ reported)",
                low=1e-12,
            ),
            "sigmas_gaussian": Field(
                "list[float]", [1.0], "PrivBoN-Gaussian noise std (ablation, K15)", low=1e-12
            ),
            "privitp_sigmas": Field(
                "list[float]",
                [1.0],
                "PrivITP total σ when privitp_match = 'sigma'; σ_X = σ_Z = σ/2",
                low=1e-12,
            ),
            "privitp_beta": Field("float", 0.05, "PrivITP β", low=1e-12),
            "privitp_L": Field("float", 4.0, "PrivITP envelope widening L", low=0.0),
            "privitp_delta": Field("float", 1e-5, "δ of PrivITP's phase-1 Gaussian", low=1e-300),
            "quad_order": Field("int", 4, "Gauss–Legendre order per panel for PrivITP's λ̃ integral", low=1),
            "mc_draws": Field("int", 150, "Monte-Carlo draws of the PrivBoN-Gaussian ablation", low=1),
            "calib_replicates": Field(
                "int", 5, "replicates per calibration prompt ('expected' matching, tuning)", low=1
            ),
        }
    )
    return _with_defaults(s, **defaults)


# ---------------------------------------------------------------------------------------------------
# Scaling family (p1-scaling, p1-sigma-sweep, p1-beta-sweep, p1-itp-vs-privitp)
# ---------------------------------------------------------------------------------------------------


def _privitp_label(match: str, eps: float, delta: float) -> str:
    if match == "worst":
        return f"PrivITP ε_max(N)={eps:g} (δ={delta:g})"
    if match == "expected":
        return f"PrivITP E[ε]={eps:g} (δ={delta:g}; not ε-DP)"
    return f"PrivITP σ-rule at ε={eps:g} (NOT equal privacy)"


def _specs(
    cfg: dict, n: int | None = None, calib=None, ss: np.random.SeedSequence | None = None
) -> list[tuple[str, Any, dict]]:
    """``(method, MethodSpec or Gaussian σ, info)`` for every curve; ``info`` holds the privacy matching of
    PrivBoN/PrivITP curves (target ε, σ's, calibration accuracy)."""
    out: list[tuple[str, Any, dict]] = []  # Any: a MethodSpec, or PrivBoN-Gaussian's σ (a float)
    ss_list = list((ss or np.random.SeedSequence(0)).spawn(len(cfg["epsilons"])))
    for m in cfg["methods"]:
        out += _CURVES[m](cfg, n, calib, ss_list)
    return out


def _bon_curves(cfg: dict, n, calib, ss_list) -> list[tuple[str, Any, dict]]:
    from privalign.alignment.simulation import MethodSpec

    return [("BoN", MethodSpec("bon", label="BoN"), {})]


def _itp_curves(cfg: dict, n, calib, ss_list) -> list[tuple[str, Any, dict]]:
    from privalign.alignment.simulation import MethodSpec

    many = len(cfg["betas"]) > 1
    return [
        ("ITP", MethodSpec("itp", beta=b, label=f"ITP β={b:g}" if many else "ITP"), {}) for b in cfg["betas"]
    ]


def _privbon_curves(cfg: dict, n, calib, ss_list) -> list[tuple[str, Any, dict]]:
    from privalign.alignment.priv_bon import privbon_scale
    from privalign.alignment.simulation import MethodSpec

    out: list[tuple[str, Any, dict]] = []
    if cfg["privitp_match"] == "sigma":
        for s in cfg["sigmas_gumbel"]:
            eps = 2 * cfg["sensitivity"] / s
            out.append(
                (
                    "PrivBoN",
                    MethodSpec("privbon", sigma=s, label=f"PrivBoN σ={s:g} (ε={eps:.3g})"),
                    {"sigma": s, "epsilon_target": eps},
                )
            )
        return out
    for e in cfg["epsilons"]:
        out.append(
            (
                "PrivBoN",
                MethodSpec("privbon", epsilon=e, label=f"PrivBoN ε={e:g}"),
                {"sigma": privbon_scale(e, cfg["sensitivity"]), "epsilon_target": e},
            )
        )
    return out


def _privitp_curves(cfg: dict, n, calib, ss_list) -> list[tuple[str, Any, dict]]:
    from privalign.alignment.simulation import MethodSpec
    from privalign.experiments.matching import MATCH_NOTE

    match = cfg["privitp_match"]
    delta = cfg["privitp_delta"]
    out: list[tuple[str, Any, dict]] = []
    if match == "sigma":
        for s in cfg["privitp_sigmas"]:
            out.append(
                (
                    "PrivITP",
                    MethodSpec(
                        "privitp",
                        beta=cfg["privitp_beta"],
                        sigma_x=s / 2,
                        sigma_z=s / 2,
                        L=cfg["privitp_L"],
                        delta=delta,
                        label=f"PrivITP σ={s:g} (σ rule: NOT equal privacy)",
                    ),
                    {
                        "privacy_match": "sigma",
                        "match_note": MATCH_NOTE["sigma"],
                        "sigma_x": s / 2,
                        "sigma_z": s / 2,
                        "L": cfg["privitp_L"],
                    },
                )
            )
        return out
    if n is None:
        raise ExperimentError(f"PrivITP matched by {match!r} is calibrated per N: the cell's N is required.")
    pool_note = "calibration prompts (disjoint)" if calib is not None else "evaluation prompts"
    for e, sse in zip(cfg["epsilons"], ss_list):
        info = privitp_for(
            cfg, n, e, match, ratio=cfg["privitp_ratio"], L=cfg["privitp_L"], calib=calib, ss=sse
        )
        if match == "expected":
            info["calibrated_on"] = pool_note
        out.append(
            (
                "PrivITP",
                MethodSpec(
                    "privitp",
                    beta=cfg["privitp_beta"],
                    sigma_x=info["sigma_x"],
                    sigma_z=info["sigma_z"],
                    L=info["L"],
                    delta=delta,
                    label=_privitp_label(match, e, delta),
                ),
                {**info, "privacy_match": match, "match_note": MATCH_NOTE[match], "epsilon_target": e},
            )
        )
    if cfg["privitp_fixed_N"]:
        out.append(_privitp_fixed_curve(cfg))
    return out


def _privitp_fixed_curve(cfg: dict) -> tuple[str, Any, dict]:
    from privalign.alignment.simulation import MethodSpec

    info = privitp_for(
        cfg,
        cfg["privitp_fixed_N"],
        cfg["epsilons"][0],
        "worst",
        ratio=cfg["privitp_ratio"],
        L=cfg["privitp_L"],
        calib=None,
        ss=None,
    )
    return (
        fixed_label("privitp"),
        MethodSpec(
            "privitp",
            beta=cfg["privitp_beta"],
            sigma_x=info["sigma_x"],
            sigma_z=info["sigma_z"],
            L=info["L"],
            delta=cfg["privitp_delta"],
            label=f"PrivITP fixed σ_X={info['sigma_x']:.3g} (P1-3, P1-8)",
        ),
        {
            "sigma_x": info["sigma_x"],
            "sigma_z": info["sigma_z"],
            "L": info["L"],
            "privacy_match": f"fixed σ (ε_max({cfg['privitp_fixed_N']}) = {cfg['epsilons'][0]:g})",
            "epsilon_target": None,
        },
    )


def _gaussian_curves(cfg: dict, n, calib, ss_list) -> list[tuple[str, Any, dict]]:
    return [("PrivBoN-Gaussian", float(s), {}) for s in cfg["sigmas_gaussian"]]


#: each display label of ``methods`` → its curves, and the selection method it runs (the Gaussian ablation
#: is one pool, like BoN)
_CURVES = {
    "BoN": _bon_curves,
    "ITP": _itp_curves,
    "PrivBoN": _privbon_curves,
    "PrivBoN-Gaussian": _gaussian_curves,
    "PrivITP": _privitp_curves,
}
_METHOD_OF = {
    "BoN": "bon",
    "ITP": "itp",
    "PrivBoN": "privbon",
    "PrivBoN-Gaussian": "bon",
    "PrivITP": "privitp",
}


def gaussian_rnm_outcomes(
    pool, cfg: dict, n: int, rng: np.random.Generator, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """PrivBoN-Gaussian ablation: per prompt, E[truth − base] and E[score − base] of argmax(r + N(0, σ²)) on
    ``replicates`` subsets of size n (Monte Carlo over ``mc_draws`` noise draws). Scores are the clipped,
    shifted ones the private methods see; returns arrays over the prompts with ≥ n candidates."""
    from privalign.alignment.simulation import prepare_scores

    z, clipped, _ = prepare_scores(
        pool, transform=cfg["transform"], score_range=(cfg["score_low"], cfg["score_high"])
    )
    lifts, proxies = [], []
    for p in range(pool.proxy.shape[0]):
        c = int(pool.counts[p])
        if c < n:
            continue
        cp, zp, tp = clipped[p, :c], z[p, :c], pool.true[p, :c]
        idx = rng.permuted(np.broadcast_to(np.arange(c), (cfg["replicates"], c)), axis=1)[:, :n]
        cnt = np.zeros(idx.shape)
        rows = np.arange(idx.shape[0])
        for _ in range(cfg["mc_draws"]):
            j = np.argmax(cp[idx] + sigma * rng.standard_normal(idx.shape), axis=1)
            cnt[rows, j] += 1.0
        pr = cnt / cfg["mc_draws"]
        lifts.append(float((pr * tp[idx]).sum(1).mean() - tp.mean()))
        proxies.append(float((pr * zp[idx]).sum(1).mean() - zp.mean()))
    return np.array(lifts), np.array(proxies)


def _n_max_log2(cfg: dict, two: bool) -> int:
    """``n_max_log2``, with -1 resolved: 12 for synthetic pools, else the largest k such that the pool's
    largest prompt has 2^k (two-pool methods: 2·2^k) candidates, at most 12."""
    if cfg["n_max_log2"] >= 0:
        return int(cfg["n_max_log2"])
    kind, path = resolve_pool_spec(cfg["pool"])
    if kind != "file" or path is None:
        return 12
    from privalign.data.pools import ScoredPool

    counts = ScoredPool.read(path).counts[: cfg["n_prompts"]]
    usable = int(counts.max()) // (2 if two else 1)
    if usable < 1:
        raise ExperimentError(
            f"Pool {path}: the largest prompt has {int(counts.max())} candidate(s), too few for these "
            "methods."
        )
    return min(12, int(math.floor(math.log2(usable))))


def _scaling_preflight(cfg: dict, ctx: RunContext) -> None:
    from privalign.alignment.selectors import uses_two_pools

    two = any(uses_two_pools(_METHOD_OF[m]) for m in cfg["methods"])
    k = ctx.cache["n_max_log2"] = _n_max_log2(cfg, two)
    pool_preflight(cfg, ctx, min_size=2**k * (2 if two else 1))


def _scaling_cells(cfg: dict, ctx: RunContext) -> list[dict]:
    k = ctx.cache.get("n_max_log2", cfg["n_max_log2"])
    return [{"cell": f"N={2**k}", "N": 2**k} for k in range(k + 1)]


def _finite_or_none(v):
    if v is None:
        return None
    if isinstance(v, list):
        return [_finite_or_none(x) for x in v]
    v = float(v)
    return v if math.isfinite(v) else None


def _scaling_run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    pool, calib = split_pool(load_scored_pool(cfg, ctx), cfg)
    n = cell["N"]
    _, ss_gauss, ss_cal = ss.spawn(3)
    # Common random numbers across N: every N cell draws the same per-prompt permutations (pool A for N is a
    # prefix of the same sequence), so the paired N-to-N differences of the verdicts lose the subset noise
    # they share. Each N's estimate is still a uniform draw without replacement.
    ss_sim = np.random.SeedSequence(cfg["seed"], spawn_key=(2**22,))
    specs = _specs(cfg, n, calib if calib is not None else pool, ss_cal)
    if calib is None:
        for _, _, info in specs:
            if info.get("calibrated_on"):
                info["calibrated_on"] = "evaluation prompts (no calibration set: n_calib_prompts = 0)"
    truth_binary = bool(np.all(np.isin(pool.true[np.isfinite(pool.proxy)], (0.0, 1.0))))
    scale = 100.0 if truth_binary else 1.0
    truth = "accuracy" if truth_binary else "true_reward"  # what the lifts measure (their unit)
    label, kind = pool_label(cfg), pool_kind(cfg)
    out: list[dict] = []
    c_specs = [(m, s, info) for m, s, info in specs if not isinstance(s, float)]  # (a float: Gaussian's σ)
    if c_specs:
        res = CellProtocol.from_config(cfg).run(
            pool,
            [s for _, s, _ in c_specs],
            n=n,
            replicates=cfg["replicates"],
            random_state=ss_sim,
            per_prompt=True,
        )
        for (method, _, info), m in zip(c_specs, res["methods"]):
            priv = m["privacy"]
            rec = {
                "method": method,
                "variant": m["name"],
                "N": n,
                "n_prompts": res["n_prompts"],
                "truth_kind": truth,
                "pool_label": label,
                "pool_kind": kind,
                "replicates": cfg["replicates"],
                "lift": scale * m["true_lift"][0],
                "lift_se": scale * m["true_lift_se"][0],
                "lift_pp": [scale * v[0] for v in m["true_lift_per_prompt"]],
                "prompts": res["prompt_index"],
                "proxy": m["proxy"][0] - res["base_proxy"],
                "proxy_se": m["proxy_se"][0],
                "epsilon": _finite_or_none(priv.get("epsilon")),
                "guarantee": priv.get("guarantee"),
                **{k: _finite_or_none(v) if isinstance(v, float) else v for k, v in info.items()},
            }
            if "expected_epsilon2_per_prompt" in m:  # PrivITP's ex-post accounting
                e2 = (priv.get("expected_epsilon2_realized") or [None])[0]
                e2_pp = [_finite_or_none(priv["epsilon1"] + v[0]) for v in m["expected_epsilon2_per_prompt"]]
                rec.update(
                    epsilon1=priv["epsilon1"],
                    delta=priv["delta"],
                    epsilon_max=_finite_or_none(priv["epsilon_max"][0]),
                    expected_epsilon_realized=None if e2 is None else _finite_or_none(priv["epsilon1"] + e2),
                    expected_epsilon_pp=e2_pp,
                )
            out.append(rec)
    rng = np.random.default_rng(ss_gauss)
    for method, sigma, _ in [x for x in specs if isinstance(x[1], float)]:
        lifts, proxies = gaussian_rnm_outcomes(pool, cfg, n, rng, sigma)
        k = len(lifts)
        out.append(
            {
                "method": method,
                "variant": f"PrivBoN-Gaussian σ={sigma:g}",
                "N": n,
                "n_prompts": k,
                "truth_kind": truth,
                "pool_label": label,
                "pool_kind": kind,
                "lift": scale * float(lifts.mean()) if k else None,
                "lift_se": scale * float(lifts.std(ddof=1) / math.sqrt(k)) if k > 1 else None,
                "proxy": float(proxies.mean()) if k else None,
                "proxy_se": float(proxies.std(ddof=1) / math.sqrt(k)) if k > 1 else None,
                "epsilon": None,
                "guarantee": "not calibrated (ablation, K15)",
            }
        )
    return out


def _scaling_summarize(records: list[dict], cfg: dict) -> dict:
    by: dict[str, list[dict]] = {}
    for r in records:
        if r.get("lift") is not None:
            by.setdefault(r["variant"], []).append(r)
    table = []
    for name, rows in sorted(by.items()):
        rows.sort(key=lambda r: r["N"])
        best = max(rows, key=lambda r: r["lift"])
        last = rows[-1]
        table.append(
            {
                "variant": name,
                "N_max": last["N"],
                "lift_at_N_max": last["lift"],
                "se": last["lift_se"],
                "best_N": best["N"],
                "best_lift": best["lift"],
                "epsilon (PrivBoN)": last.get("epsilon"),
                "epsilon_max (PrivITP)": last.get("epsilon_max"),
                "E[realized ε] (PrivITP)": last.get("expected_epsilon_realized"),
                "privacy_match": last.get("privacy_match"),
            }
        )
    kind = records[0]["truth_kind"] if records else "accuracy"
    return {
        "table": table,
        "truth_kind": kind,
        "pool": records[0].get("pool_label") if records else None,
        "privitp_match": cfg.get("privitp_match"),
        "lift_unit": "percentage points" if kind == "accuracy" else "true-reward units",
        "n_prompts": max((r["n_prompts"] for r in records), default=0),
    }


def _legend_name(rows: list[dict]) -> str:
    """A curve's legend entry naming its privacy: ε (PrivBoN), ε_max and E[ε] at the largest N (PrivITP)."""
    last = max(rows, key=lambda r: r["N"])
    name = last["variant"]
    if is_method(last, "bon", "itp"):
        return f"{name} (ε = ∞)"
    if is_method(last, "privbon") and last.get("epsilon") is not None:
        return name if "ε=" in name else f"{name} (ε={last['epsilon']:.3g})"
    if last.get("epsilon_max") is not None:
        e = last.get("expected_epsilon_realized")
        return (
            f"{name}; at N={last['N']}: ε_max={last['epsilon_max']:.3g}, E[ε]={e:.3g}"
            if e is not None
            else f"{name}; ε_max={last['epsilon_max']:.3g} at N={last['N']}"
        )
    return name


def _scaling_plot_factory(stem: str, title: str):
    def plot(run_dir: Path) -> list[str]:
        from privalign.experiments.plotting import errorbar_series, group_series, new_figure, save_figure

        recs = read_results(run_dir)
        if not recs:
            return []
        kind = recs[0]["truth_kind"]
        main = [r for r in recs if r["method"] != fixed_label("privitp")]
        names: dict[str, list[dict]] = {}
        for r in main:
            names.setdefault(r["variant"], []).append(r)
        labels = {k: _legend_name(v) for k, v in names.items()}
        priv = [r for r in recs if r.get("epsilon_max") is not None]
        fig, axes = new_figure(3 if priv else 2, 1, width=5.6, height=4.4)
        ax1, ax2 = axes[0], axes[1]
        s1 = group_series(main, "variant", "N", "lift", "lift_se")
        s2 = group_series(main, "variant", "N", "proxy", "proxy_se")
        errorbar_series(ax1, {labels[k]: v for k, v in s1.items()})
        errorbar_series(ax2, {labels[k]: v for k, v in s2.items()})
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("N (candidates per prompt, log scale)")
        for ax in (ax1, ax2):
            ax.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
        ax1.set_ylabel(
            "accuracy lift (percentage points)" if kind == "accuracy" else "true-reward lift over base"
        )
        ax2.set_ylabel("expected proxy reward minus base")
        pool = recs[0].get("pool_label", "")
        ax1.set_title(f"{title}: true objective\n[{pool}]", fontsize=10)
        ax2.set_title(f"{title}: proxy reward", fontsize=10)
        if priv:
            ax3 = axes[2]
            by: dict[str, list[dict]] = {}
            for r in priv:
                by.setdefault(r["variant"], []).append(r)
            for k, (name, rows) in enumerate(sorted(by.items())):
                rows.sort(key=lambda r: r["N"])
                xs = [r["N"] for r in rows]
                c = f"C{k + 2}"
                ax3.plot(
                    xs, [r["epsilon_max"] for r in rows], "--", color=c, marker="D", label=f"{name}: ε_max(N)"
                )
                ax3.plot(
                    xs,
                    [r["expected_epsilon_realized"] for r in rows],
                    "-",
                    color=c,
                    marker="o",
                    label=f"{name}: E[realised ε]",
                )
            for e in sorted({r["epsilon"] for r in of_method(recs, "privbon") if r.get("epsilon")}):
                ax3.axhline(e, color="#ff7f0e", linewidth=0.9, linestyle=":", label=f"PrivBoN ε = {e:g}")
            ax3.set_yscale("log")
            ax3.set_ylabel("PrivITP privacy loss ε (log scale)")
            ax3.set_title("PrivITP: worst case ε_max(N) and expected realised ε", fontsize=10)
            ax3.legend(loc="best", fontsize=6, framealpha=0.85)
        fig.legend(
            *ax1.get_legend_handles_labels(),
            loc="lower center",
            ncol=2,
            fontsize=7,
            framealpha=0.85,
            title="error bars: ±1 SE over prompts",
            title_fontsize=7,
        )
        fig.tight_layout(rect=(0, 0.16, 1, 1))
        return [save_figure(fig, run_dir, stem)]

    return plot


# ---------------------------------------------------------------------------------------------------
# ε* on synthetic pools
# ---------------------------------------------------------------------------------------------------

#: Where the ε* experiment's σ_reg comes from (recorded in every result row, the summary and the figure).
SIGMA_REG_SOURCE = (
    "offline: estimated from the served pool's clipped private proxy scores and true rewards "
    "(data-dependent noise scale; not a private release)"
)


def _epsstar_schema() -> dict[str, Field]:
    s = dict(POOL_FIELDS)
    s.update(
        {
            "N": Field("int", 64, "candidates per prompt", low=1),
            "epsilons": Field(
                "list[float]", [0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256], "PrivBoN ε grid", low=1e-12
            ),
            "star_multipliers": Field(
                "list[float]",
                [0.125, 0.25, 0.5, 1.0, 1.5, 2.0, 4.0],
                "extra ε = m·ε* (finer grid around ε*, from the calibration prompts)",
                low=1e-9,
            ),
        }
    )
    return _with_defaults(s, n_calib_prompts=20)


def _epsstar_preflight(cfg: dict, ctx: RunContext) -> None:
    if cfg["pool"] != "synthetic":
        raise ExperimentError(
            "p1-epsilon-star needs pool = 'synthetic' (ε* needs the known ε_RM and coverage)."
        )
    pool_preflight(cfg, ctx, min_size=cfg["N"])


def _epsstar_cells(cfg: dict, ctx: RunContext) -> list[dict]:
    from privalign.alignment.simulation import prepare_scores
    from privalign.alignment.theory import estimate_theory

    pool, calib = split_pool(load_scored_pool(cfg, ctx), cfg)
    tp = calib if calib is not None else pool
    _, clipped, _ = prepare_scores(
        tp, transform=cfg["transform"], score_range=(cfg["score_low"], cfg["score_high"])
    )
    e_star = estimate_theory(clipped, tp.true, sensitivity=cfg["sensitivity"])["epsilon_star"]
    grid = sorted(
        set(cfg["epsilons"])
        | ({float(f"{m * e_star:.6g}") for m in cfg["star_multipliers"]} if math.isfinite(e_star) else set())
    )
    return [{"cell": f"eps={e:g}", "epsilon": e} for e in grid] + [{"cell": "eps=inf", "epsilon": None}]


def _epsstar_run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    """Two PrivBoN curves: σ = 2Δ_r/ε (plain), and σ = max(2Δ_r/ε, σ_reg) (the spec's implementation
    rule, ε_eff = 2Δ_r/σ reported), with σ_reg = ε_RM/√C from the known pool quantities.

    Offline study, not a private release: σ_reg is estimated from the clipped *private proxy* scores of
    the very pool being served (and its true rewards), then used as a PrivBoN noise scale, so the
    "σ_reg" curve's noise scale depends on the private data (``sigma_reg_source`` in every row says so).
    A deployment would need σ_reg from public data or a separately accounted estimate."""
    from privalign.alignment.priv_bon import privbon_scale
    from privalign.alignment.simulation import MethodSpec, prepare_scores
    from privalign.alignment.theory import estimate_theory

    pool, calib = split_pool(load_scored_pool(cfg, ctx), cfg)
    eps = cell["epsilon"]
    theory_pool = calib if calib is not None else pool
    _, clipped, _ = prepare_scores(
        theory_pool, transform=cfg["transform"], score_range=(cfg["score_low"], cfg["score_high"])
    )
    th = estimate_theory(clipped, theory_pool.true, sensitivity=cfg["sensitivity"])
    source = (
        f"{theory_pool.proxy.shape[0]} calibration prompts disjoint from the evaluation prompts"
        if calib is not None
        else SIGMA_REG_SOURCE
    )
    sigma_plain = 0.0 if eps is None else privbon_scale(eps, cfg["sensitivity"])
    sigma_rule = max(sigma_plain, th["sigma_reg"])
    specs = [
        MethodSpec("privbon", sigma=sigma_plain, label="PrivBoN σ=2Δ/ε"),
        MethodSpec("privbon", sigma=sigma_rule, label="PrivBoN σ=max(2Δ/ε, σ_reg)"),
    ]
    res = CellProtocol.from_config(cfg).run(
        pool, specs, n=cfg["N"], replicates=cfg["replicates"], random_state=ss, per_prompt=True
    )
    idx = res["prompt_index"]
    best_p = np.array([float(np.nanmax(pool.true[p, : pool.counts[p]])) for p in idx])
    base_p = np.array([float(np.mean(pool.true[p, : pool.counts[p]])) for p in idx])
    j_star = float(best_p.mean())  # π*: the best-true-reward policy on each pool
    out = []
    for variant, sigma, m in zip(("plain", "sigma_reg"), (sigma_plain, sigma_rule), res["methods"]):
        # SE of the regret = SE of the lift (J(π*) and the base mean are fixed per prompt)
        regret_pp = (best_p - base_p - np.array([v[0] for v in m["true_lift_per_prompt"]])).tolist()
        out.append(
            {
                "variant": variant,
                "label": m["name"],
                "epsilon": eps,
                "sigma": sigma,
                "epsilon_effective": None if sigma == 0 else 2 * cfg["sensitivity"] / sigma,
                "N": cfg["N"],
                "regret": j_star - m["true_value"][0],
                "regret_se": m["true_lift_se"][0],
                "regret_pp": regret_pp,
                "prompts": idx,
                "pool_label": pool_label(cfg),
                "n_prompts": res["n_prompts"],
                "eps_rm": th["eps_rm"],
                "coverage": th["coverage"],
                "sensitivity": cfg["sensitivity"],
                "eps_star": th["epsilon_star"],
                "sigma_reg": th["sigma_reg"],
                "sigma_reg_source": source,
                "skyline": 0.25 * math.sqrt(th["coverage"] * th["eps_rm"] ** 2),
            }
        )
    return out


def _epsstar_summarize(records: list[dict], cfg: dict) -> dict:
    fin = sorted([r for r in records if r["epsilon"] is not None], key=lambda r: (r["variant"], r["epsilon"]))
    inf = [r for r in records if r["epsilon"] is None and r["variant"] == "plain"]
    if not fin:
        return {}
    plain = [r for r in fin if r["variant"] == "plain"]
    best = min(plain, key=lambda r: r["regret"])
    return {
        "eps_star": fin[0]["eps_star"],
        "sigma_reg": fin[0]["sigma_reg"],
        "sigma_reg_source": fin[0].get("sigma_reg_source", SIGMA_REG_SOURCE),
        "skyline": fin[0]["skyline"],
        "eps_rm": fin[0]["eps_rm"],
        "coverage": fin[0]["coverage"],
        "best_epsilon_on_grid_plain": best["epsilon"],
        "best_regret_plain": best["regret"],
        "regret_bon": inf[0]["regret"] if inf else None,
        "table": [
            {"curve": r["label"], "epsilon": r["epsilon"], "regret": r["regret"], "se": r["regret_se"]}
            for r in fin
        ],
    }


def _epsstar_plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    recs = read_results(run_dir)
    fin = [r for r in recs if r["epsilon"] is not None]
    inf = [r for r in recs if r["epsilon"] is None and r["variant"] == "plain"]
    if not fin:
        return []
    fig, (ax,) = new_figure(1, 1, width=6.6, height=4.4)
    for variant, st in (("plain", {**STYLE["PrivBoN"]}), ("sigma_reg", {"color": "#2ca02c", "marker": "D"})):
        rows = sorted([r for r in fin if r["variant"] == variant], key=lambda r: r["epsilon"])
        if rows:
            ax.errorbar(
                [r["epsilon"] for r in rows],
                [r["regret"] for r in rows],
                yerr=[r["regret_se"] for r in rows],
                label=f"{rows[0]['label']} (N = {rows[0]['N']})",
                capsize=3,
                **st,
            )
    r0 = fin[0]
    ax.axvline(
        r0["eps_star"], color="black", linestyle="--", label=f"ε* = 2Δ_r√C/ε_RM = {r0['eps_star']:.3g}"
    )
    ax.axhline(
        r0["skyline"], color="#1f77b4", linestyle=":", label=f"skyline ¼√(C·ε_RM²) = {r0['skyline']:.3f}"
    )
    if inf:
        ax.axhline(
            inf[0]["regret"],
            color=STYLE["BoN"]["color"],
            linestyle="-.",
            label=f"BoN (ε = ∞): {inf[0]['regret']:.3f}",
        )
    ax.set_xscale("log")
    ax.set_xlabel("privacy budget ε per query (log scale)")
    ax.set_ylabel("regret  J(π*) − J(π̂)")
    ax.set_title("PrivBoN regret vs ε (synthetic pool, known ε_RM and C)")
    ax.legend(
        loc="best", framealpha=0.85, fontsize=8, title="error bars: ±1 SE over prompts", title_fontsize=8
    )
    src = r0.get("sigma_reg_source", SIGMA_REG_SOURCE)
    fig.text(
        0.01,
        0.005,
        f"ε*, ε_RM, C and σ_reg estimated from {src[:110]}; σ_reg curve: offline study, "
        "not a private release.",
        fontsize=7,
        color="#555555",
        ha="left",
        va="bottom",
    )
    fig.subplots_adjust(bottom=0.16)
    return [save_figure(fig, run_dir, "epsilon_star")]


EXPERIMENTS: dict[str, Experiment] = {
    "p1-scaling": Experiment(
        "p1-scaling",
        "Accuracy lift and proxy reward vs N: BoN, ITP, PrivBoN, PrivITP",
        "paper1",
        _scaling_schema(),
        _scaling_preflight,
        _scaling_cells,
        _scaling_run_cell,
        _scaling_summarize,
        _scaling_plot_factory("scaling", "BoN / ITP / PrivBoN / PrivITP"),
    ),
    "p1-scaling-imdb": Experiment(
        "p1-scaling-imdb",
        "Lift and proxy reward vs N on the shipped IMDb pool (real SmolLM2 generations): BoN, "
        "ITP, PrivBoN, PrivITP",
        "paper1",
        _scaling_schema(
            pool="shipped",
            n_prompts=64,
            n_max_log2=8,
            transform="global_z",
            score_low=-3.0,
            score_high=3.0,
            sensitivity=6.0,
            replicates=20,
        ),
        _scaling_preflight,
        _scaling_cells,
        _scaling_run_cell,
        _scaling_summarize,
        _scaling_plot_factory("scaling", "BoN / ITP / PrivBoN / PrivITP"),
    ),
    "p1-sigma-sweep": Experiment(
        "p1-sigma-sweep",
        "PrivBoN σ sweep (Gumbel and Gaussian report-noisy-max) vs BoN",
        "paper1",
        _scaling_schema(
            methods=["BoN", "PrivBoN", "PrivBoN-Gaussian"],
            sigmas_gumbel=[0.5, 0.75, 1.0, 1.25, 1.5, 2.0],
            sigmas_gaussian=[0.5, 1.0, 2.0],
            privitp_match="sigma",
        ),
        _scaling_preflight,
        _scaling_cells,
        _scaling_run_cell,
        _scaling_summarize,
        _scaling_plot_factory("sigma_sweep", "PrivBoN σ sweep"),
    ),
    "p1-beta-sweep": Experiment(
        "p1-beta-sweep",
        "ITP β sweep vs BoN",
        "paper1",
        _scaling_schema(
            methods=["BoN", "ITP"], betas=[0.0005, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0], privitp_match="sigma"
        ),
        _scaling_preflight,
        _scaling_cells,
        _scaling_run_cell,
        _scaling_summarize,
        _scaling_plot_factory("beta_sweep", "ITP β sweep"),
    ),
    "p1-itp-vs-privitp": Experiment(
        "p1-itp-vs-privitp",
        "ITP vs PrivITP across noise levels (disjoint phase pools)",
        "paper1",
        _scaling_schema(methods=["ITP", "PrivITP"], privitp_sigmas=[0.5, 1.5, 4.0], privitp_match="sigma"),
        _scaling_preflight,
        _scaling_cells,
        _scaling_run_cell,
        _scaling_summarize,
        _scaling_plot_factory("itp_vs_privitp", "ITP vs PrivITP"),
    ),
    "p1-epsilon-star": Experiment(
        "p1-epsilon-star",
        "PrivBoN regret vs ε with the critical budget ε* marked (synthetic; "
        "the σ_reg curve is an offline study, not a private release)",
        "paper1",
        _epsstar_schema(),
        _epsstar_preflight,
        _epsstar_cells,
        _epsstar_run_cell,
        _epsstar_summarize,
        _epsstar_plot,
    ),
}
