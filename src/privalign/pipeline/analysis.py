"""Does best-of-N on the proxy over-optimise it? Exact BoN curves of a scored pool.

For a prompt with ``m`` candidates sorted by proxy reward (ties broken uniformly at random, i.e. averaged),
BoN over ``N`` candidates drawn without replacement selects the candidate of ascending rank ``i`` with
probability ``C(i, N−1) / C(m, N)``. The expected gold (true) reward of the selection is computed exactly
from that law, per prompt, and averaged over prompts (with the standard error across prompts).

Whether the gold reward *falls* at large N is decided per prompt, paired: the exact per-prompt differences
between the largest N and each smaller N go through a one-sided paired max-t test over all N jointly (sign
flips of whole prompts; per-N Wilcoxon signed-rank and exact sign tests, Bonferroni-corrected over the
compared Ns, are reported beside it) (:func:`bon_curve`). The verdict is three-way ("holds": the gold falls;
"does not hold": at
every smaller N the gold at N_max is non-inferior within a margin; else "inconclusive"), with the sign
test's exact power. ``privalign bon-curve`` runs it on one or more pools.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from privalign.errors import DataFormatError

__all__ = [
    "bon_report_lines",
    "bon_selection_law",
    "bon_curve",
    "write_bon_report",
    "kl_bon",
    "sign_test_power",
    "wilcoxon_power",
    "max_t_signflip",
]


def kl_bon(N: int) -> float:
    """The standard analytic KL of best-of-N from the base policy, ``log N − (N − 1)/N`` (nats; Stiennon et
    al., 2020). It is an upper bound of the true KL and exact for continuous, tie-free rewards; the BoN plots
    use it as their x-axis (reward-model over-optimisation studies plot gold reward against it)."""
    if N < 1:
        raise ValueError(f"N must be >= 1; got {N}")
    return float(np.log(N) - (N - 1) / N)


def bon_selection_law(m: int, N: int) -> np.ndarray:
    """P(BoN over N of m selects ascending rank i), i = 0..m−1 (no ties)."""
    from privalign.alignment.capacity import rank_selection_law

    return rank_selection_law(m, N)


def _expected_true(proxy: np.ndarray, true: np.ndarray, N: int) -> float:
    order = np.argsort(proxy, kind="stable")
    ps, ts = proxy[order], true[order]
    law = bon_selection_law(len(ps), N)
    # average the true reward over proxy ties (a uniform tie-break)
    _, inv, counts = np.unique(ps, return_inverse=True, return_counts=True)
    tie_mean = np.bincount(inv, weights=ts) / counts
    return float(law @ tie_mean[inv])


def _sign_test_p(diffs: np.ndarray) -> float:
    """Exact one-sided sign-test p-value for H1 "the differences tend to be negative" (zeros dropped)."""
    from scipy.stats import binom

    nz = diffs[diffs != 0]
    if nz.size == 0:
        return 1.0
    k = int((nz < 0).sum())
    return float(binom.sf(k - 1, nz.size, 0.5))  # P(K >= k) under H0: K ~ Bin(n, 1/2)


def sign_test_power(n: int, level: float, fractions: tuple[float, ...] = (0.75, 0.9)) -> dict[str, Any]:
    """Exact power of the one-sided sign test on ``n`` nonzero paired differences at ``level``.

    ``k_crit`` is the smallest count of negative differences whose exact p-value ``P(Bin(n, 1/2) ≥ k)`` is
    ≤ ``level`` (``None`` when no count reaches it: the test can never reject); the power against "a
    fraction q of prompts fall" is ``P(Bin(n, q) ≥ k_crit)``, computed exactly for each q in ``fractions``.
    """
    from scipy.stats import binom

    k_crit = next((k for k in range(n + 1) if binom.sf(k - 1, n, 0.5) <= level), None)
    power = {f"{q:g}": (0.0 if k_crit is None else float(binom.sf(k_crit - 1, n, q))) for q in fractions}
    return {"n": n, "level": level, "k_crit": k_crit, "power_if_fraction_falls": power}


def _wilcoxon_p(diffs: np.ndarray) -> float:
    """One-sided Wilcoxon signed-rank p-value for H1 "the differences tend to be negative" (zeros dropped;
    scipy's exact null distribution when it applies, else its normal approximation)."""
    from scipy.stats import wilcoxon

    nz = diffs[diffs != 0]
    if nz.size == 0:
        return 1.0
    return float(wilcoxon(nz, alternative="less").pvalue)


def _signed_rank_null(n: int) -> np.ndarray:
    """Exact null law of the Wilcoxon statistic W+ (sum of the ranks of positive differences), n no ties."""
    law = np.zeros(n * (n + 1) // 2 + 1)
    law[0] = 1.0
    for k in range(1, n + 1):
        law[k:] = 0.5 * law[k:] + 0.5 * law[:-k].copy()
        law[:k] *= 0.5
    return law


def wilcoxon_power(
    n: int, level: float, fractions: tuple[float, ...] = (0.75, 0.9), *, reps: int = 4000, seed: int = 0
) -> dict[str, Any]:
    """Power of the one-sided Wilcoxon signed-rank test (exact critical value) on ``n`` paired differences.

    The critical value ``w_crit`` is the largest W+ whose exact lower-tail probability is ≤ ``level`` (None:
    the test can never reject). The power against "a fraction q of prompts fall" is estimated by Monte Carlo
    (``reps`` draws, seeded ``numpy.random.Generator(seed)``) under a normal location shift with that
    fraction below zero: D ~ N(−Φ⁻¹(q), 1). It is an estimate (Monte Carlo s.e. ≤ 0.5/√reps).
    """
    from scipy.stats import norm, rankdata

    if n < 1:
        return {
            "n": n,
            "level": level,
            "w_crit": None,
            "power_if_fraction_falls": {f"{q:g}": 0.0 for q in fractions},
        }
    cdf = np.cumsum(_signed_rank_null(n))
    ok = np.nonzero(cdf <= level)[0]
    w_crit = int(ok[-1]) if ok.size else None
    rng = np.random.default_rng(seed)
    power = {}
    for q in fractions:
        if w_crit is None:
            power[f"{q:g}"] = 0.0
            continue
        d = rng.normal(-float(norm.ppf(q)), 1.0, size=(reps, n))
        r = rankdata(np.abs(d), axis=1)
        w_plus = (r * (d > 0)).sum(axis=1)
        power[f"{q:g}"] = float(np.mean(w_plus <= w_crit))
    return {"n": n, "level": level, "w_crit": w_crit, "power_if_fraction_falls": power, "reps": reps}


def _flip_t(D: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Paired t statistics of every column of ``D`` (prompts × comparisons) under each row of sign flips."""
    n = D.shape[0]
    means = signs @ D / n  # (B, k)
    ss = (D**2).sum(axis=0)  # a sign flip leaves every square unchanged
    var = np.maximum(ss - n * means**2, 0.0) / (n - 1)
    se = np.sqrt(var / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(se > 0, means / np.where(se > 0, se, 1.0), 0.0)


def max_t_signflip(
    D: np.ndarray, *, alpha: float = 0.05, reps: int = 10_000, random_state: np.random.Generator | None = None
) -> dict[str, Any]:
    """One-sided paired test that *some* column of ``D`` (prompts × comparisons, the per-prompt
    differences gold(N_max) − gold(N) for each smaller N) has a negative mean, controlling the family-wise
    error rate over the columns jointly: the statistic is the smallest paired t over the columns, its null
    law is that of random sign flips of whole prompts (each prompt's row of differences is symmetric about
    zero under the null: an exchangeability assumption, the same as the Wilcoxon test's), estimated with
    ``reps`` flips drawn from ``random_state`` (default ``numpy.random.default_rng(0)``). The p-value
    ``(1 + #{flips at least as extreme}) / (1 + reps)`` is valid at any ``reps``. Unlike Bonferroni over
    the columns it uses their strong correlation (the same prompts at neighbouring N), so it loses little
    power to the number of Ns compared.

    Returns ``p``, the observed ``t`` per column, the critical value ``t_crit`` (the α-quantile of the
    flipped minima) and ``detectable_fall`` (per column, ``(|t_crit| + z_0.8)·SE``: the mean fall the test
    detects with probability ≈ 0.8 at that SE).
    """
    from scipy.stats import norm

    D = np.asarray(D, dtype=float)
    n, k = D.shape
    if n < 2 or k < 1:
        return {"p": 1.0, "t": [], "t_crit": None, "detectable_fall": [], "reps": 0}
    rng = random_state if random_state is not None else np.random.default_rng(0)
    t_obs = _flip_t(D, np.ones((1, n)))[0]
    mins = np.concatenate(
        [
            _flip_t(D, rng.choice([-1.0, 1.0], size=(min(2000, reps - b), n))).min(axis=1)
            for b in range(0, reps, 2000)
        ]
    )
    p = (1 + int((mins <= t_obs.min() + 1e-12).sum())) / (1 + reps)
    t_crit = float(np.quantile(mins, alpha))
    se = D.std(axis=0, ddof=1) / np.sqrt(n)
    z80 = float(norm.ppf(0.8))
    return {
        "p": float(p),
        "t": [float(x) for x in t_obs],
        "t_crit": t_crit,
        "detectable_fall": [float((abs(t_crit) + z80) * x) for x in se],
        "reps": reps,
    }


def _verdict(tests: list[dict[str, Any]], joint_p: float, margin: float, alpha: float, n: int) -> str:
    """Three-way verdict on "the gold reward falls at the largest N" (see :func:`bon_curve`)."""
    if joint_p <= alpha:
        return "holds"
    if n >= 2 and tests and all(t["lower_bound"] > -margin for t in tests):
        return "does not hold"
    return "inconclusive"


def _corr(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson correlation, or None when either side is constant."""
    if np.std(a) == 0 or np.std(b) == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def bon_curve(
    records: list,
    Ns: list[int] | None = None,
    *,
    alpha: float = 0.05,
    margin_fraction: float = 0.1,
    random_state: np.random.Generator | None = None,
) -> dict[str, Any]:
    """Expected proxy and true reward of BoN(N) on each prompt; means and standard errors over prompts.

    Over-optimisation test (paired, per prompt): for every N below the largest ``N_max``, the difference
    ``D_p = E[true | BoN(N_max)] − E[true | BoN(N)]`` is computed exactly for each prompt p; an exact
    one-sided test asks whether the D_p tend to be negative at *some* N (the largest N picks *worse* texts by
    the gold reward): the paired max-t test over all N jointly (:func:`max_t_signflip`: sign flips of whole
    prompts, family-wise false-positive rate ≤ ``alpha``, assuming each prompt's differences are symmetric
    about zero under the null). ``overoptimized`` is true iff it rejects. Beside it, per N, an exact sign
    test (no symmetry needed, little power on a few dozen prompts) and a Wilcoxon signed-rank test, each at
    ``alpha`` / (number of Ns) (Bonferroni), are reported.

    ``verdict`` on the claim "the gold reward falls at large N" (over-optimisation):

    * ``"holds"``: ``overoptimized`` (the max-t test above; false-positive rate ≤ ``alpha``).
    * ``"does not hold"``: for *every* smaller N, the one-sided (1 − ``alpha``) lower confidence bound of the
      mean paired difference (Student t with exact critical value, n − 1 degrees of freedom) is above
      ``−margin``, where ``margin = margin_fraction × |E[gold | BoN(N_max)] − E[gold | BoN(1)]|`` (a fall
      smaller than that share of the BoN gold lift is treated as no fall). This is an intersection–union
      test: every comparison must pass at level ``alpha``, so the chance of "does not hold" when the gold
      does fall by more than the margin at some N is ≤ ``alpha`` (up to the t approximation of the mean).
    * ``"inconclusive"`` otherwise.

    ``joint_test`` holds the max-t test (p, t per N, critical value, detectable fall at 80% power).
    ``power`` is the sign test's exact power at the Bonferroni level (:func:`sign_test_power`),
    ``wilcoxon_power`` the Wilcoxon test's (:func:`wilcoxon_power`). ``capacity`` is the pool's capacity
    diagnostic (:func:`privalign.alignment.capacity.capacity_diagnostic`): whether the pool *can* show a fall
    at the N it holds at all. ``random_state`` draws the max-t test's sign flips (default: a generator seeded
    with 0, so a pool's verdict is reproducible).
    """
    from privalign.alignment.capacity import capacity_diagnostic

    proxies = [np.asarray([r.proxy_reward for r in rec.responses], dtype=float) for rec in records]
    trues = [np.asarray([r.true_value for r in rec.responses], dtype=float) for rec in records]
    m = min(len(p) for p in proxies)
    Ns = Ns or [2**k for k in range(int(np.log2(m)) + 1)]
    per_prompt = np.array([[_expected_true(p[:m], tr[:m], N) for p, tr in zip(proxies, trues)] for N in Ns])
    rows: list[dict[str, Any]] = []
    for k, N in enumerate(Ns):
        t = per_prompt[k]
        pr = np.array([_expected_true(p[:m], p[:m], N) for p in proxies])
        rows.append(
            {
                "N": N,
                "kl_bon": kl_bon(N),
                "true_mean": float(t.mean()),
                "true_se": float(t.std(ddof=1) / np.sqrt(len(t))) if len(t) > 1 else None,
                "proxy_mean": float(pr.mean()),
            }
        )
    best = max(rows, key=lambda r: r["true_mean"])
    last = rows[-1]
    from scipy.stats import t as student_t

    n = len(records)
    t_crit = float(student_t.ppf(1 - alpha, n - 1)) if n > 1 else math.inf
    tests: list[dict[str, Any]] = []
    for k, N in enumerate(Ns[:-1]):
        D = per_prompt[-1] - per_prompt[k]
        se = float(D.std(ddof=1) / np.sqrt(len(D))) if len(D) > 1 else None
        tests.append(
            {
                "N": N,
                "mean_diff": float(D.mean()),
                "paired_se": se,
                "lower_bound": float(D.mean()) - t_crit * se if se is not None else -math.inf,
                "prompts_lower": int((D < 0).sum()),
                "prompts_higher": int((D > 0).sum()),
                "sign_test_p": _sign_test_p(D),
                "wilcoxon_p": _wilcoxon_p(D),
            }
        )
    level = alpha / max(len(tests), 1)
    margin = margin_fraction * abs(last["true_mean"] - rows[0]["true_mean"])
    joint = max_t_signflip(
        np.array([per_prompt[-1] - per_prompt[k] for k in range(len(Ns) - 1)]).T.reshape(n, len(Ns) - 1),
        alpha=alpha,
        random_state=np.random.default_rng(0) if random_state is None else random_state,
    )
    return {
        "num_prompts": len(records),
        "candidates_used": m,
        "curve": rows,
        "argmax_N_true": best["N"],
        "peak_true": best["true_mean"],
        "true_at_max_N": last["true_mean"],
        "drop_from_peak": best["true_mean"] - last["true_mean"],
        "corr_proxy_true": _corr(
            np.concatenate([p[:m] for p in proxies]), np.concatenate([t[:m] for t in trues])
        ),
        "paired_tests_vs_max_N": tests,
        "alpha": alpha,
        "bonferroni_level": level,
        "joint_test": joint,
        "overoptimized": bool(tests) and joint["p"] <= alpha,
        "verdict": _verdict(tests, joint["p"] if tests else 1.0, margin, alpha, n),
        "verdict_rule": (
            f"holds if some N < N_max has gold(N_max) < gold(N) by the one-sided paired max-t test over all "
            f"{len(tests)} N jointly (sign flips of whole prompts, family-wise α = {alpha:g}; per-N Wilcoxon "
            f"signed-rank and exact sign tests at {alpha:g}/{len(tests)} are reported beside it); does not "
            "hold if at every N < N_max the one-sided "
            f"{1 - alpha:g} t lower bound of the paired mean of gold(N_max) − gold(N) "
            f"(t_crit = {t_crit:.3g}, {n - 1} df) exceeds −{margin_fraction:g} × |gold(N_max) − gold(1)| "
            f"= −{margin:.3g}; else inconclusive"
        ),
        "margin": margin,
        "t_crit": t_crit,
        "power": sign_test_power(n, level),
        "wilcoxon_power": wilcoxon_power(n, level),
        "capacity": capacity_diagnostic(
            [p[:m] for p in proxies], [t[:m] for t in trues], n_max=Ns[-1], alpha=alpha
        ),
    }


def _label(pool: Path) -> str:
    from privalign.pipeline.build_pool import manifest_path

    mp = manifest_path(pool)
    if mp.is_file():
        man = json.loads(mp.read_text(encoding="utf-8"))
        name = lambda s: Path(str(s)[7:]).stem if str(s).startswith("linear:") else str(s)  # noqa: E731
        return f"proxy {name(man.get('proxy_reward'))} / gold {name(man.get('true_reward'))}"
    return pool.name


def _manifest_kind(pool: Path) -> str | None:
    """The ``pool_kind`` a pool's manifest declares (a planted control says ``planted-real``), else None."""
    from privalign.pipeline.build_pool import manifest_path

    mp = manifest_path(pool)
    if not mp.is_file():
        return None
    kind = json.loads(mp.read_text(encoding="utf-8")).get("pool_kind")
    return str(kind) if kind else None


def _require_gold(records: list, path: Path) -> None:
    """Every response has a gold reward (``true_reward``, else ``is_correct``): without one the curve is NaN
    and the over-optimisation verdict is meaningless (it read "not over-optimised")."""
    for i, rec in enumerate(records, start=1):
        for j, r in enumerate(rec.responses):
            if not math.isfinite(r.true_value):
                raise DataFormatError(
                    f"{path}: prompt {i}, field 'responses[{j}].true_reward' is missing (and no is_correct): "
                    "bon-curve needs a gold reward for every response; add one with 'privalign rescore-pool "
                    "--true-reward ...'"
                )


def write_bon_report(
    pools: str | os.PathLike | list[str | os.PathLike],
    out_prefix: str | os.PathLike,
    *,
    labels: list[str] | None = None,
    alpha: float = 0.05,
    margin_fraction: float = 0.1,
) -> dict[str, Any]:
    """Compute :func:`bon_curve` for one or more pools; write ``<prefix>.json`` and ``<prefix>.png``.

    With one pool the JSON is that pool's result (with ``pool`` added); with several it is
    ``{"series": [...]}``, one result per pool, labelled from its manifest (proxy / gold) unless ``labels``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from privalign.alignment.capacity import pool_kind_words
    from privalign.data.pools import read_pool

    paths = [Path(pools)] if isinstance(pools, (str, os.PathLike)) else [Path(p) for p in pools]
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"labels must have one entry per pool ({len(paths)}); got {len(labels)}")
    series = []
    for i, p in enumerate(paths):
        records = read_pool(p)
        _require_gold(records, p)
        res = bon_curve(records, alpha=alpha, margin_fraction=margin_fraction)
        res["pool"] = p.name
        res["label"] = labels[i] if labels else _label(p)
        res["pool_kind"] = pool_kind_words(_manifest_kind(p))
        series.append(res)
    out_prefix = Path(out_prefix)
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = series[0] if len(series) == 1 else {"series": series}
    Path(f"{out_prefix}.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    for res in series:
        kl = [kl_bon(r["N"]) for r in res["curve"]]
        ax[0].plot(kl, [r["proxy_mean"] for r in res["curve"]], "o-", label=res["label"])
        m = np.array([r["true_mean"] for r in res["curve"]])
        se = np.array([r["true_se"] or 0.0 for r in res["curve"]])
        tag = {"holds": " (over-optimised)", "does not hold": " (no fall)"}.get(res["verdict"], "")
        ax[1].errorbar(kl, m, yerr=se, fmt="o-", capsize=2, label=res["label"] + tag)
    top = series[0]["curve"]
    for a in ax:  # N on a secondary axis
        sec = a.secondary_xaxis("top")
        ticks = [r["N"] for r in top if r["N"] in (1, 4, 16, 64, 256, 1024, 4096)]
        sec.set_xticks([kl_bon(n) for n in ticks], labels=[str(n) for n in ticks])
        sec.set_xlabel("N", fontsize=8)
    ax[0].set(xlabel="KL_BoN = log N - (N-1)/N (nats)", ylabel="E[proxy of BoN pick]", title="proxy reward")
    ax[1].set(
        xlabel="KL_BoN = log N - (N-1)/N (nats)",
        ylabel="E[gold of BoN pick]",
        title="gold reward (± SE over prompts)",
    )
    handles, names = ax[1].get_legend_handles_labels()
    s0 = series[0]
    fig.suptitle(f"Best-of-N on the proxy: {s0['num_prompts']} prompts x {s0['candidates_used']} candidates")
    fig.legend(handles, names, loc="lower center", ncol=min(2, len(names)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * ((len(names) + 1) // 2), 1, 1))
    fig.savefig(f"{out_prefix}.png", dpi=100)
    plt.close(fig)
    return doc


def _falls(power: dict[str, Any]) -> str:
    return ", ".join(f"{v:.2f} if {float(q):.0%} fall" for q, v in power["power_if_fraction_falls"].items())


def _per_n_tests_text(res: dict[str, Any]) -> tuple[str, str]:
    """The Wilcoxon and sign-test parts of a series' line: smallest p (at which N) and power."""
    tests = res["paired_tests_vs_max_N"]
    t = min(tests, key=lambda r: r["sign_test_p"]) if tests else None
    extra = f"; smallest p = {t['sign_test_p']:.3g} (N_max vs N={t['N']})" if t else ""
    pw = res["power"]
    power = (
        f"; the sign test needs {pw['k_crit']} of {pw['n']} prompts lower (power " + _falls(pw) + ")"
        if pw["k_crit"] is not None
        else f"; the sign test cannot reject with {pw['n']} prompts (power 0)"
    )
    wt = min(tests, key=lambda r: r["wilcoxon_p"]) if tests else None
    wil = (
        f"; Wilcoxon signed-rank: smallest p = {wt['wilcoxon_p']:.3g} (N_max vs N={wt['N']}), power "
        + _falls(res["wilcoxon_power"])
        if wt
        else ""
    )
    return wil, f"sign test{extra.removeprefix(';')}{power}"


def bon_report_lines(res: dict[str, Any], alpha: float) -> list[str]:
    """Plain-text lines for a terminal about one pool's :func:`bon_curve` result (as
    :func:`write_bon_report` labels it): the gold's peak, the verdict with the joint max-t test, the per-N
    Wilcoxon and sign tests with their power, what 'does not hold' means, and the capacity reading."""
    from privalign.alignment.capacity import capacity_lines

    kind = f" on {res['pool_kind']}" if res.get("pool_kind") else ""
    jt = res["joint_test"]
    joint = (
        f"paired max-t over all N: p = {jt['p']:.3g} (critical t {jt['t_crit']:.3g}; detectable mean fall "
        f"at 80% power ≈ {max(jt['detectable_fall']):.3g})"
        if jt["t_crit"] is not None
        else "paired max-t over all N: too few prompts"
    )
    wil, sign = _per_n_tests_text(res)
    lines = [
        f"{res['label']}: gold peaks at N={res['argmax_N_true']} ({res['peak_true']:.4f}), at "
        f"N={res['curve'][-1]['N']}: {res['true_at_max_N']:.4f}; over-optimisation "
        f"{res['verdict'].upper()}{kind} (family-wise alpha={alpha}, margin {res['margin']:.3g}); "
        f"{joint}{wil}; {sign}"
    ]
    if res["verdict"] == "does not hold":
        can = {"can": "it can", "cannot": "it cannot", "unclear": "it is unclear whether it can"}
        lines.append(
            "  ('does not hold' is about this pool: best-of-N on this proxy does not lower this gold at the "
            f"N it holds; {can[res['capacity']['reading']]} show over-optimisation by the capacity reading "
            "below; it says nothing against reward hacking in general or against paper 1)"
        )
    return lines + capacity_lines(res["capacity"])
