"""Paper 2 win rates (``p2-winrate``): best-of-N with privately trained reward models, judged by a gold
scorer that never saw the private preference data — the SmolLM2 analogue of the paper's table
"RR-IHT > Sample-DP IHT > RR > DP-SGD" (spec-reward-estimation §9; claim P2-5).

* Candidates: pre-generated SmolLM2-135M-Instruct pools (``pools/winrate-imdb.jsonl.gz``: held-out IMDb
  review openings; ``pools/winrate-hh.jsonl.gz``: single-turn HH-RLHF harmless prompts, built by
  :func:`build_hh_pool`). **The experiment never runs the LM**: it reads the pools, so it is fast and CI-safe.
* Reward models: engineer D's estimators (via
  :func:`privalign.estimation.tuning.make_experiment_estimator`) on binary hashed n-gram features of the
  response, trained on preference pairs that share no prompt with the pools (IMDb: the reviews of
  ``imdb_split``'s prompt part, which the gold model never saw, minus the prompt reviews; HH-RLHF: the
  harmless-base test pairs minus those whose first Human turn is a pool prompt).
* Win rate: the exact probability that the best-of-N pick beats one uniformly random candidate of the same
  prompt (the base policy's single sample), ties ½ (:func:`bon_win_probability`), averaged over prompts and
  seeds, with 95% bootstrap intervals over prompts and seeds (:func:`winrate_table`).
* Judges: the pool's ``true_reward`` — IMDb: E's gold sentiment model; HH-RLHF: ``clean`` = 1 − P(offensive)
  of ``alt-profanity-check``. Neither is trained on the private pairs; the HH judge measures offensive
  wording, not harm (docs/experiments.md states the weaknesses).

Privacy units differ (spec-reward-estimation §10): RR-IHT and dense RR are ε-label-DP (features public);
Sample-DP IHT and DP-SGD are (ε, δ)-DP on whole comparisons. Best-of-N with a fitted model is
post-processing: no further privacy cost per prompt.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from privalign.alignment.win_rate import bon_win_probability
from privalign.data.dialogue import _HUMAN, first_human_turn
from privalign.experiments.base import Experiment, RunContext
from privalign.experiments.pools import (
    WINRATE_DATASETS,
    WINRATE_JUDGE,
    winrate_data,
    winrate_fields,
    winrate_pool_preflight,
)
from privalign.experiments.runner import read_results

__all__ = [
    "EXPERIMENTS",
    "hh_winrate_examples",
    "build_hh_pool",
    "winrate_table",
    "order_verdict",
    "regime_mismatch",
    "power_statement",
    "POWER_TARGET",
]


#: Seed of the permutation that picks the HH-RLHF win-rate prompts [our choice].
HH_PROMPT_SEED = 20261129


def hh_winrate_examples(num_prompts: int, *, seed: int = HH_PROMPT_SEED) -> list[Any]:
    """Win-rate prompts from HH-RLHF ``harmless-base/test``: the Human turn of **single-turn** records
    (so the prompt is the whole context), in the order of a seeded permutation, first ``num_prompts``.

    Prompt ``i`` does not depend on ``num_prompts``. Returns E's :class:`privalign.data.datasets.Example`
    objects with ``extra["record_index"]`` (line of the file) and ``subject="hh-rlhf"``.
    """
    from privalign.data.datasets import Example, load_hh_rlhf

    ex = load_hh_rlhf()
    single = [i for i, e in enumerate(ex) if e.prompt.count(_HUMAN) == 1]
    order = np.random.default_rng(seed).permutation(len(single))
    seen: set[str] = set()
    out = []
    for k in order:
        i = single[int(k)]
        text = first_human_turn(ex[i].prompt)
        if not text or text in seen:
            continue
        seen.add(text)
        out.append(Example(prompt=text, subject="hh-rlhf", extra={"record_index": i}))
        if len(out) == num_prompts:
            break
    return out


def build_hh_pool(
    out: str | os.PathLike,
    *,
    num_prompts: int = 24,
    n: int = 16,
    max_new_tokens: int = 20,
    seed: int = 0,
    batch_size: int = 16,
    num_threads: int | None = None,
    progress: bool = True,
    generator: str = "transformers",
) -> dict:
    """Generate the HH-RLHF win-rate candidate pool with E's :func:`privalign.pipeline.build_pool.build_pool`
    (SmolLM2-135M-Instruct, chat template on, the same generator spec as ``privalign build-pool``).

    ``privalign build-pool --dataset hh-rlhf`` uses the full dialogue prefix of the *first* records; the win
    rate needs single-turn prompts picked by :func:`hh_winrate_examples`, hence this wrapper. The pool's
    proxy reward is VADER (unit), its ``true_reward`` the judge ``clean`` = 1 − P(offensive) of
    ``alt-profanity-check`` (not trained on HH-RLHF).

    ``generator="ctranslate2"`` uses the CTranslate2 int8 backend (``fast-cpu`` extra) with the per-block
    reseeding of ``privalign build-pool --generator ctranslate2`` (blocks of 32 prompts), as the 400-prompt
    pool of the full ``p2-winrate`` config was built.
    """
    from privalign._validation import check_choice
    from privalign.pipeline.build_pool import PoolConfig, build_pool

    generator = check_choice(generator, "generator", ("transformers", "ctranslate2"))
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
    gen = {
        "kind": generator,
        "model": "smollm2",
        "batch_size": batch_size,
        "chat_template": True,
        "assistant_prefix": "",
        "sampling": sampling,
        "stop": [],
        "num_threads": num_threads,
    }
    if generator == "ctranslate2":
        gen.update(compute_type="int8", reseed="block", reseed_block=32)
    examples = hh_winrate_examples(num_prompts)
    cfg = PoolConfig(
        dataset="hh-rlhf",
        n=n,
        seed=seed,
        generator=gen,
        proxy_reward="vader",
        true_reward="clean",
        num_prompts=num_prompts,
        dataset_options={
            "selection": "privalign.experiments.winrate.hh_winrate_examples",
            "prompt_seed": HH_PROMPT_SEED,
            "prompt": "first Human turn",
        },
    )
    return build_pool(cfg, examples, out, progress=progress)


# ---------------------------------------------------------------------------------------------------
# The experiment (reads pre-generated pools only; never runs the LM)
# ---------------------------------------------------------------------------------------------------

#: The paper's ordering (spec-reward-estimation §9, win rates at ε = 8), best first.
PAPER_ORDER = ("RRIHT", "SampleDPIHT", "DenseRR", "DPSGDLinear")
REFERENCES = ("Oracle (judge)", "Pool proxy (VADER)")
DATASETS = WINRATE_DATASETS
JUDGE = WINRATE_JUDGE


#: Target half-width of the 95% paired intervals of the win-rate gaps (resolves a 5-point gap).
POWER_TARGET = 0.05


def _sparsity_of(method: str, cfg: dict) -> int:
    """The s a method is fitted with: ``sample_dp_sparsity`` for Sample-DP IHT when set, else ``sparsity``."""
    from privalign.estimation.registry import is_estimator

    return (
        int(cfg.get("sample_dp_sparsity") or cfg["sparsity"])
        if is_estimator(method, "SampleDPIHT")
        else cfg["sparsity"]
    )


def _cells(cfg: dict, ctx: RunContext) -> list[dict]:
    from privalign.estimation.registry import is_estimator, kind_of

    cells = []
    for ds in cfg["datasets"]:
        if any(is_estimator(m, "SampleDPIHT") for m in cfg["methods"]):
            cells.append({"cell": f"{ds} regime", "kind": "regime", "dataset": ds, "method": "SampleDPIHT"})
        for ref in REFERENCES:
            cells.append({"cell": f"{ds} {ref}", "dataset": ds, "method": ref, "epsilon": None, "rep": 0})
        for m in cfg["methods"]:
            if kind_of(m) == "none":  # deterministic non-private references: one fit
                cells.append(
                    {
                        "cell": f"{ds} {m} eps=None rep=0",
                        "dataset": ds,
                        "method": m,
                        "epsilon": None,
                        "rep": 0,
                    }
                )
                continue
            for e in cfg["epsilons"]:
                for r in range(cfg["replicates"]):
                    cells.append(
                        {
                            "cell": f"{ds} {m} eps={e:g} rep={r}",
                            "dataset": ds,
                            "method": m,
                            "epsilon": e,
                            "rep": r,
                        }
                    )
    return cells


def _regime_cell(cell: dict, cfg: dict, ctx: RunContext) -> list[dict]:
    """Can Sample-DP IHT learn at this n? Per ε, Peeling's first-step need
    (:func:`privalign.estimation.iht.peeling_snr`: the training pairs needed for the top-s gradient
    coordinates to beat the expected largest noise draw) against the available training pairs, at the
    estimator's default T: each of its T disjoint batches holds n/T pairs, so the need is T times the
    one-batch need, and the regime holds iff the top-s coordinates are selectable at this n
    (``selectable_top_s``). A non-private diagnostic on the training pairs: it explains a result; nothing
    is chosen with it."""
    from privalign.estimation.iht import peeling_snr

    d = winrate_data(cell["dataset"], cfg, ctx)
    train = d["train"]
    n = int(train.y.shape[0])
    s = _sparsity_of("SampleDPIHT", cfg)
    out = []
    for e in cfg["epsilons"]:
        r = peeling_snr(
            train.X,
            train.y,
            epsilon=e,
            delta=cfg["delta"],
            sparsity=min(s, int(train.X.shape[1])),
            step_size=cfg["step_size"],
            feature_bound=1.0,
            n_fit=n,
        )
        one = r["n_needed_top_s"]
        out.append(
            {
                "kind": "regime",
                "dataset": cell["dataset"],
                "method": "SampleDPIHT",
                "epsilon": float(e),
                "sparsity": int(s),
                "n_train": n,
                "d": int(train.X.shape[1]),
                "T": int(r["T"]),
                "n_needed_one_batch": one,
                "n_needed_top_s": None if one is None else one * int(r["T"]),
                "in_regime": bool(one is not None and r["selectable_top_s"]),
            }
        )
    return out


def regime_mismatch(records: list[dict], epsilon: float) -> list[dict]:
    """The regime rows at ``epsilon`` whose method cannot learn at the available n (Peeling's need above
    the training pairs, or no signal at all)."""
    return [
        r
        for r in records
        if r.get("kind") == "regime" and r.get("epsilon") == epsilon and not r.get("in_regime", False)
    ]


def _run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.estimation.registry import privacy_text
    from privalign.estimation.tuning import make_experiment_estimator

    if cell.get("kind") == "regime":
        return _regime_cell(cell, cfg, ctx)
    d = winrate_data(cell["dataset"], cfg, ctx)
    pool = d["pool"]
    out = {
        "kind": "winrate",
        "dataset": cell["dataset"],
        "method": cell["method"],
        "epsilon": cell["epsilon"],
        "rep": cell["rep"],
        "best_of": d["N"],
        "n_prompts": d["P"],
        "n_train": int(d["train"].y.shape[0]),
        "n_excluded": int(d["n_excluded"]),
        "d": int(d["train"].X.shape[1]),
        "judge": JUDGE[cell["dataset"]],
        "n_bootstrap": cfg["n_bootstrap"],
        "root_seed": cfg["seed"],
    }
    if cell["method"] == REFERENCES[0]:
        sel, out["unit"] = pool["judge"], "reference (selects by the judge itself)"
    elif cell["method"] == REFERENCES[1]:
        sel, out["unit"] = pool["proxy"], "reference (the pool's VADER proxy; not trained on private data)"
    else:
        eps = math.inf if cell["epsilon"] is None else cell["epsilon"]
        est = make_experiment_estimator(
            cell["method"],
            epsilon=eps,
            delta=cfg["delta"],
            sparsity=_sparsity_of(cell["method"], cfg),
            feature_bound=1.0,
            random_state=np.random.default_rng(ss),
            cfg=cfg,
            n_train=out["n_train"],
        )
        est.fit(d["train"].X, d["train"].y)
        sel = est.predict_reward(d["phi"]).reshape(d["P"], d["N"])
        out["unit"] = privacy_text(cell["method"])
        out["privacy_event"] = est.privacy_event_.to_dict()
        out["train_accuracy"] = float(est.score(d["train"].X, d["train"].y))
        out["distinct_selector_values"] = float(np.mean([len(np.unique(np.round(r, 12))) for r in sel]))
    w = bon_win_probability(sel, pool["judge"])
    top = sel >= sel.max(axis=1, keepdims=True) - 1e-12 * np.maximum(
        1.0, np.abs(sel).max(axis=1, keepdims=True)
    )
    out["per_prompt"] = [float(v) for v in w]
    out["win_rate"] = float(w.mean())
    out["judge_selected"] = float(((pool["judge"] * top).sum(1) / top.sum(1)).mean())
    out["judge_base"] = float(pool["judge"].mean())
    return [out]


def winrate_table(
    records: list[dict], *, n_bootstrap: int | None = None, seed: int | None = None
) -> list[dict]:
    """Win rate per (dataset, method, ε) with a 95% percentile bootstrap interval.

    The point estimate is the mean over replicates and prompts of the exact per-prompt win probability. The
    interval resamples prompts (jointly for all methods of a data set) and, independently, replicates; the
    bootstrap seed and size come from the records (``root_seed``, ``n_bootstrap``), so the report and the
    summary compute the same numbers.
    """
    rows = [r for r in records if r.get("kind") == "winrate"]
    if not rows:
        return []
    B = int(n_bootstrap or rows[0].get("n_bootstrap", 2000))
    seed = int(seed if seed is not None else rows[0].get("root_seed", 0))
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["method"], r["epsilon"]), []).append(r)
    out = []
    for ds in sorted({k[0] for k in groups}):
        P = len(next(v for k, v in groups.items() if k[0] == ds)[0]["per_prompt"])
        rng = np.random.default_rng(
            np.random.SeedSequence(seed, spawn_key=(2**23, DATASETS.index(ds) if ds in DATASETS else 9))
        )
        pidx = rng.integers(0, P, size=(B, P))
        for (d, m, e), g in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], -(kv[0][2] or math.inf))
        ):
            if d != ds:
                continue
            W = np.array([r["per_prompt"] for r in sorted(g, key=lambda r: r["rep"])], float)  # (R, P)
            R = W.shape[0]
            ridx = rng.integers(0, R, size=(B, R))
            boot = np.array([W[ridx[b]][:, pidx[b]].mean() for b in range(B)])
            lo, hi = np.quantile(boot, [0.025, 0.975])
            out.append(
                {
                    "dataset": d,
                    "method": m,
                    "epsilon": e,
                    "win_rate": float(W.mean()),
                    "ci_lo": float(lo),
                    "ci_hi": float(hi),
                    "se": float(boot.std(ddof=1)),
                    "replicates": R,
                    "prompts": P,
                    "unit": g[0].get("unit", ""),
                    "judge_selected": float(np.mean([r["judge_selected"] for r in g])),
                    "judge_base": g[0]["judge_base"],
                }
            )
    return out


def order_verdict(
    records: list[dict], epsilon: float = 8.0, *, details: dict | None = None
) -> tuple[str, str]:
    """Claim P2-5: is RR-IHT > Sample-DP IHT > RR > DP-SGD (win rate at ``epsilon``) on every data set?

    Symmetric rule (:func:`privalign.experiments.verdicts.order_rule`): ``holds`` only if every adjacent gap
    of the paper's order is significantly in the paper's direction (95% prompt-paired bootstrap interval
    above 0) on every data set; ``does not hold`` if any gap is significantly reversed (its (1 − 0.05/k)
    interval below 0, Bonferroni over the k gaps); else ``inconclusive``. The measured text starts with the
    power statement (:func:`power_statement`: ``powered`` or ``UNDERPOWERED``), then each interval's
    half-width and the number of prompts that would give a ±0.05 half-width. **Regime check**: when the
    records' ``regime`` rows say Sample-DP IHT cannot learn at the available n at ``epsilon`` (Peeling's
    computed need above the training pairs), the verdict is ``inconclusive`` and the text starts with
    "regime mismatch", the need and the n (the order test's own verdict follows in parentheses).
    ``details``, if given, receives ``{"gaps": [...], "power": {...}}``.
    """
    from privalign.experiments.verdicts import order_rule

    rows = [r for r in records if r.get("kind") == "winrate"]
    table = {(t["dataset"], t["method"]): t for t in winrate_table(rows) if t["epsilon"] == epsilon}
    dss = sorted({k[0] for k in table})
    if not dss:
        return "inconclusive", f"no win-rate rows at ε = {epsilon:g}"
    gaps, parts = [], []
    k = len(dss) * (len(PAPER_ORDER) - 1)  # the reversal branch fires on any one gap: Bonferroni over k
    for ds in dss:
        if not all((ds, m) in table for m in PAPER_ORDER):
            return (
                "inconclusive",
                f"{ds}: methods at ε = {epsilon:g}: {sorted(m for d, m in table if d == ds)}",
            )
        for a, b in zip(PAPER_ORDER, PAPER_ORDER[1:]):
            lo, hi, lo_k, hi_k = _paired_diff_ci(rows, ds, a, b, epsilon, k=k)
            gaps.append(
                {
                    "dataset": ds,
                    "a": a,
                    "b": b,
                    "diff": table[(ds, a)]["win_rate"] - table[(ds, b)]["win_rate"],
                    "lo": lo,
                    "hi": hi,
                    "lo_bonf": lo_k,
                    "hi_bonf": hi_k,
                    "k": k,
                    "prompts": table[(ds, a)]["prompts"],
                }
            )
        t0 = table[(ds, PAPER_ORDER[0])]
        parts.append(
            f"{ds} (P={t0['prompts']}, {t0['replicates']} seeds): "
            + ", ".join(
                f"{m} {table[(ds, m)]['win_rate']:.3f} [{table[(ds, m)]['ci_lo']:.3f}, "
                f"{table[(ds, m)]['ci_hi']:.3f}]"
                for m in PAPER_ORDER
            )
        )
    from privalign.experiments.verdicts import Outcome, facts_of

    result = order_rule(gaps, target=POWER_TARGET)
    verdict, measured = result
    power = power_statement(gaps)
    if details is not None:
        details.update(gaps=gaps, power=power)
    text = power["text"] + "; " + measured + " | " + " | ".join(parts)
    facts = {**facts_of(result), "datasets": dss}
    bad = [r for r in regime_mismatch(records, epsilon) if r["dataset"] in dss]
    if bad:
        # A method that cannot learn at this n ranks last for that reason alone: the order says nothing
        # about the claim, whatever the intervals say.
        need = "; ".join(
            f"{r['dataset']}: {r['method']} at s = {r['sparsity']} needs n ≥ "
            + ("∞ (no signal)" if r["n_needed_top_s"] is None else f"{r['n_needed_top_s']:,.0f}")
            + " training pairs for Peeling to select its top-s coordinates"
            + (f" (T = {r['T']} disjoint batch{'es' if r['T'] != 1 else ''})" if r.get("T") else "")
            + f", has {r['n_train']:,}"
            for r in bad
        )
        return Outcome(
            "inconclusive",
            f"regime mismatch at ε = {epsilon:g}: {need} (the order test alone: {verdict}) | {text}",
            {**facts, "why": f"regime mismatch: {need}"},
        )
    return Outcome(verdict, text, facts)


def power_statement(gaps: list[dict], target: float = POWER_TARGET) -> dict:
    """Is the comparison powered? ``powered`` iff every 95% paired interval of an adjacent gap has half-width
    ≤ ``target`` (then a gap of 2·target is resolved); else ``underpowered``, with the number of prompts that
    would give that half-width (half-widths scale as 1/√prompts)."""
    if not gaps:
        return {
            "powered": False,
            "max_half_width": None,
            "prompts": 0,
            "prompts_needed": None,
            "text": "underpowered: no paired gaps",
        }
    hw = max((g["hi"] - g["lo"]) / 2 for g in gaps)
    P = min(g["prompts"] for g in gaps)
    need = math.ceil(P * (hw / target) ** 2 - 1e-9) if hw > 0 else P  # guard: 0.15/0.05 is 3 + 1 ulp
    ok = hw <= target
    from scipy import stats

    # a true gap of mdd is detected with probability ≈ 0.8 by the two-sided 95% interval
    mdd = hw * (1.0 + float(stats.norm.ppf(0.8)) / float(stats.norm.ppf(0.975)))
    text = (
        f"{'powered' if ok else 'UNDERPOWERED'}: largest 95% paired half-width ±{hw:.3f} with {P} prompts "
        f"({'≤' if ok else '>'} the ±{target:g} target; a true gap of {mdd:.3f} is detected with power ≈ 0.8"
        + ("" if ok else f"; ≈ {need} prompts needed for ±{target:g}")
        + ")"
    )
    return {
        "powered": bool(ok),
        "max_half_width": float(hw),
        "prompts": int(P),
        "prompts_needed": int(need),
        "target_half_width": target,
        "detectable_gap_power_0_8": float(mdd),
        "text": text,
    }


def _paired_diff_ci(
    rows: list[dict], ds: str, a: str, b: str, epsilon: float, *, k: int = 1
) -> tuple[float, float, float, float]:
    """Bootstrap intervals of win_rate(a) − win_rate(b) (prompts resampled jointly, replicates
    independently): the 95% interval and the (1 − 0.05/k) interval (Bonferroni over k gaps), as
    ``(lo, hi, lo_k, hi_k)``."""
    ga = [r for r in rows if r["dataset"] == ds and r["method"] == a and r["epsilon"] == epsilon]
    gb = [r for r in rows if r["dataset"] == ds and r["method"] == b and r["epsilon"] == epsilon]
    Wa = np.array([r["per_prompt"] for r in ga], float)
    Wb = np.array([r["per_prompt"] for r in gb], float)
    from privalign.stats import bootstrap_diff, interval, stream

    rng = stream(int(ga[0].get("root_seed", 0)), 2**24)
    diffs = bootstrap_diff(rng, Wa, Wb, int(ga[0].get("n_bootstrap", 2000)))
    return (*interval(diffs), *interval(diffs, k=k))


def _summarize(records: list[dict], cfg: dict) -> dict:
    table = winrate_table(records)
    verdicts = {}
    power = {}
    for e in cfg["epsilons"]:
        det: dict = {}
        v, m = order_verdict(records, e, details=det)
        verdicts[f"{e:g}"] = {"verdict": v, "measured": m}
        if det.get("power"):
            power[f"{e:g}"] = det["power"]
    first = {r["dataset"]: r for r in records if r.get("kind") == "winrate"}
    p8 = power.get("8") or next(iter(power.values()), None)
    return {
        "power": p8["text"] if p8 else "underpowered: no paired gaps",
        "power_by_epsilon": power,
        "table": [
            {
                k: t[k]
                for k in (
                    "dataset",
                    "method",
                    "epsilon",
                    "win_rate",
                    "ci_lo",
                    "ci_hi",
                    "replicates",
                    "prompts",
                    "judge_selected",
                    "judge_base",
                    "unit",
                )
            }
            for t in table
        ],
        "paper_order_by_epsilon": verdicts,
        "regime": [
            {
                k: r.get(k)
                for k in (
                    "dataset",
                    "method",
                    "epsilon",
                    "sparsity",
                    "d",
                    "n_train",
                    "T",
                    "n_needed_top_s",
                    "in_regime",
                )
            }
            for r in records
            if r.get("kind") == "regime"
        ],
        "private_pairs": {
            ds: {"n_train": r["n_train"], "excluded": r["n_excluded"]} for ds, r in first.items()
        },
        "judges": {ds: JUDGE[ds] for ds in first},
        "note": (
            "win rate = exact probability that best-of-N (by the reward model) beats one uniformly random "
            "candidate of the same prompt (the base policy's single sample), ties ½, judged by a scorer not "
            "trained on the private pairs; 95% percentile bootstrap over prompts and seeds; 0.5 = no gain"
        ),
    }


def _plot(run_dir: Path) -> list[str]:
    from privalign.estimation.registry import kind_of
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    recs = [r for r in read_results(run_dir) if r.get("kind") == "winrate"]
    table = winrate_table(recs)
    if not table:
        return []
    dss = [d for d in DATASETS if any(t["dataset"] == d for t in table)]
    fig, axes = new_figure(len(dss), 1, width=6.4, height=5.0)
    for ax, ds in zip(axes, dss):
        rows = [t for t in table if t["dataset"] == ds]
        private = [m for m in PAPER_ORDER if any(t["method"] == m for t in rows)]
        eps = sorted({t["epsilon"] for t in rows if t["epsilon"] is not None}, reverse=True)
        width = 0.8 / max(1, len(eps))
        shades = {e: 0.35 + 0.65 * (i + 1) / len(eps) for i, e in enumerate(sorted(eps))}
        for i, m in enumerate(private):
            for k, e in enumerate(eps):
                t = next((t for t in rows if t["method"] == m and t["epsilon"] == e), None)
                if t is None:
                    continue
                x = i - 0.4 + width * (k + 0.5)
                ax.bar(
                    x,
                    t["win_rate"],
                    width * 0.9,
                    color=STYLE.get(m, {}).get("color", "grey"),
                    alpha=shades[e],
                    yerr=[[t["win_rate"] - t["ci_lo"]], [t["ci_hi"] - t["win_rate"]]],
                    capsize=2,
                )
                ax.text(x, 0.005, f"{e:g}", ha="center", va="bottom", fontsize=6, rotation=90)
        refs = [t for t in rows if t["epsilon"] is None]
        for j, t in enumerate(refs):
            x = len(private) + j
            ax.bar(
                x,
                t["win_rate"],
                0.5,
                color=STYLE.get(t["method"], {}).get("color", "#bbbbbb"),
                hatch="//",
                alpha=0.45,
                yerr=[[t["win_rate"] - t["ci_lo"]], [t["ci_hi"] - t["win_rate"]]],
                capsize=2,
                error_kw={"ecolor": "k", "alpha": 1.0},
            )
        names = [f"{m}\n({'label-DP' if kind_of(m) == 'label' else 'sample-DP'})" for m in private] + [
            t["method"].replace(" (", "\n(") + ("\nnon-private" if kind_of(t["method"]) == "none" else "")
            for t in refs
        ]
        ax.set_xticks(range(len(names)), names, fontsize=7)
        ax.axhline(0.5, color="k", linestyle="--", linewidth=0.9)
        ax.axhline(1 - 0.5 / recs[0]["best_of"], color="grey", linestyle=":", linewidth=0.9)
        ax.set_ylim(0, 1)
        ax.set_ylabel("win rate vs base policy's sample")
        ax.set_xlabel("reward model used for best-of-N (bars left to right: ε high → low)")
        P = rows[0]["prompts"]
        ax.set_title(
            f"{ds}: best-of-{recs[0]['best_of']}, {P} prompts; judge: "
            + ("IMDb gold sentiment model" if ds == "imdb" else "1 − profanity-check"),
            fontsize=10,
        )
        from matplotlib.artist import Artist
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        handles: list[Artist] = [
            Patch(color="grey", alpha=shades[e], label=f"private RM, ε = {e:g}") for e in eps
        ]
        handles += [
            Patch(facecolor="#bbbbbb", hatch="//", label="non-private / reference"),
            Line2D([], [], color="k", linestyle="--", label="0.5 = no gain over the base sample"),
            Line2D([], [], color="grey", linestyle=":", label="best possible 1 − 1/(2N)"),
        ]
        ax.legend(
            handles=handles,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.24),
            ncol=3,
            fontsize=7,
            title="error bars: 95% bootstrap CI (prompts × seeds)",
            title_fontsize=7,
        )
    fig.tight_layout()
    return [save_figure(fig, run_dir, "winrate")]


EXPERIMENTS: dict[str, Experiment] = {
    "p2-winrate": Experiment(
        "p2-winrate",
        "Win rates of best-of-16 SmolLM2 with privately trained reward models "
        "(IMDb positive sentiment, HH-RLHF harmlessness)",
        "paper2",
        winrate_fields,
        winrate_pool_preflight,
        _cells,
        _run_cell,
        _summarize,
        _plot,
    ),
}
