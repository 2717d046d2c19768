"""p1-budget: the fixed-budget session experiment (paper 1's "FSRC" composition claim; authors'
``fsrc_composition/fsrc.py``, spec-inference-time §5.6), done with a reserve → settle filter.

Prompts are served one by one through :func:`privalign.alignment.session.run_session` (engineer C):
each prompt reserves the selector's data-independent worst case, runs, and settles its realized cost;
the first refusal ends the session before any data of that prompt is read (no overshoot, unlike a
run-then-check loop; the reservation is a true worst case over λ̃). Compared, per σ and seed:

* **PrivITP under the ex-post filter** (realized ε1(δ) + ε2(t; λ̃) charged) vs **basic composition**
  ``T_basic = ⌊ε_total/ε_max⌋`` of the same worst case;
* **PrivBoN** at a fixed per-query ε under a **pure-ε filter** (Σ ε ≤ ε_total) and a **zCDP filter**
  (Σ ε²/8 ≤ ρ with ρ the largest whose conversion is ≤ ε_total at δ_total), side by side.

Every row records the filter's spent budget; the plot shows the cumulative realized ε against the
budget line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from privalign.experiments.base import Experiment, RunContext
from privalign.experiments.config import Field
from privalign.experiments.pools import POOL_FIELDS, load_scored_pool, pool_label, pool_preflight
from privalign.experiments.runner import read_results

__all__ = ["EXPERIMENTS"]


def _schema() -> dict[str, Field]:
    s = dict(POOL_FIELDS)
    s.update(
        {
            "n": Field("int", 16, "candidates per phase pool (PrivITP) / per query (PrivBoN)", low=1),
            "sigmas": Field("list[float]", [2.0, 4.0, 8.0], "PrivITP total σ; σ_X = σ_Z = σ/2", low=1e-12),
            "beta": Field("float", 0.05, "PrivITP β", low=1e-12),
            "L": Field("float", 0.5, "PrivITP envelope widening L", low=0.0),
            "delta_per_prompt": Field("float", 1e-7, "δ of each PrivITP phase-1 Gaussian", low=1e-300),
            "budget_epsilon": Field("float", 50.0, "total ε of the session", low=1e-12),
            "budget_delta": Field("float", 1e-4, "total δ of the session", low=0.0),
            "privbon_epsilon": Field("float", 1.0, "PrivBoN ε per query", low=1e-12),
            "n_seeds": Field("int", 10, "independent sessions (prompt orders and noise) per σ", low=1),
        }
    )
    return s


def _preflight(cfg: dict, ctx: RunContext) -> None:
    pool_preflight(cfg, ctx, min_size=2 * cfg["n"] + 1)


def _cells(cfg: dict, ctx: RunContext) -> list[dict]:
    cells = [
        {"cell": f"privitp sigma={s:g} seed={k}", "kind": "privitp", "sigma": s, "seed_index": k}
        for s in cfg["sigmas"]
        for k in range(cfg["n_seeds"])
    ]
    cells += [
        {"cell": f"privbon seed={k}", "kind": "privbon", "seed_index": k} for k in range(cfg["n_seeds"])
    ]
    return cells


def _shuffled(pool, rng: np.random.Generator):
    from privalign.data.pools import ScoredPool

    order = rng.permutation(pool.proxy.shape[0])  # data-independent prompt order
    return ScoredPool(
        pool.proxy[order],
        pool.true[order],
        pool.counts[order],
        tuple(pool.prompts[i] for i in order) if pool.prompts else (),
    )


def _run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.alignment.simulation import prepare_scores
    from privalign.data.pools import ScoredPool

    base = load_scored_pool(cfg, ctx)
    _, clipped, r_max = prepare_scores(
        base, transform=cfg["transform"], score_range=(cfg["score_low"], cfg["score_high"])
    )
    scored = ScoredPool(clipped, base.true, base.counts, base.prompts)
    ss_order, ss_run = ss.spawn(2)
    pool = _shuffled(scored, np.random.default_rng(ss_order))
    total = pool.proxy.shape[0]
    common = {
        "seed_index": cell["seed_index"],
        "budget_epsilon": cfg["budget_epsilon"],
        "budget_delta": cfg["budget_delta"],
        "n": cfg["n"],
        "pool_prompts": total,
    }
    return _CELLS[cell["kind"]](cell, cfg, pool, r_max, common, np.random.default_rng(ss_run))


def _privitp_cell(cell: dict, cfg: dict, pool, r_max: float, common: dict, rng) -> list[dict]:
    """PrivITP under the ex-post filter, and what basic composition would have served."""
    from privalign.accounting.filters import ExPostFilter
    from privalign.alignment import PrivITP
    from privalign.alignment.session import run_session

    total = pool.proxy.shape[0]

    s = cell["sigma"]
    sel = PrivITP(
        cfg["beta"],
        sigma_x=s / 2,
        sigma_z=s / 2,
        r_max=r_max,
        L=cfg["L"],
        delta=cfg["delta_per_prompt"],
        sensitivity=cfg["sensitivity"],
    )
    flt = ExPostFilter(cfg["budget_epsilon"], cfg["budget_delta"])
    rep = run_session(pool, sel, flt, "user", rng, n=cfg["n"])
    cum = np.cumsum([r["epsilon_realized"] for r in rep.per_prompt]).tolist()
    # true-reward lift of each served answer over its prompt's base-policy mean (P1-6: what the extra
    # prompts served are worth)
    lifts = [
        float(r["true_reward"] - np.nanmean(pool.true[r["prompt"], : pool.counts[r["prompt"]]]))
        for r in rep.per_prompt
    ]
    row = {
        **common,
        "method": "PrivITP",
        "accounting": "ex-post filter",
        "sigma": s,
        "served": rep.prompts_served,
        "pool_exhausted": rep.prompts_served == total,
        "t_basic": rep.basic_composition_count,
        "epsilon_max": rep.epsilon_max,
        "epsilon1": sel.accountant.epsilon1,
        "spent_epsilon": rep.spent["epsilon"],
        "spent_delta": rep.spent["delta"],
        "mean_stopping_time": _nn(rep.mean_stopping_time),
        "fallback_rate": _nn(rep.fallback_rate),
        "mean_true_reward": _nn(rep.mean_true_reward),
        "base_true_reward": _nn(rep.base_true_reward),
        "cumulative_epsilon": cum,
        "served_lifts": lifts,
        "pool_label": pool_label(cfg),
    }
    basic = {
        **common,
        "method": "PrivITP",
        "accounting": "basic composition",
        "sigma": s,
        "served": min(rep.basic_composition_count, total),
        "t_basic": rep.basic_composition_count,
        "epsilon_max": rep.epsilon_max,
        "spent_epsilon": min(rep.basic_composition_count, total) * rep.epsilon_max,
    }
    return [row, basic]


def _privbon_cell(cell: dict, cfg: dict, pool, r_max: float, common: dict, rng) -> list[dict]:
    """PrivBoN under the pure-ε filter and under zCDP."""
    from privalign.alignment import make_selector
    from privalign.alignment.session import privbon_zcdp_comparison

    total = pool.proxy.shape[0]

    bon_sel = make_selector(
        "privbon", epsilon=cfg["privbon_epsilon"], r_max=r_max, sensitivity=cfg["sensitivity"]
    )
    res = privbon_zcdp_comparison(
        pool,
        bon_sel,
        budget_epsilon=cfg["budget_epsilon"],
        delta=cfg["budget_delta"],
        n=cfg["n"],
        rng=rng,
    )
    pure, zc = res["pure"], res["zcdp"]
    return [
        {
            **common,
            "method": "PrivBoN",
            "accounting": "pure-ε filter",
            "per_query_epsilon": cfg["privbon_epsilon"],
            "served": pure["prompts_served"],
            "pool_exhausted": pure["prompts_served"] == total,
            "spent_epsilon": pure["spent"]["epsilon"],
            "mean_true_reward": _nn(pure["mean_true_reward"]),
            "cumulative_epsilon": np.cumsum([r["epsilon_realized"] for r in pure["per_prompt"]]).tolist(),
        },
        {
            **common,
            "method": "PrivBoN",
            "accounting": "zCDP filter",
            "per_query_epsilon": cfg["privbon_epsilon"],
            "served": zc["prompts_served"],
            "pool_exhausted": zc["prompts_served"] == total,
            "spent_rho": zc["spent"]["rho"],
            "rho_budget": zc["rho_budget"],
            "epsilon_at_delta": zc["epsilon_at_delta"],
            "mean_true_reward": _nn(zc["mean_true_reward"]),
        },
    ]


#: each cell kind → its run
_CELLS = {"privitp": _privitp_cell, "privbon": _privbon_cell}


def _nn(v):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


def _summarize(records: list[dict], cfg: dict) -> dict:
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["method"], r["accounting"], r.get("sigma")), []).append(r)
    table = []
    for (method, acc, sigma), rows in sorted(
        groups.items(), key=lambda kv: (kv[0][0], str(kv[0][2]), kv[0][1])
    ):
        served = np.array([r["served"] for r in rows], dtype=float)
        table.append(
            {
                "method": method,
                "accounting": acc,
                "sigma": sigma,
                "sessions": len(rows),
                "served_mean": float(served.mean()),
                "served_se": float(served.std(ddof=1) / math.sqrt(len(rows))) if len(rows) > 1 else 0.0,
                "pool_exhausted": any(r.get("pool_exhausted") for r in rows),
                "epsilon_max": rows[0].get("epsilon_max"),
            }
        )
    over = [
        r
        for r in records
        if (
            "spent_epsilon" in r
            and r["accounting"] != "basic composition"
            and r["spent_epsilon"] > r["budget_epsilon"] + 1e-9
        )
        or ("spent_rho" in r and r["spent_rho"] > r["rho_budget"] + 1e-12)
    ]
    return {
        "table": table,
        "overshoots": len(over),
        "budget_epsilon": cfg["budget_epsilon"],
        "budget_delta": cfg["budget_delta"],
    }


def _plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import new_figure, save_figure

    recs = read_results(run_dir)
    if not recs:
        return []
    summ = _summarize(
        recs, {"budget_epsilon": recs[0]["budget_epsilon"], "budget_delta": recs[0]["budget_delta"]}
    )
    fig, (ax1, ax2) = new_figure(2, 1, width=6.4, height=4.4)
    labels, means, ses, colors = [], [], [], []
    cmap = {
        "ex-post filter": "#2ca02c",
        "basic composition": "#7f7f7f",
        "pure-ε filter": "#ff7f0e",
        "zCDP filter": "#9467bd",
    }
    for row in summ["table"]:
        lab = (
            f"{row['method']}"
            + (f" σ={row['sigma']:g}" if row["sigma"] is not None else "")
            + f": {row['accounting']}"
        )
        labels.append(lab)
        means.append(row["served_mean"])
        ses.append(row["served_se"])
        colors.append(cmap.get(row["accounting"], "#1f77b4"))
    x = np.arange(len(labels))
    ax1.barh(x, means, xerr=ses, color=colors, capsize=3)
    ax1.set_yticks(x, labels, fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xlabel("prompts served under the budget (log scale)")
    ax1.set_title(
        f"Prompts served at total ε = {summ['budget_epsilon']:g} (±1 SE over sessions)", fontsize=10
    )
    ax1.set_xscale("log")
    shown = set()
    for r in recs:
        if r["accounting"] not in ("ex-post filter", "pure-ε filter") or not r.get("cumulative_epsilon"):
            continue
        key = (r["method"], r.get("sigma"))
        if key in shown:
            continue
        shown.add(key)
        cum = r["cumulative_epsilon"]
        lab = f"{r['method']} ({r['accounting']})" + (
            f" σ={r['sigma']:g}" if r.get("sigma") is not None else ""
        )
        ax2.step(np.arange(1, len(cum) + 1), cum, where="post", label=lab)
    ax2.axhline(
        summ["budget_epsilon"], color="black", linestyle="--", label=f"budget ε = {summ['budget_epsilon']:g}"
    )
    ax2.set_xscale("log")
    ax2.set_xlabel("prompts served (log scale)")
    ax2.set_ylabel("cumulative realized ε (settled)")
    ax2.set_title(f"Realized ε never exceeds the budget (overshoots: {summ['overshoots']})")
    ax2.legend(loc="best", fontsize=8, framealpha=0.85)
    return [save_figure(fig, run_dir, "budget")]


EXPERIMENTS: dict[str, Experiment] = {
    "p1-budget": Experiment(
        "p1-budget",
        "Fixed-budget sessions: ex-post filter vs basic composition; pure-ε vs zCDP PrivBoN",
        "paper1",
        _schema(),
        _preflight,
        _cells,
        _run_cell,
        _summarize,
        _plot,
    ),
}
