"""Does best-of-N on the proxy over-optimise it? Exact BoN curves of a scored pool.

For a prompt with ``m`` candidates sorted by proxy reward (ties broken uniformly at random, i.e. averaged),
BoN over ``N`` candidates drawn without replacement selects the candidate of ascending rank ``i`` with
probability ``C(i, N−1) / C(m, N)``. The expected gold (true) reward of the selection is computed exactly
from that law, per prompt, and averaged over prompts (with the standard error across prompts).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import gammaln

__all__ = ["bon_selection_law", "bon_curve", "write_bon_report"]


def bon_selection_law(m: int, N: int) -> np.ndarray:
    """P(BoN over N of m selects ascending rank i), i = 0..m−1 (no ties)."""
    if not 1 <= N <= m:
        raise ValueError(f"N must be in [1, {m}]; got {N}")
    i = np.arange(m)
    with np.errstate(invalid="ignore"):
        logp = np.where(
            i >= N - 1,
            gammaln(i + 1) - gammaln(N) - gammaln(i - N + 2) - (gammaln(m + 1) - gammaln(N + 1) - gammaln(m - N + 1)),
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


def bon_curve(records: list, Ns: list[int] | None = None) -> dict[str, Any]:
    """Expected proxy and true reward of BoN(N) on each prompt; means and standard errors over prompts."""
    proxies = [np.asarray([r.proxy_reward for r in rec.responses], dtype=float) for rec in records]
    trues = [np.asarray([r.true_value for r in rec.responses], dtype=float) for rec in records]
    m = min(len(p) for p in proxies)
    Ns = Ns or [2**k for k in range(int(np.log2(m)) + 1)]
    rows = []
    for N in Ns:
        t = np.array([_expected_true(p[:m], tr[:m], N) for p, tr in zip(proxies, trues)])
        pr = np.array([_expected_true(p[:m], p[:m], N) for p in proxies])
        rows.append({"N": N, "true_mean": float(t.mean()), "true_se": float(t.std(ddof=1) / np.sqrt(len(t))) if len(t) > 1 else None,
                     "proxy_mean": float(pr.mean())})
    best = max(rows, key=lambda r: r["true_mean"])
    last = rows[-1]
    return {"num_prompts": len(records), "candidates_used": m, "curve": rows, "argmax_N_true": best["N"],
            "peak_true": best["true_mean"], "true_at_max_N": last["true_mean"],
            "drop_from_peak": best["true_mean"] - last["true_mean"],
            "corr_proxy_true": float(np.corrcoef(np.concatenate([p[:m] for p in proxies]), np.concatenate([t[:m] for t in trues]))[0, 1])}


def write_bon_report(pool: str | os.PathLike, out_prefix: str | os.PathLike) -> dict[str, Any]:
    """Compute :func:`bon_curve` for a pool file; write ``<prefix>.json`` and ``<prefix>.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from privalign.data.pools import read_pool

    res = bon_curve(read_pool(pool))
    res["pool"] = Path(pool).name
    out_prefix = Path(out_prefix)
    Path(f"{out_prefix}.json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    Ns = [r["N"] for r in res["curve"]]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    ax[0].plot(Ns, [r["proxy_mean"] for r in res["curve"]], "o-")
    ax[0].set(xscale="log", xlabel="N", ylabel="E[proxy of BoN pick]", title="proxy (VADER)")
    m = np.array([r["true_mean"] for r in res["curve"]])
    se = np.array([r["true_se"] or 0.0 for r in res["curve"]])
    ax[1].errorbar(Ns, m, yerr=se, fmt="o-")
    ax[1].set(xscale="log", xlabel="N", ylabel="E[gold of BoN pick]", title="gold reward")
    fig.suptitle(f"BoN on the proxy, {res['num_prompts']} prompts x {res['candidates_used']} candidates")
    fig.tight_layout()
    fig.savefig(f"{out_prefix}.png", dpi=100)
    plt.close(fig)
    return res
