"""Does best-of-N on the proxy over-optimise it? Exact BoN curves of a scored pool.

For a prompt with ``m`` candidates sorted by proxy reward (ties broken uniformly at random, i.e. averaged),
BoN over ``N`` candidates drawn without replacement selects the candidate of ascending rank ``i`` with
probability ``C(i, N−1) / C(m, N)``. The expected gold (true) reward of the selection is computed exactly
from that law, per prompt, and averaged over prompts (with the standard error across prompts).

Whether the gold reward *falls* at large N is decided per prompt, paired: the exact per-prompt differences
between the largest N and each smaller N go through an exact one-sided sign test, Bonferroni-corrected over
the compared Ns (:func:`bon_curve`). The verdict is three-way ("holds": the gold falls; "does not hold": at
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
from scipy.special import gammaln

from privalign.errors import DataFormatError

__all__ = ["bon_selection_law", "bon_curve", "write_bon_report", "kl_bon", "sign_test_power"]


def kl_bon(N: int) -> float:
    """The standard analytic KL of best-of-N from the base policy, ``log N − (N − 1)/N`` (nats; Stiennon et
    al., 2020). It is an upper bound of the true KL and exact for continuous, tie-free rewards; the BoN plots
    use it as their x-axis (reward-model over-optimisation studies plot gold reward against it)."""
    if N < 1:
        raise ValueError(f"N must be >= 1; got {N}")
    return float(np.log(N) - (N - 1) / N)


def bon_selection_law(m: int, N: int) -> np.ndarray:
    """P(BoN over N of m selects ascending rank i), i = 0..m−1 (no ties)."""
    if not 1 <= N <= m:
        raise ValueError(f"N must be in [1, {m}]; got {N}")
    i = np.arange(m)
    with np.errstate(invalid="ignore"):
        logp = np.where(
            i >= N - 1,
            gammaln(i + 1)
            - gammaln(N)
            - gammaln(i - N + 2)
            - (gammaln(m + 1) - gammaln(N + 1) - gammaln(m - N + 1)),
            -np.inf,
        )
    p = np.exp(logp)
    return p / p.sum()


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


def _verdict(tests: list[dict[str, Any]], level: float, margin: float, alpha: float, n: int) -> str:
    """Three-way verdict on "the gold reward falls at the largest N" (see :func:`bon_curve`)."""
    if any(t["sign_test_p"] <= level for t in tests):
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
    records: list, Ns: list[int] | None = None, *, alpha: float = 0.05, margin_fraction: float = 0.1
) -> dict[str, Any]:
    """Expected proxy and true reward of BoN(N) on each prompt; means and standard errors over prompts.

    Over-optimisation test (paired, per prompt): for every N below the largest ``N_max``, the difference
    ``D_p = E[true | BoN(N_max)] − E[true | BoN(N)]`` is computed exactly for each prompt p; an exact
    one-sided sign test asks whether the D_p tend to be negative (the largest N picks *worse* texts by the
    gold reward). ``overoptimized`` is true iff some N passes at level ``alpha`` after a Bonferroni
    correction over the compared Ns (family-wise false-positive rate ≤ ``alpha``).

    ``verdict`` on the claim "the gold reward falls at large N" (over-optimisation):

    * ``"holds"``: ``overoptimized`` (the sign test above; false-positive rate ≤ ``alpha``).
    * ``"does not hold"``: for *every* smaller N, the one-sided (1 − ``alpha``) lower confidence bound of the
      mean paired difference (Student t with exact critical value, n − 1 degrees of freedom) is above
      ``−margin``, where ``margin = margin_fraction × |E[gold | BoN(N_max)] − E[gold | BoN(1)]|`` (a fall
      smaller than that share of the BoN gold lift is treated as no fall). This is an intersection–union
      test: every comparison must pass at level ``alpha``, so the chance of "does not hold" when the gold
      does fall by more than the margin at some N is ≤ ``alpha`` (up to the t approximation of the mean).
    * ``"inconclusive"`` otherwise.

    ``power`` is the sign test's exact power at the Bonferroni level (:func:`sign_test_power`).
    """
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
            }
        )
    level = alpha / max(len(tests), 1)
    margin = margin_fraction * abs(last["true_mean"] - rows[0]["true_mean"])
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
        "overoptimized": any(t["sign_test_p"] <= level for t in tests),
        "verdict": _verdict(tests, level, margin, alpha, n),
        "verdict_rule": (
            f"holds if some N < N_max has gold(N_max) < gold(N) by the exact one-sided sign test at "
            f"{alpha:g}/{len(tests)} (Bonferroni); does not hold if at every N < N_max the one-sided "
            f"{1 - alpha:g} t lower bound of the paired mean of gold(N_max) − gold(N) "
            f"(t_crit = {t_crit:.3g}, {n - 1} df) exceeds −{margin_fraction:g} × |gold(N_max) − gold(1)| "
            f"= −{margin:.3g}; else inconclusive"
        ),
        "margin": margin,
        "t_crit": t_crit,
        "power": sign_test_power(n, level),
    }


def _label(pool: Path) -> str:
    from privalign.pipeline.build_pool import manifest_path

    mp = manifest_path(pool)
    if mp.is_file():
        man = json.loads(mp.read_text(encoding="utf-8"))
        name = lambda s: Path(str(s)[7:]).stem if str(s).startswith("linear:") else str(s)  # noqa: E731
        return f"proxy {name(man.get('proxy_reward'))} / gold {name(man.get('true_reward'))}"
    return pool.name


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
