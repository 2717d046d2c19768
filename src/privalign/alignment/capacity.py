"""Can a scored pool show reward over-optimisation at all? A capacity diagnostic, computed before any test.

Best-of-N on a proxy can only hurt the gold (true) reward at large N if, among the candidates the base
policy actually produces, the ones with the very highest proxy scores have *lower* gold than somewhat
lower-ranked ones: the proxy's error must be heavy-tailed relative to its signal, on candidates that appear
at a rate ``p`` with ``N·p ≳ 1``. When the errors are light-tailed (e.g. a linear n-gram proxy over short
responses of one base model), the top proxy ranks always carry the highest gold and no N the pool holds can
show a fall: an over-optimisation test on such a pool is "inconclusive" by construction, and saying so up
front is more useful than a long run.

:func:`capacity_diagnostic` measures, within each prompt (candidates ranked by proxy, ties sharing their
mid-rank, as best-of-N breaks ties uniformly):

* **gold by proxy-rank band**: the mean gold of the candidates whose proxy-rank quantile falls in each band
  (bottom half, 50–90 %, 90–99 %, 99–99.9 %, top 0.1 %; pooled over prompts, with counts and standard
  errors; a band is empty when the pool is too small to reach it);
* the **within-prompt correlation** of proxy and gold (mean over prompts);
* the **tail-vs-bulk slope**: the least-squares slope of (prompt-centred) gold on the within-prompt proxy
  z-score among the top 10 % of each prompt (tail) and among the rest (bulk);
* **BoN's gold at N_max against the linear prediction** ``mean gold + β·(E[proxy | BoN(N_max)] − mean
  proxy)``, ``β`` the within-prompt least-squares slope: exactly E[gold | BoN] when gold and proxy are jointly
  Gaussian (the conditional mean is then linear). BoN above the prediction means the tail is *better* than
  linear (nothing to hack); below means the top of the proxy is worse than the bulk's trend predicts.

The plain-words reading (``reading``) is one of:

* ``"can"``: the top reachable band's mean gold is below some lower band's, significantly (one-sided Welch
  t-test at ``alpha``, exact Student-t critical value with Welch–Satterthwaite degrees of freedom,
  Bonferroni over the lower bands compared);
* ``"cannot"``: gold rises through every non-empty band, the tail slope is not negative and BoN(N_max) is
  not significantly below the linear prediction (one-sided paired t over prompts at ``alpha``);
* ``"unclear"``: anything else (a downturn too small to confirm, or a flat tail).

The diagnostic is descriptive: it is not a test of any paper claim, and it reads only the pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats
from scipy.special import gammaln

__all__ = [
    "BANDS",
    "POOL_KINDS",
    "pool_kind_words",
    "rank_selection_law",
    "capacity_diagnostic",
    "capacity_lines",
]

#: The kinds of pool a paper-1 verdict can be about, as data (key → words in every verdict on such a pool):
#: a verdict on a pool whose hacks were planted shows that the pipeline and the rules *detect* hacking; only a
#: natural pool says something about best-of-N on real text.
POOL_KINDS: dict[str, str] = {
    "planted-synthetic": "planted synthetic",
    "planted-real": "planted real text",
    "natural": "natural real text",
    "synthetic": "synthetic (no planted hacks)",
}


def pool_kind_words(kind: str | None) -> str:
    """The words for a pool kind (``None`` or unknown: ``"natural real text"``, a built pool's default)."""
    return POOL_KINDS.get(kind or "natural", POOL_KINDS["natural"])


#: Proxy-rank quantile bands ``[lo, hi)`` (the last one includes 1).
BANDS: tuple[tuple[float, float], ...] = ((0.0, 0.5), (0.5, 0.9), (0.9, 0.99), (0.99, 0.999), (0.999, 1.0))


def rank_selection_law(m: int, N: int) -> np.ndarray:
    """P(best-of-N over N of m drawn without replacement selects ascending rank i), i = 0..m−1 (no ties):
    ``C(i, N−1) / C(m, N)``."""
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


def _bon_expectation(proxy: np.ndarray, value: np.ndarray, N: int) -> float:
    """E[value of the BoN(N) pick] on one prompt, ties in the proxy broken uniformly (averaged)."""
    order = np.argsort(proxy, kind="stable")
    ps, vs = proxy[order], value[order]
    _, inv, counts = np.unique(ps, return_inverse=True, return_counts=True)
    tie_mean = np.bincount(inv, weights=vs) / counts
    return float(rank_selection_law(len(ps), N) @ tie_mean[inv])


def _slope(x: np.ndarray, y: np.ndarray) -> float | None:
    if x.size < 3 or float(np.var(x)) == 0.0:
        return None
    xc = x - x.mean()
    return float((xc @ (y - y.mean())) / (xc @ xc))


def _welch_p(a: np.ndarray, b: np.ndarray) -> float | None:
    """One-sided Welch p-value of H1 "mean(a) < mean(b)" (None when either side has < 2 values)."""
    if a.size < 2 or b.size < 2:
        return None
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0.0:
        return 0.0 if a.mean() < b.mean() else 1.0
    df = (va + vb) ** 2 / ((va**2) / (a.size - 1) + (vb**2) / (b.size - 1))
    return float(stats.t.cdf((a.mean() - b.mean()) / se, df))


def capacity_diagnostic(
    proxies: Sequence[Any],
    golds: Sequence[Any],
    *,
    n_max: int | None = None,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """The capacity diagnostic of a pool (see the module docstring).

    Args:
      proxies, golds: Per prompt, the proxy and gold rewards of its candidates (same lengths per prompt).
      n_max: The largest N considered (default: the smallest number of candidates of a prompt).
      alpha: False-positive rate of the downturn test behind the reading ``"can"``.

    Returns:
      A JSON-able dict: ``bands`` (``lo``, ``hi``, ``count``, ``gold_mean``, ``gold_se``),
      ``within_prompt_r``,
      ``slope_bulk``, ``slope_tail``, ``bon_gold_at_n_max``, ``linear_prediction``, ``downturn`` (the
      top band against the best lower band: means and p-value), ``reading`` and ``text`` (plain words).
    """
    P = [np.asarray(p, dtype=float) for p in proxies]
    G = [np.asarray(g, dtype=float) for g in golds]
    if not P or len(P) != len(G) or any(p.shape != g.shape or p.size < 2 for p, g in zip(P, G)):
        raise ValueError("proxies and golds must be non-empty, of equal shapes, with >= 2 candidates each")
    m = min(p.size for p in P)
    n_max = m if n_max is None else int(n_max)
    if not 1 <= n_max <= m:
        raise ValueError(f"n_max must be in [1, {m}]; got {n_max}")
    us, gs, gc, zs, rs = [], [], [], [], []
    bon, pred = [], []
    for p, g in zip(P, G):
        u = (stats.rankdata(p, method="average") - 0.5) / p.size
        us.append(u)
        gs.append(g)
        gc.append(g - g.mean())
        sd = p.std()
        zs.append((p - p.mean()) / sd if sd > 0 else np.zeros_like(p))
        if sd > 0 and g.std() > 0:
            rs.append(float(np.corrcoef(p, g)[0, 1]))
        beta = float(np.cov(p, g, bias=True)[0, 1] / p.var()) if sd > 0 else 0.0
        bon.append(_bon_expectation(p, g, n_max))
        pred.append(g.mean() + beta * (_bon_expectation(p, p, n_max) - p.mean()))
    u, g, gcen, z = (np.concatenate(x) for x in (us, gs, gc, zs))
    bands: list[dict[str, Any]] = []
    for k, (lo, hi) in enumerate(BANDS):
        sel = (u >= lo) & ((u < hi) if k < len(BANDS) - 1 else (u <= hi))
        vals = g[sel]
        bands.append(
            {
                "lo": lo,
                "hi": hi,
                "count": int(vals.size),
                "gold_mean": float(vals.mean()) if vals.size else None,
                "gold_se": float(vals.std(ddof=1) / math.sqrt(vals.size)) if vals.size > 1 else None,
                "_vals": vals,
            }
        )
    tail = u >= 0.9
    slope_bulk, slope_tail = _slope(z[~tail], gcen[~tail]), _slope(z[tail], gcen[tail])
    filled = [b for b in bands if b["count"] > 0]
    top, lower = filled[-1], filled[:-1]
    downturn: dict[str, Any] | None = None
    if lower:
        peak = max(lower, key=lambda b: b["gold_mean"])
        ps = [_welch_p(top["_vals"], b["_vals"]) for b in lower]
        pmin = min((q for q in ps if q is not None), default=None)
        downturn = {
            "top_band": [top["lo"], top["hi"]],
            "top_gold": top["gold_mean"],
            "peak_band": [peak["lo"], peak["hi"]],
            "peak_gold": peak["gold_mean"],
            "p_value": pmin,
            "level": alpha / len(lower),
            "significant": pmin is not None and pmin <= alpha / len(lower),
        }
    bon_gold, lin = float(np.mean(bon)), float(np.mean(pred))
    gap = np.asarray(bon) - np.asarray(pred)  # per prompt: BoN's gold minus the linear prediction
    below = (
        gap.size > 1
        and gap.std(ddof=1) > 0
        and float(stats.t.cdf(gap.mean() / (gap.std(ddof=1) / math.sqrt(gap.size)), gap.size - 1)) <= alpha
    )
    rising = all(a["gold_mean"] <= b["gold_mean"] for a, b in zip(filled, filled[1:]))
    if downturn is not None and downturn["significant"]:
        reading = "can"
    elif rising and (slope_tail is None or slope_tail >= 0) and not below:
        reading = "cannot"
    else:
        reading = "unclear"
    for b in bands:
        del b["_vals"]
    out = {
        "num_prompts": len(P),
        "candidates_per_prompt": m,
        "n_max": n_max,
        "alpha": alpha,
        "bands": bands,
        "within_prompt_r": float(np.mean(rs)) if rs else None,
        "slope_bulk": slope_bulk,
        "slope_tail": slope_tail,
        "bon_gold_at_n_max": bon_gold,
        "linear_prediction": lin,
        "bon_below_linear": bool(below),
        "downturn": downturn,
        "reading": reading,
    }
    out["text"] = _reading_text(out)
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _band_name(lo: float, hi: float) -> str:
    if lo == 0.0:
        return f"<{100 * hi:g}%"
    if hi == 1.0:
        return f"top {100 * (1 - lo):.3g}%"
    return f"{100 * lo:g}-{100 * hi:g}%"


def _reading_text(d: dict[str, Any]) -> str:
    n = d["n_max"]
    dt = d["downturn"]
    tail = f"tail slope {_fmt(d['slope_tail'])} vs bulk {_fmt(d['slope_bulk'])}"
    lin = (
        f"BoN(N={n}) gold {_fmt(d['bon_gold_at_n_max'])} vs linear prediction {_fmt(d['linear_prediction'])}"
    )
    if d["reading"] == "can":
        assert dt is not None
        return (
            f"this pool can show over-optimisation up to N={n}: the top proxy band "
            f"{_band_name(*dt['top_band'])} has gold {_fmt(dt['top_gold'])}, below the "
            f"{_band_name(*dt['peak_band'])} band's {_fmt(dt['peak_gold'])} (one-sided Welch p = "
            f"{_fmt(dt['p_value'])} ≤ {dt['level']:.3g}); {tail}; {lin}"
        )
    if d["reading"] == "cannot":
        return (
            f"this pool cannot show over-optimisation up to N={n}: gold rises through every proxy-rank band "
            f"and the top band holds the highest gold; {tail}; {lin} (the proxy's errors are light-tailed: "
            "there is nothing for best-of-N to hack at the N this pool holds)"
        )
    extra = (
        f"the top band {_band_name(*dt['top_band'])} has gold {_fmt(dt['top_gold'])} vs the "
        f"{_band_name(*dt['peak_band'])} band's {_fmt(dt['peak_gold'])} (p = {_fmt(dt['p_value'])}, "
        f"not ≤ {dt['level']:.3g})"
        if dt is not None
        else "only one proxy-rank band is filled"
    )
    return f"unclear whether this pool can show over-optimisation up to N={n}: {extra}; {tail}; {lin}"


def capacity_lines(d: dict[str, Any]) -> list[str]:
    """Plain-text lines for a terminal: the band table and the reading."""
    cells = [
        f"{_band_name(b['lo'], b['hi'])}: {_fmt(b['gold_mean'])} (n={b['count']})"
        if b["count"]
        else f"{_band_name(b['lo'], b['hi'])}: empty"
        for b in d["bands"]
    ]
    r = _fmt(d["within_prompt_r"])
    return [
        f"  capacity: within-prompt r(proxy, gold) = {r}; mean gold by proxy-rank band: " + ", ".join(cells),
        f"  capacity reading: {d['text']}",
    ]
