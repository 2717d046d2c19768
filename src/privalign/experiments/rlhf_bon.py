"""Paper 2, P2-6 by best-of-N at exact KL (``p2-rlhf-bon``): gold reward against KL for the policy "best of
``n`` reference samples by a private reward model", for every private reward model at equal ε — the cheap,
powered analogue of the paper's "PPO-aligned policy: higher reward at the same KL for sparse methods".

Why best-of-N: its KL to the reference policy is known without sampling noise,
``KL_BoN(n) = log n − (n − 1)/n`` (Beirami et al. 2024, "Theoretical guarantees on the best-of-n alignment
policy", arXiv:2401.01879: exact when the selector has no ties among the reference's outputs and every output
has negligible probability, an upper bound otherwise; see ``distinct_selector_values`` in the records), and it
needs no RL run: it reads the pre-generated 400-prompt win-rate pools (16 SmolLM2-135M-Instruct samples per
prompt, the reference policy's), so every reward model is compared at exactly the same KL on the same 400
prompts, with several private fits (seeds) per method. RL with a KL penalty targets the same
reward-vs-KL trade-off (``p2-rlhf`` runs GRPO; docs/rlhf.md).

* Pools, private pairs, feature map and estimators: exactly those of ``p2-winrate``
  (:mod:`privalign.experiments.pools`, shared with :mod:`privalign.experiments.winrate`; the private pairs
  share no prompt with the pools).
* Gold: the pool's ``true_reward`` (IMDb: E's gold sentiment model, P(positive); HH-RLHF: 1 − P(offensive)),
  trained on no private pair.
* Per prompt and ``n``, the **exact** expected gold reward of the best of ``n`` candidates drawn without
  replacement from the prompt's 16 (ties broken uniformly at random) — :func:`bon_expected_gold`, the
  U-statistic (unbiased for best-of-``n`` of the sampler when the 16 are its i.i.d. samples), so no block
  splitting noise.
* Verdict (:func:`bon_verdict`), on IMDb (the paper's P2-6 task) at the largest ``n``: per (sparse, dense)
  pair of equal privacy unit (RR-IHT vs dense RR: label-DP; Sample-DP IHT vs DP-SGD: sample-DP) and ε, a 95%
  percentile bootstrap interval of the gold difference, resampling prompts jointly and fit seeds
  independently; three-valued, with its power.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from privalign.experiments.config import Field
from privalign.experiments.pools import winrate_data, winrate_fields, winrate_pool_preflight
from privalign.experiments.runner import Experiment, ExperimentError, RunContext, read_results
from privalign.stats import bootstrap_diff, bootstrap_means, interval, stream

__all__ = [
    "EXPERIMENTS",
    "bon_expected_gold",
    "bon_selection_weights",
    "bon_verdict",
    "bon_table",
]

#: (sparse, dense) pairs compared at equal ε and equal privacy unit.
SPARSE_DENSE = (("RRIHT", "DenseRR"), ("SampleDPIHT", "DPSGDLinear"))
PRIVATE = ("SampleDPIHT", "RRIHT", "DenseRR", "DPSGDLinear")
NONPRIVATE = ("IHT", "MLE")
ORACLE = "Oracle (gold)"
#: Target half-width of the 95% intervals of the gold differences [our choice]: resolves a 0.014 gold gap
#: with power 0.8 (the IMDb best-of-16 gain over the reference is ≈ 0.1–0.2).
POWER_TARGET = 0.01
DATASETS = ("imdb", "hh-rlhf")


#: the ``kind`` of this experiment's result records (a record type, not a selection method)
RECORD_KIND = "bon"


@lru_cache(maxsize=64)
def bon_selection_weights(m: int, n: int) -> np.ndarray:
    """``W[a, t]``: the probability that a given candidate is best-of-``n`` when ``n`` of ``m`` candidates are
    drawn without replacement, ties broken uniformly, given that ``a`` candidates score strictly below it and
    ``t`` (itself included) score the same: ``Σ_j C(t−1, j) C(a, n−1−j) / C(m, n) / (j + 1)``, ``j`` = how
    many of its ties are drawn with it."""
    w = np.zeros((m, m + 1))
    total = math.comb(m, n)
    for a in range(m):
        for t in range(1, m - a + 1):
            w[a, t] = (
                sum(math.comb(t - 1, j) * math.comb(a, n - 1 - j) / (j + 1) for j in range(min(t, n))) / total
            )
    return w


def bon_expected_gold(selector: np.ndarray, gold: np.ndarray, n: int) -> np.ndarray:
    """Per prompt (rows), the exact expected gold reward of best-of-``n`` over a uniformly random ``n``-subset
    of the row's ``m`` candidates, the pick being the selector's maximum (ties: uniform). ``n = 1`` is the
    row mean; ``n = m`` the (tie-averaged) arg-max. Returns ``(P,)``."""
    s = np.asarray(selector, float)
    g = np.asarray(gold, float)
    if s.shape != g.shape or s.ndim != 2:
        raise ValueError(f"selector and gold must be equal (P, m) arrays; got {s.shape} and {g.shape}")
    m = s.shape[1]
    if not 1 <= n <= m:
        raise ValueError(f"n must be in [1, {m}]; got {n}")
    tol = 1e-12 * np.maximum(1.0, np.abs(s).max(axis=1, keepdims=True))[:, :, None]
    diff = s[:, None, :] - s[:, :, None]  # [p, i, j] = s_j − s_i
    below = (diff < -tol).sum(axis=2)
    ties = (np.abs(diff) <= tol).sum(axis=2)
    p = bon_selection_weights(m, n)[below, ties]
    return (p * g).sum(axis=1)


def bon_kl_ties(selector: np.ndarray, n: int) -> np.ndarray:
    """Per prompt, the KL of best-of-``n`` to the reference when the selector has ties: with ``p_v`` the
    reference's probability of selector level ``v`` (estimated by the row's empirical frequencies) and ``F``
    its CDF, best-of-``n`` (ties uniform) puts ``q_v = F(v)ⁿ − F(v⁻)ⁿ`` on level ``v`` and is proportional
    to the reference within a level, so ``KL = Σ_v q_v log(q_v / p_v)``. Without ties it is the discrete
    analogue of ``log n − (n − 1)/n`` (16 samples, n = 16: 1.794 vs 1.835 nats); with ties it is smaller (a
    selector with one level gives 0). The same estimator for every selector, so curves are compared on one
    KL axis."""
    s = np.asarray(selector, float)
    m = s.shape[1]
    out = np.empty(s.shape[0])
    for i, row in enumerate(s):
        tol = 1e-12 * max(1.0, float(np.abs(row).max()))
        srt = np.sort(row)
        cuts = np.flatnonzero(np.diff(srt) > tol)
        counts = np.diff(np.concatenate(([0], cuts + 1, [m])))
        F = np.cumsum(counts) / m
        q = F**n - np.concatenate(([0.0], F[:-1])) ** n
        p = counts / m
        keep = q > 0
        out[i] = float((q[keep] * np.log(q[keep] / p[keep])).sum())
    return out


def _schema() -> dict[str, Field]:
    s = winrate_fields()
    s["imdb_pool"] = Field(
        "str", "pools/winrate-imdb-400.jsonl.gz", "IMDb candidate pool (the reference policy's samples)"
    )
    s["hh_pool"] = Field(
        "str", "pools/winrate-hh-400.jsonl.gz", "HH-RLHF candidate pool (the reference policy's samples)"
    )
    s["epsilons"] = Field("list[float]", [8.0, 2.0], "ε grid of the private reward models", low=1e-12)
    s["ns"] = Field("list[int]", [1, 2, 3, 4, 6, 8, 12, 16], "best-of-n sizes (≤ best_of)", low=1)
    s["imdb_gold"] = Field(
        "str",
        "pool",
        "IMDb gold: 'pool' (the pool's true_reward, the n-gram gold) or a reward-model JSON path, e.g. "
        "pools/imdb-gold-minilm-logreg.json (MiniLM; fit on imdb_split's fit part, disjoint from the pairs)",
    )
    return s


def _gold(ds: str, cfg: dict, ctx: RunContext, d: dict) -> np.ndarray:
    """``(P, N)`` gold scores of the pool's candidates: the pool's ``true_reward`` or, for IMDb with
    ``imdb_gold`` set to a file, that scorer (computed once per run)."""
    if ds != "imdb" or cfg.get("imdb_gold", "pool") == "pool":
        return d["pool"]["judge"]
    key = "gold:imdb"
    if key not in ctx.cache:
        from privalign.models.scorers import LinearRewardScorer
        from privalign.paths import repo_root

        p = Path(cfg["imdb_gold"]).expanduser()
        scorer = LinearRewardScorer.load(p if p.is_absolute() else repo_root() / p)
        flat = [t for row in d["pool"]["texts"] for t in row]
        ctx.cache[key] = np.asarray(scorer.score(flat), float).reshape(d["P"], d["N"])
    return ctx.cache[key]


def _preflight(cfg: dict, ctx: RunContext) -> None:
    if max(cfg["ns"]) > cfg["best_of"]:
        raise ExperimentError(f"p2-rlhf-bon: max(ns) = {max(cfg['ns'])} > best_of = {cfg['best_of']}.")
    bad = [m for m in cfg["methods"] if m not in PRIVATE + NONPRIVATE]
    if bad:
        raise ExperimentError(
            f"p2-rlhf-bon: config key 'methods': unknown {bad}; known {PRIVATE + NONPRIVATE}."
        )
    winrate_pool_preflight(cfg, ctx)


def _cells(cfg: dict, ctx: RunContext) -> list[dict]:
    cells = []
    for ds in cfg["datasets"]:
        cells.append({"cell": f"{ds} {ORACLE}", "dataset": ds, "method": ORACLE, "epsilon": None, "rep": 0})
        for m in cfg["methods"]:
            eps_reps = (
                [(None, 0)]
                if m in NONPRIVATE
                else [(e, r) for e in cfg["epsilons"] for r in range(cfg["replicates"])]
            )
            for e, r in eps_reps:
                tag = "None" if e is None else f"{e:g}"
                cells.append(
                    {
                        "cell": f"{ds} {m} eps={tag} rep={r}",
                        "dataset": ds,
                        "method": m,
                        "epsilon": e,
                        "rep": r,
                    }
                )
    return cells


def _selector(
    cell: dict, cfg: dict, d: dict, ss: np.random.SeedSequence, gold: np.ndarray
) -> tuple[np.ndarray, dict]:
    """The candidates' selector scores ``(P, N)`` and the fit's facts."""
    from privalign.estimation.registry import privacy_text
    from privalign.estimation.tuning import make_experiment_estimator

    if cell["method"] == ORACLE:
        return gold, {"unit": "reference (selects by the gold itself: the upper envelope)"}
    est = make_experiment_estimator(
        cell["method"],
        epsilon=math.inf if cell["epsilon"] is None else cell["epsilon"],
        delta=cfg["delta"],
        sparsity=cfg["sparsity"],
        feature_bound=1.0,
        random_state=np.random.default_rng(ss),
        cfg=cfg,
        n_train=int(d["train"].y.shape[0]),
    )
    est.fit(d["train"].X, d["train"].y)
    facts = {
        "unit": privacy_text(cell["method"]),
        "privacy_event": est.privacy_event_.to_dict(),
        "train_accuracy": float(est.score(d["train"].X, d["train"].y)),
    }
    return est.predict_reward(d["phi"]).reshape(d["P"], d["N"]), facts


def _run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.rlhf.evaluate import bon_kl

    d = winrate_data(cell["dataset"], cfg, ctx)
    judge = _gold(cell["dataset"], cfg, ctx, d)
    sel, facts = _selector(cell, cfg, d, ss, judge)
    per = {str(n): [float(v) for v in bon_expected_gold(sel, judge, n)] for n in cfg["ns"]}
    return [
        {
            "kind": RECORD_KIND,
            "dataset": cell["dataset"],
            "method": cell["method"],
            "epsilon": cell["epsilon"],
            "rep": cell["rep"],
            **facts,
            "ns": list(cfg["ns"]),
            "kl": [bon_kl(n) for n in cfg["ns"]],
            "kl_ties": [float(bon_kl_ties(sel, n).mean()) for n in cfg["ns"]],
            "gold": [float(np.mean(per[str(n)])) for n in cfg["ns"]],
            "per_prompt_gold": per,
            "distinct_selector_values": float(np.mean([len(np.unique(np.round(r, 12))) for r in sel])),
            "n_prompts": d["P"],
            "candidates": d["N"],
            "n_train": int(d["train"].y.shape[0]),
            "gold_source": "pool true_reward"
            if cell["dataset"] != "imdb" or cfg.get("imdb_gold", "pool") == "pool"
            else str(cfg["imdb_gold"]),
            "root_seed": cfg["seed"],
            "n_bootstrap": cfg["n_bootstrap"],
        }
    ]


def _groups(records: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("kind") == RECORD_KIND:
            g.setdefault((r["dataset"], r["method"], r["epsilon"]), []).append(r)
    return g


def _matrix(group: list[dict], n: int) -> np.ndarray:
    """``(replicates, P)`` per-prompt gold of best-of-``n``."""
    return np.array([r["per_prompt_gold"][str(n)] for r in sorted(group, key=lambda r: r["rep"])], float)


def bon_table(records: list[dict]) -> list[dict]:
    """Gold of best-of-n per (dataset, method, ε, n): mean over seeds and prompts, 95% bootstrap interval
    (prompts × seeds)."""
    groups = _groups(records)
    if not groups:
        return []
    first = next(iter(groups.values()))[0]
    B = int(first.get("n_bootstrap", 2000))
    rows = []
    for (ds, m, e), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], -(kv[0][2] or math.inf))):
        rng = stream(int(first.get("root_seed", 0)), 2**25)
        for i, (n, kl) in enumerate(zip(g[0]["ns"], g[0]["kl"])):
            W = _matrix(g, n)
            lo, hi = interval(bootstrap_means(rng, [W], max(100, B // 4))[:, 0])
            rows.append(
                {
                    "dataset": ds,
                    "method": m,
                    "epsilon": e,
                    "n": n,
                    "kl": kl,
                    "kl_ties": float(_kl_curve(g)[i]),
                    "gold": float(W.mean()),
                    "ci": [float(lo), float(hi)],
                    "replicates": W.shape[0],
                    "prompts": W.shape[1],
                    "unit": g[0].get("unit", ""),
                    "distinct_selector_values": float(np.mean([r["distinct_selector_values"] for r in g])),
                }
            )
    return rows


def _kl_curve(group: list[dict]) -> np.ndarray:
    """The group's tie-aware KL per n (mean over fit seeds); the analytic one for records without it."""
    return np.mean([r.get("kl_ties", r["kl"]) for r in group], axis=0)


def _at_kl(group: list[dict], kl: float) -> tuple[np.ndarray, float]:
    """``(replicates, P)`` per-prompt gold of the group's best-of-n curve linearly interpolated at ``kl``
    (on the tie-aware KL axis) and the (fractional) n-index reached; ``kl`` must not exceed the curve's
    last point."""
    ks = _kl_curve(group)
    ns = group[0]["ns"]
    j = int(np.searchsorted(ks, kl - 1e-12, side="left"))
    if j == 0:
        return _matrix(group, ns[0]), 0.0
    j = min(j, len(ns) - 1)
    span = ks[j] - ks[j - 1]
    lam = 1.0 if span <= 0 else float(np.clip((kl - ks[j - 1]) / span, 0.0, 1.0))
    return (1 - lam) * _matrix(group, ns[j - 1]) + lam * _matrix(group, ns[j]), j - 1 + lam


def _comparisons(records: list[dict], dataset: str, n: int | None) -> list[dict]:
    """Sparse − dense gold differences for each pair and ε: at best-of-``n`` for both (the same analytic
    KL), or, with ``n=None`` (the verdict's), at the largest KL both curves reach on the tie-aware axis
    (:func:`bon_kl_ties`): a selector with many ties moves less far from the reference at the same n, so
    equal n is not equal KL."""
    groups = _groups(records)
    out = []
    todo = [
        (a, b, e)
        for a, b in SPARSE_DENSE
        for e in sorted(
            {k[2] for k in groups if k[0] == dataset and k[1] == a and k[2] is not None}, reverse=True
        )
        if (dataset, b, e) in groups
    ]
    k = max(1, len(todo))
    for a, b, e in todo:
        ga, gb = groups[(dataset, a, e)], groups[(dataset, b, e)]
        where: dict[str, Any]
        if n is None:
            kl = float(min(_kl_curve(ga)[-1], _kl_curve(gb)[-1]))
            (Wa, ja), (Wb, jb) = _at_kl(ga, kl), _at_kl(gb, kl)
            where = {
                "kl_axis": "tie-aware",
                "n_index": [ja, jb],
                "kl_max": [float(_kl_curve(g)[-1]) for g in (ga, gb)],
            }
            key = 0
        else:
            kl = ga[0]["kl"][ga[0]["ns"].index(n)]
            Wa, Wb = _matrix(ga, n), _matrix(gb, n)
            where = {"kl_axis": "analytic (equal n)", "n": n}
            key = n
        rng = stream(int(ga[0].get("root_seed", 0)), 2**26, key, int(round(e * 1000)))
        diffs = bootstrap_diff(rng, Wa, Wb, int(ga[0].get("n_bootstrap", 2000)))
        lo, hi = interval(diffs)
        lo_k, hi_k = interval(diffs, k=k)
        out.append(
            {
                "dataset": dataset,
                "sparse": a,
                "dense": b,
                "epsilon": e,
                **where,
                "kl": float(kl),
                "gold": [float(Wa.mean()), float(Wb.mean())],
                "diff": float(Wa.mean() - Wb.mean()),
                "ci": [float(lo), float(hi)],
                "ci_bonferroni": [float(lo_k), float(hi_k)],
                "k": k,
                "se": float(diffs.std(ddof=1)),
                "prompts": Wa.shape[1],
                "replicates": [Wa.shape[0], Wb.shape[0]],
            }
        )
    return out


def bon_verdict(records: list[dict], *, dataset: str = "imdb", n: int | None = None) -> tuple[str, str]:
    """Claim P2-6 (best-of-n analogue): at equal ε, equal privacy unit and equal KL, the sparse private
    reward model's best-of-n has higher gold reward than the dense one's. Compared at the largest KL both
    curves reach on the tie-aware axis (:func:`bon_kl_ties`; each curve interpolated linearly in KL between
    its n), or at best-of-``n`` for both when ``n`` is given.

    ``holds`` iff every (sparse, dense, ε) comparison's 95% bootstrap interval (prompts jointly, seeds
    independently) lies above 0; ``does not hold`` iff some comparison's (1 − 0.05/k) interval lies below 0
    (Bonferroni over the k comparisons, since it fires on any one); else ``inconclusive`` (also when no pair
    is present). The text states the power: each interval's half-width against :data:`POWER_TARGET` and the
    gap detected with power ≈ 0.8.
    """
    from scipy import stats

    from privalign.experiments.verdicts import all_of

    comps = _comparisons(records, dataset, n)
    if not comps:
        return "inconclusive", f"{dataset}: no (sparse, dense) pair at a common ε"
    v = all_of(
        [
            "does not hold" if c["ci_bonferroni"][1] < 0 else "holds" if c["ci"][0] > 0 else "inconclusive"
            for c in comps
        ]
    )
    hw = max((c["ci"][1] - c["ci"][0]) / 2 for c in comps)
    mdd = hw * (1.0 + float(stats.norm.ppf(0.8)) / float(stats.norm.ppf(0.975)))
    c0 = comps[0]
    power = (
        f"{'powered' if hw <= POWER_TARGET else 'UNDERPOWERED'}: largest 95% half-width ±{hw:.4f} "
        f"(target ±{POWER_TARGET:g}); a true gold gap of {mdd:.4f} is detected with power ≈ 0.8"
    )
    parts = [
        f"{c['sparse']} − {c['dense']} at ε = {c['epsilon']:g}, KL {c['kl']:.3f}: {c['diff']:+.4f} [95% CI "
        f"{c['ci'][0]:+.4f}, {c['ci'][1]:+.4f}; Bonferroni k={c['k']}: {c['ci_bonferroni'][0]:+.4f}, "
        f"{c['ci_bonferroni'][1]:+.4f}]"
        for c in comps
    ]
    return v, (
        f"{power} | {dataset}, "
        + (
            f"best-of-{c0['n']} for both (analytic KL {c0['kl']:.3f} nats)"
            if "n" in c0
            else "at the largest KL both best-of-n curves reach (tie-aware KL, nats)"
        )
        + f", {c0['prompts']} prompts, {c0['replicates'][0]} fit seeds | "
        + " | ".join(parts)
    )


def _summarize(records: list[dict], cfg: dict) -> dict:
    v, m = bon_verdict(records)
    ns = list(cfg["ns"])
    return {
        "verdict": v,
        "measured": m,
        "table": bon_table(records),
        "comparisons": {
            ds: {str(n): _comparisons(records, ds, n) for n in ns if n > 1} for ds in cfg["datasets"]
        },
        "secondary_verdicts": {
            ds: dict(zip(("verdict", "measured"), bon_verdict(records, dataset=ds)))
            for ds in cfg["datasets"]
            if ds != "imdb"
        },
        "note": (
            "best-of-n from the reference policy's 16 pool samples per prompt, selected by each reward "
            "model; gold = the pool's true_reward (never trained on the private pairs); exact expectation "
            "over n-subsets (ties uniform); KL = log n − (n−1)/n nats (exact without selector ties, an upper "
            "bound with them); 95% bootstrap over prompts × fit seeds; each best-of-n policy inherits its "
            "reward "
            "model's (ε, δ) and privacy unit (post-processing)"
        ),
    }


def _plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    table = bon_table(read_results(run_dir))
    if not table:
        return []
    dss = [d for d in DATASETS if any(t["dataset"] == d for t in table)]
    fig, axes = new_figure(1, len(dss), width=5.2 * len(dss), height=4.4)
    axes = np.atleast_1d(axes)
    for ax, ds in zip(axes, dss):
        rows = [t for t in table if t["dataset"] == ds]
        for key in sorted(
            {(t["method"], t["epsilon"]) for t in rows}, key=lambda k: (k[0], -(k[1] or math.inf))
        ):
            pts = [t for t in rows if (t["method"], t["epsilon"]) == key]
            m, e = key
            color = "#7f7f7f" if m == ORACLE else STYLE.get(m, {}).get("color", "grey")
            ls = ":" if m == ORACLE else ("-" if e is None or e >= 8 else "--")
            label = f"{m}" + (f" ε={e:g}" if e is not None else ("" if m == ORACLE else " (non-private)"))
            ax.errorbar(
                [t["kl_ties"] for t in pts],
                [t["gold"] for t in pts],
                yerr=[[t["gold"] - t["ci"][0] for t in pts], [t["ci"][1] - t["gold"] for t in pts]],
                fmt=ls,
                marker="o" if e is None or e >= 8 else "s",
                markersize=3,
                color=color,
                capsize=2,
                linewidth=1,
                label=label,
            )
        P, R = rows[0]["prompts"], max(t["replicates"] for t in rows)
        ax.set_title(f"{ds}: best-of-n, {P} prompts, ≤ {R} fit seeds", fontsize=9)
        ax.set_xlabel("KL(best-of-n ‖ reference) [nats], tie-aware (no ties: ≈ log n − (n−1)/n)")
        ax.set_ylabel("gold reward (95% CI: prompts × seeds)")
        ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    return [save_figure(fig, run_dir, "rlhf_bon_gold_vs_kl")]


EXPERIMENTS: dict[str, Experiment] = {
    "p2-rlhf-bon": Experiment(
        "p2-rlhf-bon",
        "Private reward models, gold reward vs exact KL: best-of-n from SmolLM2 reference samples "
        "(400-prompt pools, IMDb and HH-RLHF), sparse vs dense at equal ε",
        "paper2",
        _schema(),
        _preflight,
        _cells,
        _run_cell,
        _summarize,
        _plot,
    ),
}
