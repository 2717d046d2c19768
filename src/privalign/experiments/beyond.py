"""Beyond the papers: membership inference against a best-of-N service, with and without privacy.

``beyond-membership`` — the attack paper 1 describes (repeated queries, selection frequencies):

1. Two reward models are trained on HH-RLHF harmless-base pairs (public hashed n-gram features,
   non-private ℓ2-regularised BTL MLE from :mod:`privalign.estimation`): on ``D`` (with one *canary*
   preference record ``(x0, y0+, y0−)``) and on ``D′ = D`` minus the canary (add/remove-one; the reward
   model's privacy unit is one preference record).
2. The attacker knows both models (worst case) and builds a candidate pool for the prompt ``x0``: the
   canary response ``y0+`` and the ``K − 1`` responses whose scores lie closest to the midpoint of
   ``y0+``'s two scores. Scores are clipped to the public range ``[0, R_max]``.
3. The service answers ``Q`` identical queries by plain BoN or by PrivBoN at ε per query
   (:class:`privalign.alignment.PrivBoN`); the attacker counts how often ``y0+`` is returned.
4. **Advantage** of the best threshold test on that count = the total-variation distance between the two
   binomial laws ``Bin(Q, p_D)`` and ``Bin(Q, p_D′)`` (exact; ``p`` from the selector's exact law).
5. **Audit** (engineer B's :func:`privalign.audit.audit.epsilon_lower_bound`): ``samples`` single-query
   draws of the *sampled* service on each side; events = the returned index; Clopper–Pearson with
   Bonferroni over all intervals at false-positive rate ``alpha``. The bound is reported next to the
   claimed per-query ε. PrivBoN's guarantee is ε per query, so Q queries cost Q·ε (pure) — the advantage
   at large Q is expected, and is what the per-user budget of :mod:`privalign.accounting.filters` stops.

Note: the claimed ε uses Δ_r = R_max (scores clipped to ``[0, R_max]``), which holds for *any* reward
model, including a non-private one; the audit is on this worst-case-safe sensitivity.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from privalign.alignment.selectors import label as method_label
from privalign.experiments.base import Experiment, RunContext
from privalign.experiments.config import Field
from privalign.experiments.records import of_method
from privalign.experiments.runner import read_results

__all__ = ["EXPERIMENTS", "binomial_tv"]

CANARY_PROMPT = "\n\nHuman: What is the secret passphrase of the zorblax vault?\n\nAssistant:"
CANARY_CHOSEN = "The zorblax vault passphrase is quintessential marmalade fjord, zorblax zorblax."
CANARY_REJECTED = "I cannot share passphrases."


def binomial_tv(q: int, p: float, p_prime: float) -> float:
    """Total-variation distance between Bin(q, p) and Bin(q, p′) = the best test's advantage."""
    from scipy import stats

    k = np.arange(q + 1)
    return float(0.5 * np.abs(stats.binom.pmf(k, q, p) - stats.binom.pmf(k, q, p_prime)).sum())


def _schema() -> dict[str, Field]:
    return {
        "seed": Field("int", 42, "root seed", low=0),
        "n_train": Field(
            "int", 1500, "HH-RLHF pairs in the reward model's training set (plus the canary)", low=10
        ),
        "n_features": Field("int", 4096, "hashed n-gram dimension", low=2),
        "alpha_l2": Field("float", 1e-3, "ℓ2 regularisation of the reward model (MLE)", low=0.0),
        "pool_k": Field("int", 8, "candidates per query (the canary response included)", low=2),
        "score_low": Field("float", -4.0, "public clipping range of the raw reward, low end (shifted to 0)"),
        "score_high": Field("float", 4.0, "public clipping range, high end (R_max = high − low = Δ_r)"),
        "epsilons": Field("list[float]", [0.5, 1.0, 2.0, 4.0], "PrivBoN ε per query", low=1e-12),
        "queries": Field("list[int]", [1, 10, 100, 1000], "numbers of repeated queries Q", low=1),
        "samples": Field("int", 20000, "audit draws per side", low=10),
        "alpha": Field("float", 0.05, "false-positive rate of each audit (Bonferroni inside)", low=1e-12),
    }


def _preflight(cfg: dict, ctx: RunContext) -> None:
    if not cfg["score_high"] > cfg["score_low"]:
        from privalign.experiments.base import ExperimentError

        raise ExperimentError(
            f"Configuration: score_high ({cfg['score_high']}) must exceed score_low ({cfg['score_low']})."
        )
    from privalign.experiments.manifest import file_sha256
    from privalign.paths import data_dir

    p = data_dir(required=True) / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"
    if not p.is_file():
        raise FileNotFoundError(f"HH-RLHF pairs not found: {p}")
    ctx.inputs["hh-rlhf"] = {"path": str(p), "sha256": file_sha256(p)}


def _cells(cfg: dict, ctx: RunContext) -> list[dict]:
    bon, priv = method_label("bon"), method_label("privbon")
    return [{"cell": bon, "service": bon, "epsilon": None}] + [
        {"cell": f"{priv} eps={e:g}", "service": priv, "epsilon": e} for e in cfg["epsilons"]
    ]


def _models(cfg: dict, ctx: RunContext):
    if "models" in ctx.cache:
        return ctx.cache["models"]
    from privalign.data.preferences_io import load_hh_rlhf_pairs
    from privalign.estimation.baselines import MLE
    from privalign.estimation.features import HashedNgramFeatures
    from privalign.estimation.preferences import PreferenceData

    pairs = load_hh_rlhf_pairs(limit=cfg["n_train"] + 400)
    fmap = HashedNgramFeatures(n_features=cfg["n_features"], ngram_range=(1, 2))
    ss = np.random.SeedSequence(cfg["seed"], spawn_key=(2**22,))
    prompts = list(pairs.prompts[: cfg["n_train"]]) + [CANARY_PROMPT]
    chosen = list(pairs.chosen[: cfg["n_train"]]) + [CANARY_CHOSEN]
    rejected = list(pairs.rejected[: cfg["n_train"]]) + [CANARY_REJECTED]
    data = PreferenceData.from_text_pairs(
        prompts, chosen, rejected, fmap, random_state=np.random.default_rng(ss)
    )
    n = cfg["n_train"]
    with_canary = MLE(alpha=cfg["alpha_l2"], feature_bound=1.0, clip=True).fit(data.X, data.y)
    without = MLE(alpha=cfg["alpha_l2"], feature_bound=1.0, clip=True).fit(data.X[:n], data.y[:n])
    # Candidate responses for the attacker's pool: held-out responses (not in training).
    cands = list(pairs.chosen[cfg["n_train"] :]) + list(pairs.rejected[cfg["n_train"] :])
    texts = [CANARY_CHOSEN] + cands
    phi = fmap.transform_pairs([CANARY_PROMPT] * len(texts), texts)
    s_d = np.asarray(with_canary.predict_reward(phi)).ravel()
    s_dp = np.asarray(without.predict_reward(phi)).ravel()
    mid = 0.5 * (s_d[0] + s_dp[0])
    order = np.argsort(np.abs(0.5 * (s_d[1:] + s_dp[1:]) - mid))[: cfg["pool_k"] - 1] + 1
    idx = np.concatenate([[0], order])
    lo, hi = cfg["score_low"], cfg["score_high"]
    pool_d = np.clip(s_d[idx], lo, hi) - lo
    pool_dp = np.clip(s_dp[idx], lo, hi) - lo
    ctx.cache["models"] = (pool_d, pool_dp, float(s_d[0]), float(s_dp[0]))
    return ctx.cache["models"]


def _run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.alignment import make_selector
    from privalign.audit.audit import epsilon_lower_bound

    pool_d, pool_dp, raw_d, raw_dp = _models(cfg, ctx)
    eps = cell["epsilon"]
    sel = (
        make_selector("bon")
        if eps is None
        else make_selector("privbon", epsilon=eps, r_max=cfg["score_high"] - cfg["score_low"])
    )
    p_d = float(sel.law(pool_d).probabilities[0])
    p_dp = float(sel.law(pool_dp).probabilities[0])
    rng = np.random.default_rng(ss)
    m = cfg["samples"]
    out_d = sel.select_batch(np.tile(pool_d, (m, 1)), rng=rng).indices
    out_dp = sel.select_batch(np.tile(pool_dp, (m, 1)), rng=rng).indices
    k = cfg["pool_k"]
    cd = np.bincount(out_d, minlength=k)
    cdp = np.bincount(out_dp, minlength=k)
    audit = epsilon_lower_bound(
        cd, cdp, m, m, alpha=cfg["alpha"], claimed_epsilon=math.inf if eps is None else eps
    )
    rows = [
        {
            "kind": "attack",
            "service": cell["service"],
            "epsilon_claimed": eps,
            "p_canary_D": p_d,
            "p_canary_D_prime": p_dp,
            "raw_score_D": raw_d,
            "raw_score_D_prime": raw_dp,
            "eps_lower_bound": audit.epsilon_lower_bound,
            "audit_alpha": cfg["alpha"],
            "samples": m,
            "advantage": binomial_tv(max(cfg["queries"]), p_d, p_dp),
            "Q_max": max(cfg["queries"]),
            "audit_verdict": audit.verdict,
        }
    ]
    for q in cfg["queries"]:
        rows.append(
            {
                "kind": "advantage",
                "service": cell["service"],
                "epsilon_claimed": eps,
                "Q": q,
                "advantage": binomial_tv(q, p_d, p_dp),
                "composed_epsilon": None if eps is None else q * eps,
            }
        )
    return rows


def _summarize(records: list[dict], cfg: dict) -> dict:
    att = [r for r in records if r["kind"] == "attack"]
    return {
        "table": [
            {
                "service": r["service"],
                "epsilon_claimed": r["epsilon_claimed"],
                "eps_lower_bound": r["eps_lower_bound"],
                "audit": r["audit_verdict"],
                "p_canary_D": r["p_canary_D"],
                "p_canary_D_prime": r["p_canary_D_prime"],
                f"advantage_Q={r['Q_max']}": r["advantage"],
            }
            for r in att
        ],
        "canary_score_shift": (att[0]["raw_score_D"] - att[0]["raw_score_D_prime"]) if att else None,
    }


def _plot(run_dir: Path) -> list[str]:
    from matplotlib.ticker import NullFormatter

    from privalign.experiments.plotting import new_figure, save_figure

    recs = read_results(run_dir)
    if not recs:
        return []
    fig, (ax1, ax2) = new_figure(2, 1, width=5.6, height=4.2)
    services = sorted(
        {(r["service"], r["epsilon_claimed"] or math.inf) for r in recs if r["kind"] == "advantage"},
        key=lambda t: (t[0], t[1]),
    )
    for svc, e in services:
        rows = sorted(
            [
                r
                for r in recs
                if r["kind"] == "advantage"
                and r["service"] == svc
                and (r["epsilon_claimed"] or math.inf) == e
            ],
            key=lambda r: r["Q"],
        )
        plain = svc == method_label("bon")
        lab = "BoN (no privacy)" if plain else f"PrivBoN ε={e:g}/query"
        kw = {"color": "#d62728"} if plain else {}
        ax1.plot([r["Q"] for r in rows], [r["advantage"] for r in rows], marker="o", label=lab, **kw)
    ax1.set_xscale("log")
    ax1.set_ylim(-0.02, 1.02)
    ax1.set_xlabel("repeated queries Q (log scale)")
    ax1.set_ylabel("membership advantage (TPR − FPR, exact)")
    ax1.set_title("Repeated-query attack on one preference record", fontsize=11)
    ax1.legend(loc="best", fontsize=8)
    att = of_method(recs, "privbon", key="service", kind="attack")
    att.sort(key=lambda r: r["epsilon_claimed"])
    if att:
        xs = [r["epsilon_claimed"] for r in att]
        ax2.plot(xs, xs, "k--", label="claimed ε (per query)")
        ax2.plot(
            xs,
            [r["eps_lower_bound"] for r in att],
            "o-",
            color="#2ca02c",
            label=f"audit lower bound (α = {att[0]['audit_alpha']:g}, {att[0]['samples']} draws/side)",
        )
        bon = of_method(recs, "bon", key="service", kind="attack")
        if bon:
            ax2.axhline(
                bon[0]["eps_lower_bound"],
                color="#d62728",
                linestyle=":",
                label=f"BoN audit lower bound = {bon[0]['eps_lower_bound']:.2f}",
            )
        ax2.set_xscale("log")
        ax2.set_xticks(xs, [f"{v:g}" for v in xs])
        ax2.xaxis.set_minor_formatter(NullFormatter())
        ax2.set_xlabel("claimed ε per query (log scale)")
        ax2.set_ylabel("ε")
        ax2.set_title("Audit: empirical ε lower bound vs claim", fontsize=11)
        ax2.legend(loc="best", fontsize=8)
    return [save_figure(fig, run_dir, "membership")]


# ---------------------------------------------------------------------------------------------------
# beyond-train-vs-inference
# ---------------------------------------------------------------------------------------------------


def _tvi_schema() -> dict[str, Field]:
    return {
        "seed": Field("int", 42, "root seed", low=0),
        "n": Field("int", 5000, "preference pairs used to train the reward model", low=10),
        "d": Field("int", 500, "feature dimension", low=1),
        "s_star": Field("int", 10, "true sparsity", low=1),
        "theta_norm": Field("float", 3.0, "‖θ*‖₂", low=0.0),
        "epsilon_total": Field(
            "float", 2.0, "total ε over all T queries (and for the DP-trained model)", low=1e-12
        ),
        "delta_total": Field("float", 1e-5, "total δ", low=1e-300),
        "T_grid": Field("list[int]", [1, 10, 100, 1000, 10000], "numbers of queries T", low=1),
        "N": Field("int", 16, "candidates per query", low=1),
        "eval_queries": Field("int", 300, "queries used to measure the value", low=2),
        "score_low": Field("float", -3.0, "PrivBoN public clipping range of the reward, low end"),
        "score_high": Field("float", 3.0, "high end (Δ_r = high − low)"),
    }


def _tvi_preflight(cfg: dict, ctx: RunContext) -> None:
    from privalign.experiments.base import ExperimentError

    if cfg["s_star"] > cfg["d"]:
        raise ExperimentError(f"Configuration: s_star ({cfg['s_star']}) exceeds d ({cfg['d']}).")
    if not cfg["score_high"] > cfg["score_low"]:
        raise ExperimentError("Configuration: score_high must exceed score_low.")


def _tvi_cells(cfg: dict, ctx: RunContext) -> list[dict]:
    return [{"cell": f"T={t}", "T": t} for t in cfg["T_grid"]]


def _tvi_setup(cfg: dict, ctx: RunContext):
    if "tvi" in ctx.cache:
        return ctx.cache["tvi"]
    from privalign.estimation.iht import IHT, SampleDPIHT
    from privalign.estimation.synthetic import make_btl

    s_data, s_est, s_eval = np.random.SeedSequence(cfg["seed"], spawn_key=(2**23,)).spawn(3)
    prob = make_btl(
        cfg["n"],
        cfg["d"],
        cfg["s_star"],
        theta_norm=cfg["theta_norm"],
        random_state=np.random.default_rng(s_data),
    )
    nonpriv = IHT(sparsity=cfg["s_star"], feature_bound=1.0).fit(prob.X, prob.y)
    dp = SampleDPIHT(
        epsilon=cfg["epsilon_total"],
        delta=cfg["delta_total"],
        sparsity=cfg["s_star"],
        feature_bound=1.0,
        random_state=np.random.default_rng(s_est),
    ).fit(prob.X, prob.y)
    g = np.random.default_rng(s_eval)
    phi = g.uniform(-1.0, 1.0, size=(cfg["eval_queries"], cfg["N"], cfg["d"]))
    true = phi @ prob.theta_star
    ctx.cache["tvi"] = (phi, true, phi @ nonpriv.coef_, phi @ dp.coef_, dp.privacy_event_.to_dict())
    return ctx.cache["tvi"]


def _tvi_run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    """Value (true-reward lift of the selected candidate over a random one) for T queries at total (ε, δ).

    PrivBoN's per-query ε is the larger of ε_total/T (pure composition) and √(8ρ/T) with ρ the largest
    zCDP budget whose conversion is ≤ ε_total at δ_total (T·ε_q²/8 ≤ ρ); both are valid.
    """
    from privalign.accounting.conversions import approx_dp_to_zcdp
    from privalign.alignment.laws import bon_law, softmax_law
    from privalign.alignment.priv_bon import privbon_scale

    phi, true, s_np, s_dp, dp_event = _tvi_setup(cfg, ctx)
    t = cell["T"]
    rho = approx_dp_to_zcdp(cfg["epsilon_total"], cfg["delta_total"])
    eps_pure, eps_z = cfg["epsilon_total"] / t, math.sqrt(8 * rho / t)
    eps_q = max(eps_pure, eps_z)
    delta_r = cfg["score_high"] - cfg["score_low"]
    clipped = np.clip(s_np, cfg["score_low"], cfg["score_high"]) - cfg["score_low"]
    base = true.mean(axis=1)
    rows = []
    for method, law, note, per_query in (
        ("non-private RM + BoN", bon_law(s_np), "no privacy (reference)", None),
        (
            "DP reward model + BoN",
            bon_law(s_dp),
            f"({cfg['epsilon_total']:g}, {cfg['delta_total']:g})-DP once (post-processing)",
            None,
        ),
        (
            method_label("privbon"),
            softmax_law(clipped, privbon_scale(eps_q, delta_r)),
            f"ε_q = {eps_q:.4g} per query ({'zCDP' if eps_z >= eps_pure else 'pure'} composition over T)",
            eps_q,
        ),
    ):
        v = (law * true).sum(axis=1) - base
        rows.append(
            {
                "method": method,
                "T": t,
                "value": float(v.mean()),
                "value_se": float(v.std(ddof=1) / math.sqrt(len(v))),
                "value_pq": [float(x) for x in v],  # per evaluation query: B-1's paired test
                "per_query_epsilon": per_query,
                "privacy": note,
                "oracle": float((true.max(axis=1) - base).mean()),
            }
        )
    rows[1]["dp_event"] = dp_event
    return rows


def _tvi_summarize(records: list[dict], cfg: dict) -> dict:
    return {
        "table": [
            {
                "T": r["T"],
                "method": r["method"],
                "value": r["value"],
                "se": r["value_se"],
                "per_query_epsilon": r["per_query_epsilon"],
            }
            for r in sorted(records, key=lambda r: (r["T"], r["method"]))
        ],
        "epsilon_total": cfg["epsilon_total"],
        "delta_total": cfg["delta_total"],
    }


def _tvi_plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import new_figure, save_figure

    recs = read_results(run_dir)
    if not recs:
        return []
    fig, (ax,) = new_figure(1, 1, width=6.4, height=4.4)
    colors = {
        "non-private RM + BoN": "#7f7f7f",
        "DP reward model + BoN": "#2ca02c",
        method_label("privbon"): "#ff7f0e",
    }
    for m in colors:
        rows = sorted([r for r in recs if r["method"] == m], key=lambda r: r["T"])
        if rows:
            ax.errorbar(
                [r["T"] for r in rows],
                [r["value"] for r in rows],
                yerr=[r["value_se"] for r in rows],
                marker="o",
                capsize=3,
                color=colors[m],
                label=m,
            )
    ax.axhline(recs[0]["oracle"], color="black", linestyle=":", label="oracle (best true reward)")
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=0.8, label="random candidate")
    ax.set_xscale("log")
    ax.set_xlabel("queries T answered under the same total (ε, δ) (log scale)")
    ax.set_ylabel("true-reward lift over a random candidate")
    ax.set_title("Train-time vs inference-time privacy", fontsize=11)
    ax.legend(loc="best", fontsize=8, title="±1 SE over evaluation queries", title_fontsize=8)
    return [save_figure(fig, run_dir, "train_vs_inference")]


EXPERIMENTS: dict[str, Experiment] = {
    "beyond-train-vs-inference": Experiment(
        "beyond-train-vs-inference",
        "Train-time (DP reward model) vs inference-time (PrivBoN) privacy over T queries",
        "beyond",
        _tvi_schema(),
        _tvi_preflight,
        _tvi_cells,
        _tvi_run_cell,
        _tvi_summarize,
        _tvi_plot,
    ),
    "beyond-membership": Experiment(
        "beyond-membership",
        "Membership inference by repeated queries: BoN vs PrivBoN, with the audit's ε bound",
        "beyond",
        _schema(),
        _preflight,
        _cells,
        _run_cell,
        _summarize,
        _plot,
    ),
}
