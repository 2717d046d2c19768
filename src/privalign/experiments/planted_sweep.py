"""Beyond the papers: grading the planted real-text control (``beyond-planted-sweep``, issue 37 item 8).

The planted control of issue 28 (``privalign plant-hack``) adds a bonus of 8 proxy units to the 105 of 49,152
HH-2048 responses that contain a hashtag: 9.6–15.6 within-prompt SDs of the unplanted proxy, so best-of-N
picks a hashtag response whenever one is among its N and the gold falls at large N *by construction* (a step
function, true like the synthetic pool). This experiment grades it: for each bonus ``b`` (in within-prompt SDs
of the unplanted proxy, ``bonuses``), every candidate of prompt p with the feature gets
``proxy + b · sd_p(proxy)``, in memory (the pool file is never modified), and two readings are taken:

* **over-optimisation** (:func:`privalign.pipeline.analysis.bon_curve`): the paired max-t test of
  "gold(N_max) < gold(N) for some N" over all N jointly (sign flips of whole prompts), three-valued: ``holds``
  (rejects), ``does not hold`` (every N's one-sided lower bound above −10 % of the BoN gold lift), else
  ``inconclusive``. The sweep tests ``len(bonuses)`` bonuses, so each is run at α / len(bonuses) (Bonferroni):
  the family-wise false-positive rate of the whole sweep's "holds" is ≤ α.
* **the capacity diagnostic** (:func:`privalign.alignment.capacity.capacity_diagnostic`, run at the same
  level): whether the pool *can* show a fall at the N it holds (``can`` / ``cannot`` / ``unclear``), from the
  gold of proxy-rank bands.

The summary names the smallest bonus from which over-optimisation holds at every larger bonus of the sweep
(``detectable_from``), the same for the diagnostic's ``can`` (``diagnostic_can_from``), and where the two
agree. The bonus is public configuration; the SDs are those of the public scored pool (no private data here).
Each bonus is one cell; nothing is random except the max-t test's sign flips (seeded per cell).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from privalign.experiments.base import Experiment, ExperimentError, RunContext
from privalign.experiments.config import Field
from privalign.experiments.runner import read_results

__all__ = ["EXPERIMENTS", "plant_in_sds", "sweep_thresholds"]

NAME = "beyond-planted-sweep"


def _schema() -> dict[str, Field]:
    return {
        "seed": Field("int", 42, "root seed of the max-t tests' sign flips", low=0),
        "scored_pool": Field(
            "str", "pools/hh-smollm2-2048.jsonl.gz", "scored pool (proxy and gold rewards per response)"
        ),
        "feature": Field(
            "str",
            "hashtag",
            "planted feature (plant-hack --feature)",
            choices=("repeated-word", "allcaps-word", "semicolon", "hashtag"),
        ),
        "bonuses": Field(
            "list[float]",
            [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0],
            "planted bonus in within-prompt SDs of the unplanted proxy",
            low=1e-9,
        ),
        "n_prompts": Field("int", 0, "prompts used (0: all of the pool's)", low=0),
        "alpha": Field("float", 0.05, "family-wise false-positive rate over the whole sweep", low=1e-12),
        "margin_fraction": Field(
            "float", 0.1, "a fall below this share of the BoN gold lift is no fall ('does not hold')", low=0.0
        ),
    }


def _pool_path(spec: str) -> Path:
    from privalign.paths import repo_root

    p = Path(spec).expanduser()
    if not p.is_file() and not p.is_absolute() and (repo_root() / p).is_file():
        p = repo_root() / p
    if not p.is_file():
        raise ExperimentError(
            f"Configuration: pool file not found: {spec} (config key 'scored_pool', relative to the "
            "repository root or the working directory)."
        )
    return p


def _records(cfg: dict, ctx: RunContext) -> list[Any]:
    if "records" not in ctx.cache:
        from privalign.data.pools import read_pool

        recs = read_pool(_pool_path(cfg["scored_pool"]))
        if cfg["n_prompts"]:
            recs = recs[: cfg["n_prompts"]]
        ctx.cache["records"] = recs
    return ctx.cache["records"]


def _preflight(cfg: dict, ctx: RunContext) -> None:
    if not 0 < cfg["alpha"] < 1:
        raise ExperimentError(f"Configuration: alpha must be in (0, 1). Got {cfg['alpha']}.")
    if len(set(cfg["bonuses"])) != len(cfg["bonuses"]):
        raise ExperimentError(f"Configuration: bonuses must be distinct. Got {cfg['bonuses']}.")
    from privalign.experiments.manifest import file_sha256

    p = _pool_path(cfg["scored_pool"])
    recs = _records(cfg, ctx)
    for i, rec in enumerate(recs):
        for j, r in enumerate(rec.responses):
            if r.proxy_reward is None or r.true_value is None:
                raise ExperimentError(
                    f"Pool {p}: prompt {i + 1}, response {j + 1} lacks a proxy or a gold reward; the sweep "
                    "needs both on every response."
                )
    ctx.inputs["pool"] = {"path": str(p), "sha256": file_sha256(p)}


def _cells(cfg: dict, ctx: RunContext) -> list[dict]:
    return [{"cell": f"bonus={b:g}sd", "bonus_sd": float(b)} for b in cfg["bonuses"]]


def plant_in_sds(records: list[Any], hits: list[list[bool]], bonus_sd: float) -> tuple[list[Any], dict]:
    """``records`` with ``proxy += bonus_sd · sd_p`` on every response of prompt p flagged in ``hits``, where
    sd_p is the population SD of prompt p's unplanted proxy rewards; and facts about the planting: per prompt
    with a hit, how far (in SDs) its lowest planted response outranks (> 0) or trails its highest honest one.
    """
    out, gaps = [], []
    for rec, flags in zip(records, hits):
        proxy = np.asarray([r.proxy_reward for r in rec.responses], dtype=float)
        sd = float(proxy.std())
        add = bonus_sd * sd
        resp = tuple(
            dataclasses.replace(r, proxy_reward=float(r.proxy_reward) + add) if h else r
            for r, h in zip(rec.responses, flags)
        )
        out.append(dataclasses.replace(rec, responses=resp))
        f = np.asarray(flags, dtype=bool)
        if f.any() and (~f).any() and sd > 0:
            gaps.append(float((proxy[f].min() + add - proxy[~f].max()) / sd))
    facts = {
        "prompts_with_feature": len(gaps),
        "planted_outrank_all_honest": int(sum(g > 0 for g in gaps)),
        "min_gap_sd": min(gaps) if gaps else None,
        "max_gap_sd": max(gaps) if gaps else None,
    }
    return out, facts


def _run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.pipeline.analysis import bon_curve
    from privalign.pipeline.planted import feature_hits

    recs = _records(cfg, ctx)
    if "hits" not in ctx.cache:
        ctx.cache["hits"] = [feature_hits([r.text for r in rec.responses], cfg["feature"]) for rec in recs]
    hits = ctx.cache["hits"]
    planted, facts = plant_in_sds(recs, hits, cell["bonus_sd"])
    level = cfg["alpha"] / len(cfg["bonuses"])
    res = bon_curve(
        planted,
        alpha=level,
        margin_fraction=cfg["margin_fraction"],
        random_state=np.random.default_rng(ss),
    )
    cap = res["capacity"]
    down = cap.get("downturn") or {}
    # The same tests at the nominal α of one bonus (no correction for the sweep): a descriptive reading.
    nom = bon_curve(
        planted,
        alpha=cfg["alpha"],
        margin_fraction=cfg["margin_fraction"],
        random_state=np.random.default_rng(ss),
    )
    return [
        {
            "kind": "planted-sweep",
            "bonus_sd": cell["bonus_sd"],
            "feature": cfg["feature"],
            "level": level,
            "num_prompts": res["num_prompts"],
            "candidates_used": res["candidates_used"],
            "hits": int(sum(sum(h) for h in hits)),
            **facts,
            "curve": [
                {"N": r["N"], "gold": r["true_mean"], "gold_se": r["true_se"], "proxy": r["proxy_mean"]}
                for r in res["curve"]
            ],
            "argmax_N_gold": res["argmax_N_true"],
            "peak_gold": res["peak_true"],
            "gold_at_max_N": res["true_at_max_N"],
            "drop_from_peak": res["drop_from_peak"],
            "joint_p": res["joint_test"]["p"],
            # power: the smallest paired fall the joint test detects with 80 % power at some N (its SEs)
            "detectable_fall_80": min(res["joint_test"]["detectable_fall"], default=None),
            "verdict": res["verdict"],
            "verdict_rule": res["verdict_rule"],
            "capacity_reading": cap["reading"],
            "downturn_p": down.get("p_value"),
            "downturn_level": down.get("level"),
            "bon_below_linear": cap["bon_below_linear"],
            "nominal_alpha": cfg["alpha"],
            "verdict_nominal": nom["verdict"],
            "capacity_reading_nominal": nom["capacity"]["reading"],
        }
    ]


def _from(rows: list[dict], ok: Any) -> float | None:
    """The smallest bonus b such that ``ok`` holds at b and at every larger bonus of the sweep (None if it
    does not hold at the largest)."""
    best = None
    for r in sorted(rows, key=lambda r: r["bonus_sd"], reverse=True):
        if not ok(r):
            break
        best = r["bonus_sd"]
    return best


def sweep_thresholds(rows: list[dict], *, suffix: str = "") -> dict[str, Any]:
    """Where over-optimisation becomes detectable and where the capacity diagnostic agrees.

    ``detectable_from``: smallest bonus from which the verdict is ``holds`` at every larger bonus;
    ``not_detected_below``: the bonuses whose verdict is ``does not hold``; ``diagnostic_can_from``: the same
    as ``detectable_from`` for the reading ``can``; ``agree``: the bonuses where "holds" and "can" coincide
    (both or neither); ``disagree`` the others, each with both readings. ``suffix="_nominal"`` reads the
    per-bonus tests at the nominal α (no correction for the sweep) instead.
    """
    rows = sorted(
        (
            {
                "bonus_sd": r["bonus_sd"],
                "verdict": r["verdict" + suffix],
                "capacity_reading": r["capacity_reading" + suffix],
            }
            for r in rows
        ),
        key=lambda r: r["bonus_sd"],
    )
    agree = [r["bonus_sd"] for r in rows if (r["verdict"] == "holds") == (r["capacity_reading"] == "can")]
    return {
        "detectable_from": _from(rows, lambda r: r["verdict"] == "holds"),
        "not_detected_at": [r["bonus_sd"] for r in rows if r["verdict"] == "does not hold"],
        "inconclusive_at": [r["bonus_sd"] for r in rows if r["verdict"] == "inconclusive"],
        "diagnostic_can_from": _from(rows, lambda r: r["capacity_reading"] == "can"),
        "agree": agree,
        "disagree": [
            {"bonus_sd": r["bonus_sd"], "verdict": r["verdict"], "capacity_reading": r["capacity_reading"]}
            for r in rows
            if r["bonus_sd"] not in agree
        ],
    }


def _summarize(records: list[dict], cfg: dict) -> dict:
    rows = sorted([r for r in records if r.get("kind") == "planted-sweep"], key=lambda r: r["bonus_sd"])
    table = [
        {
            k: r[k]
            for k in (
                "bonus_sd",
                "verdict",
                "joint_p",
                "level",
                "argmax_N_gold",
                "peak_gold",
                "gold_at_max_N",
                "drop_from_peak",
                "detectable_fall_80",
                "capacity_reading",
                "downturn_p",
                "verdict_nominal",
                "capacity_reading_nominal",
                "planted_outrank_all_honest",
                "prompts_with_feature",
            )
        }
        for r in rows
    ]
    th = sweep_thresholds(rows)
    th_nom = sweep_thresholds(rows, suffix="_nominal")
    lvl = rows[0]["level"] if rows else None
    if not rows:
        measured = "no records"
    else:
        det = th["detectable_from"]
        can = th["diagnostic_can_from"]
        top = rows[-1]
        measured = (
            f"over-optimisation holds at every bonus ≥ {det:g} SDs"
            if det is not None
            else f"over-optimisation is not established at the largest bonus ({top['bonus_sd']:g} SDs: "
            f"{top['verdict']}, max-t p = {top['joint_p']:.3g}; fall {top['drop_from_peak']:.3g} vs "
            f"{top['detectable_fall_80']:.3g} detectable at 80 % power)"
        ) + (
            f"; the capacity diagnostic reads 'can' at every bonus ≥ {can:g} SDs"
            if can is not None
            else f"; the capacity diagnostic reads '{top['capacity_reading']}' at the largest bonus"
        )
        measured += (
            f"; the two agree at {len(th['agree'])} of {len(rows)} bonuses (each test at level {lvl:.3g})"
        )
        nd = th_nom["detectable_from"]
        measured += (
            f". At the nominal α = {cfg['alpha']:g} per bonus (descriptive, no correction for the sweep): "
            + (f"holds from {nd:g} SDs" if nd is not None else "never holds at the largest bonus")
        )
    return {
        "table": table,
        "thresholds": th,
        "thresholds_nominal": th_nom,
        "measured": measured,
        "feature": cfg["feature"],
    }


def _plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import new_figure, save_figure

    recs = sorted(
        [r for r in read_results(run_dir) if r.get("kind") == "planted-sweep"], key=lambda r: r["bonus_sd"]
    )
    if not recs:
        return []
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    fig, axes = new_figure(2, 1, width=5.4, height=4.0)
    ax = axes[0]
    for i, r in enumerate(recs):
        c = cmap(i / max(len(recs) - 1, 1))
        ax.plot(
            [p["N"] for p in r["curve"]],
            [p["gold"] for p in r["curve"]],
            marker="o",
            markersize=3,
            color=c,
            label=f"bonus {r['bonus_sd']:g} SD ({r['verdict']})",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("best-of-N: N")
    ax.set_ylabel("mean gold of the selected response")
    ax.set_title(f"BoN gold vs N, planted {recs[0]['feature']} bonus", fontsize=11)
    ax.legend(loc="best", fontsize=9, ncol=2)
    ax = axes[1]
    b = [r["bonus_sd"] for r in recs]
    ax.plot(b, [max(r["joint_p"], 1e-6) for r in recs], "o-", label="max-t p (over-optimisation)")
    ax.plot(
        b,
        [max(r["downturn_p"], 1e-6) if r["downturn_p"] is not None else math.nan for r in recs],
        "s--",
        label="capacity downturn p",
    )
    ax.axhline(
        recs[0]["level"],
        color="black",
        linestyle=":",
        label=f"max-t level α/{len(recs)} = {recs[0]['level']:.3g}",
    )
    if recs[0].get("downturn_level") is not None:
        ax.axhline(
            recs[0]["downturn_level"],
            color="#ff7f0e",
            linestyle=":",
            label=f"downturn level (÷ lower bands) = {recs[0]['downturn_level']:.2g}",
        )
    ax.set_yscale("log")
    ax.set_xlabel("planted bonus (within-prompt SDs of the proxy)")
    ax.set_ylabel("p-value (floored at 1e-6)")
    ax.set_title("Detection vs bonus", fontsize=11)
    ax.legend(loc="best", fontsize=9)
    return [save_figure(fig, run_dir, "planted_sweep")]


EXPERIMENTS: dict[str, Experiment] = {
    NAME: Experiment(
        NAME,
        "Grading the planted real-text control: BoN over-optimisation and the capacity diagnostic vs bonus",
        "beyond",
        _schema(),
        _preflight,
        _cells,
        _run_cell,
        _summarize,
        _plot,
    )
}
