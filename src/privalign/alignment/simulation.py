"""The evaluation protocol of spec-inference-time §5.4 on a scored pool, vectorized, with exact laws.

For each prompt, each N in the grid and each of ``m`` replicates: draw N candidates *without
replacement* (the two-pool methods draw 2N: disjoint pools A and B, defect K1), then compute each
method's selection law exactly (argmax, softmax, the ITP sequential product, and for PrivITP the closed
form given λ̃ integrated over λ̃ by Gauss–Legendre quadrature with the clamp's point masses, see
:mod:`privalign.alignment.laws`). The fallback is credited with the prompt's base-policy mean (a fresh
π0 sample, defect K14). Metrics per method and N: the true-reward lift over the base policy (×100 =
accuracy lift in % for binary rewards), the expected proxy reward, and standard errors over prompts
(``std(ddof=1)/√P``).

Speed: each (prompt, replicate) uses one permutation for all N — pool A = its first N entries, pool B =
the N entries after position max N — so every N's pools are still a uniform draw without replacement
(common random numbers across N). PrivITP's acceptance probabilities are precomputed once per prompt on
fixed λ̃ nodes, and because pool B is nested across N one scan of max N candidates gives the exact law of
every N (see ``_privitp_nested``).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import special

from privalign._validation import check_choice, check_int, check_real
from privalign.accounting.expost import PrivITPAccountant, ell1, ell2
from privalign.alignment.laws import lambda_quadrature, privitp_acceptance, sequential_law
from privalign.alignment.normalizer import solve_normalizer
from privalign.data.pools import ScoredPool
from privalign.errors import PrivacyParameterError

__all__ = ["MethodSpec", "prepare_scores", "run_protocol", "plot_results", "write_results"]

METHODS = ("bon", "itp", "privbon", "privitp")


@dataclass(frozen=True)
class MethodSpec:
    """One curve of the protocol.

    Args:
      kind: ``bon``, ``itp``, ``privbon`` or ``privitp``.
      beta: β for ITP/PrivITP.
      epsilon: PrivBoN's ε (scale 2Δ/ε); or give ``sigma`` (the Gumbel scale; ε_eff = 2Δ/σ reported).
      sigma_x, sigma_z, L, delta: PrivITP parameters.
      label: Legend label (default built from the parameters).
    """

    kind: str
    beta: float | None = None
    epsilon: float | None = None
    sigma: float | None = None
    sigma_x: float | None = None
    sigma_z: float | None = None
    L: float = 3.0
    delta: float = 1e-6
    label: str | None = None

    def __post_init__(self) -> None:
        check_choice(self.kind, "kind", METHODS)
        if self.kind in ("itp", "privitp"):
            check_real(self.beta, "beta", low=0.0, closed="neither")
        if self.kind == "privbon":
            if (self.epsilon is None) == (self.sigma is None):
                raise PrivacyParameterError("PrivBoN needs exactly one of 'epsilon' or 'sigma'. Got both or neither.")
            if self.epsilon is not None:
                check_real(self.epsilon, "epsilon", low=0.0, closed="neither", allow_inf=True)
            else:
                check_real(self.sigma, "sigma", low=0.0, closed="left")
        if self.kind == "privitp":
            check_real(self.sigma_x, "sigma_x", low=0.0, closed="neither")
            check_real(self.sigma_z, "sigma_z", low=0.0, closed="neither")

    @property
    def two_pools(self) -> bool:
        return self.kind in ("itp", "privitp")

    def name(self) -> str:
        if self.label:
            return self.label
        if self.kind == "bon":
            return "BoN"
        if self.kind == "itp":
            return f"ITP β={self.beta:g}"
        if self.kind == "privbon":
            return f"PrivBoN ε={self.epsilon:g}" if self.epsilon is not None else f"PrivBoN σ={self.sigma:g}"
        return f"PrivITP β={self.beta:g} σx={self.sigma_x:g} σz={self.sigma_z:g}"


def prepare_scores(pool: ScoredPool, *, transform: str = "none", score_range: tuple[float, float] = (0.0, 1.0)):
    """Return ``(z, clipped, r_max)``: the (optionally globally z-normalised) proxy rewards, and the same
    clipped to the public range and shifted to ``[0, r_max]`` for the methods that need bounded scores.

    ``global_z`` uses the pool's own mean and std (as the authors' scripts do): acceptable for offline
    evaluation, but the statistics depend on the private scores (LIMITATIONS.md).
    """
    check_choice(transform, "transform", ("none", "global_z"))
    lo, hi = float(score_range[0]), float(score_range[1])
    if not hi > lo:
        raise PrivacyParameterError(f"The 'score_range' parameter must satisfy low < high. Got {score_range!r} instead.")
    z = pool.proxy.copy()
    if transform == "global_z":
        vals = z[np.isfinite(z)]
        z = (z - vals.mean()) / vals.std()
    clipped = np.clip(z, lo, hi) - lo
    return z, clipped, hi - lo


def _privitp_nodes(spec: MethodSpec, r_max: float, panel_width: float | None, order: int):
    lo, hi = -spec.beta, r_max - spec.beta
    pw = panel_width if panel_width is not None else 3.0 * min(spec.sigma_x, spec.sigma_z)
    nodes, _ = lambda_quadrature(np.array([0.0]), spec.sigma_x, lo, hi, panel_width=pw, order=order, max_panels=400)
    return nodes, pw


def run_protocol(pool: ScoredPool, specs: list[MethodSpec], *, n_grid: list[int], replicates: int = 50,
                 random_state: int | np.random.SeedSequence | None = None, transform: str = "none",
                 score_range: tuple[float, float] = (0.0, 1.0), sensitivity: float | None = None,
                 skip_short: bool = False, quad_order: int = 6, quad_panel_width: float | None = None,
                 progress: bool = True, max_chunk: int = 4_000_000) -> dict[str, Any]:
    """Run the §5.4 protocol.

    Args:
      pool: The scored pool (true rewards needed for the lift metric).
      specs: The curves to compute.
      n_grid: Values of N (e.g. ``[2**k for k in range(13)]``).
      replicates: m, replicates per (prompt, N).
      random_state: Seed or SeedSequence (its entropy goes into the results).
      transform: ``none`` or ``global_z`` (see :func:`prepare_scores`).
      score_range: Public clipping range for the bounded-score methods; mapped to ``[0, high − low]``.
      sensitivity: Δ_r for the privacy report (default: the clipping range ``high − low``).
      skip_short: Skip prompts with fewer candidates than needed (``2·max N`` if any two-pool method,
        else ``max N``) instead of raising.
      quad_order, quad_panel_width: PrivITP quadrature over λ̃ (Gauss–Legendre order per panel, default
        6; panel width, default ``3·min(σ_X, σ_Z)``: max error of the law ≈ 4e-7 at σ_X = σ_Z = 0.1, see
        ``test_engine_matches_single_prompt_law``).
      progress: Show a tqdm bar on stderr.

    Returns:
      A JSON-able dict: ``config``, ``methods`` (per method: ``n``, ``true_lift``, ``true_lift_se``,
      ``proxy``, ``proxy_se``, ``privacy``), ``n_prompts``, ``skipped_prompts``, ``seconds``.

    Raises:
      PrivacyParameterError: bad parameters; pools with fewer candidates than needed (unless
        ``skip_short``); an empty pool after skipping.
    """
    t0 = time.perf_counter()
    if not specs:
        raise PrivacyParameterError("The 'specs' parameter must name at least one method. Got [] instead.")
    n_grid = [check_int(n, "n_grid[i]", low=1) for n in n_grid]
    if not n_grid:
        raise PrivacyParameterError("The 'n_grid' parameter must be non-empty. Got [] instead.")
    replicates = check_int(replicates, "replicates", low=1)
    need = max(n_grid) * (2 if any(s.two_pools for s in specs) else 1)
    short = int(np.sum(pool.counts < need))
    if short and not skip_short:
        raise PrivacyParameterError(
            f"The pool has {short} prompt(s) with fewer candidates than needed ({need} = "
            f"{'2·' if need != max(n_grid) else ''}max N); smallest pool has {int(pool.counts.min())}. "
            "Lower 'n_grid' or pass skip_short=True."
        )
    sub, keep = pool.restrict(need)
    if keep.size == 0:
        raise PrivacyParameterError(f"No prompt has at least {need} candidates; nothing to evaluate.")
    if not sub.has_true:
        raise PrivacyParameterError("The pool has candidates without a true reward ('is_correct' or 'true_reward').")
    z, clipped, r_max = prepare_scores(sub, transform=transform, score_range=score_range)
    delta_r = r_max if sensitivity is None else check_real(sensitivity, "sensitivity", low=0.0, closed="neither")
    ss = random_state if isinstance(random_state, np.random.SeedSequence) else np.random.SeedSequence(random_state)
    rng = np.random.default_rng(ss)
    P, G = keep.size, len(n_grid)
    res_true = {i: np.zeros((P, G)) for i in range(len(specs))}
    res_proxy = {i: np.zeros((P, G)) for i in range(len(specs))}
    res_eps = {i: np.full((P, G), np.nan) for i in range(len(specs))}
    pre = {}
    for i, s in enumerate(specs):
        if s.kind == "privitp":
            nodes, pw = _privitp_nodes(s, r_max, quad_panel_width, quad_order)
            w = r_max + s.sigma_z * s.L - nodes
            l1 = ell1(nodes, width=w, r_max=r_max, sensitivity=delta_r, sigma_z=s.sigma_z)
            l2 = ell2(nodes, width=w, r_max=r_max, sensitivity=delta_r, sigma_z=s.sigma_z)
            pre[i] = (nodes, w, pw, l1, l2, quad_order)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    it = range(P)
    if progress and tqdm is not None:
        it = tqdm(it, desc="simulate", unit="prompt", file=sys.stderr)
    for p in it:
        c = int(sub.counts[p])
        zp, cp, tp = z[p, :c], clipped[p, :c], sub.true[p, :c]
        base_t, base_z = tp.mean(), zp.mean()
        perm = rng.permuted(np.broadcast_to(np.arange(c), (replicates, c)), axis=1)
        rej_pool = {}
        for i, s in enumerate(specs):
            if s.kind == "privitp":
                nodes, w, *_ = pre[i]
                rej_pool[i] = 1.0 - privitp_acceptance(cp[:, None], nodes[None, :], w[None, :], s.sigma_z)  # (C, K)
        n_max = max(n_grid)
        nested, lam_cache = {}, {}  # λ̂ of pool A per (β, N), shared by ITP and PrivITP
        for i, s in enumerate(specs):
            if s.kind == "privitp":
                nested[i] = _privitp_nested(s, pre[i], rej_pool[i], cp, tp, zp, perm, n_grid, n_max, base_t, base_z,
                                            r_max, max_chunk, lam_cache=lam_cache)
        for g, n in enumerate(n_grid):
            A = perm[:, :n]
            B = perm[:, n_max:n_max + n]
            for i, s in enumerate(specs):
                if s.kind == "bon":
                    j = np.argmax(zp[A], axis=1)
                    sel = A[np.arange(replicates), j]
                    et, ez = tp[sel], zp[sel]
                elif s.kind == "privbon":
                    scale = s.sigma if s.sigma is not None else (0.0 if math.isinf(s.epsilon) else 2 * delta_r / s.epsilon)
                    pr = special.softmax(cp[A] / scale, axis=1) if scale > 0 else _onehot(cp[A])
                    et, ez = (pr * tp[A]).sum(1), (pr * zp[A]).sum(1)
                elif s.kind == "itp":
                    lam = lam_cache.get((s.beta, n))
                    if lam is None:
                        lam = lam_cache[(s.beta, n)] = solve_normalizer(cp[A], s.beta)
                    a = np.clip((cp[B] - lam[:, None]) / (r_max - lam[:, None]), 0.0, 1.0)
                    pr, fb = sequential_law(a)
                    et = (pr * tp[B]).sum(1) + fb * base_t
                    ez = (pr * zp[B]).sum(1) + fb * base_z
                else:
                    et, ez, ee = (x[:, g] for x in nested[i])
                    res_eps[i][p, g] = ee.mean()
                res_true[i][p, g] = et.mean()
                res_proxy[i][p, g] = ez.mean()
    base_true = np.array([sub.true[p, : sub.counts[p]].mean() for p in range(P)])
    base_proxy = np.array([z[p, : sub.counts[p]].mean() for p in range(P)])
    methods = []
    for i, s in enumerate(specs):
        lift = res_true[i] - base_true[:, None]
        entry = {
            "name": s.name(), "spec": asdict(s), "n": list(n_grid),
            "true_value": res_true[i].mean(0).tolist(),
            "true_lift": lift.mean(0).tolist(),
            "true_lift_se": _se(lift).tolist(),
            "proxy": res_proxy[i].mean(0).tolist(),
            "proxy_se": _se(res_proxy[i]).tolist(),
            "privacy": _privacy(s, n_grid, r_max, delta_r),
        }
        if s.kind == "privitp":
            entry["privacy"]["expected_epsilon2_realized"] = np.nanmean(res_eps[i], axis=0).tolist()
            entry["quadrature"] = {"nodes": int(pre[i][0].size), "order": quad_order, "panel_width": pre[i][2]}
        methods.append(entry)
    return {
        "config": {"n_grid": list(n_grid), "replicates": replicates, "transform": transform,
                   "score_range": list(score_range), "r_max": r_max, "sensitivity": delta_r,
                   "seed_entropy": str(ss.entropy), "skip_rule": f"prompts with < {need} candidates skipped"
                   if skip_short else "none (all prompts had enough candidates)"},
        "n_prompts": int(P), "skipped_prompts": int(pool.counts.size - P),
        "base_true": float(base_true.mean()), "base_proxy": float(base_proxy.mean()),
        "methods": methods, "seconds": time.perf_counter() - t0,
    }


def _onehot(x):
    out = np.zeros_like(x)
    out[np.arange(x.shape[0]), np.argmax(x, axis=1)] = 1.0
    return out


def _se(x: np.ndarray) -> np.ndarray:
    if x.shape[0] < 2:
        return np.zeros(x.shape[1])
    return x.std(axis=0, ddof=1) / math.sqrt(x.shape[0])


def _privitp_nested(s, pre, rej_pool, cp, tp, zp, perm, n_grid, n_max, base_t, base_z, r_max, max_chunk,
                    block=512, tol=1e-12, lam_cache=None):
    """PrivITP's exact expected true/proxy value and expected ε2, per replicate and N.

    Pool A for N is ``perm[:, :N]`` and pool B is ``perm[:, n_max:n_max + N]``: disjoint, and for each N a
    uniform draw without replacement, nested across N. Because B is a prefix of the same sequence, the
    sequential law of every N is read off one scan of ``n_max`` candidates: with the survival
    ``S_t = Π_{i≤t}(1 − a_i)``, ``P(t) = S_{t−1} − S_t`` and the fallback mass is ``S_N``. ``rej_pool``
    (C, K) holds the rejection probability 1 − a of every candidate at every fixed λ̃ node; only the node
    weights (from λ̂ of pool A) depend on N. The scan stops once Σ_k w_k·S_k < ``tol`` for every
    replicate and every N's weights; the skipped probability mass is then ≤ tol and any expectation is off
    by ≤ tol·(max|value| + |base value|) (tol = 1e-12).

    Returns:
      Arrays of shape (m, G): expected true value, expected proxy value, expected ε2.
    """
    nodes, _w, pw, l1, l2, order = pre
    lam_cache = {} if lam_cache is None else lam_cache
    m = perm.shape[0]
    k = nodes.size
    g = len(n_grid)
    weights = np.empty((g, m, k))
    for gi, n in enumerate(n_grid):
        lam = lam_cache[(s.beta, n)] if (s.beta, n) in lam_cache else solve_normalizer(cp[perm[:, :n]], s.beta)
        lam_cache[(s.beta, n)] = lam
        weights[gi] = lambda_quadrature(lam, s.sigma_x, -s.beta, r_max - s.beta, panel_width=pw, order=order,
                                        max_panels=400)[1]
    wmax = weights.max(0)  # (m, K)
    bounds = sorted(set(n_grid) | set(range(block, n_max, block)) | {n_max})
    step = max(1, int(max_chunk // max(min(n_max, block) * k, 1)))
    et, ez, ee = np.empty((m, g)), np.empty((m, g)), np.empty((m, g))
    checkpoint = {n: gi for gi, n in enumerate(n_grid)}
    for r0 in range(0, m, step):
        sl = slice(r0, r0 + step)
        bs = perm[sl, n_max:2 * n_max]
        c = bs.shape[0]
        surv = np.ones((c, k))
        sums = np.zeros((c, 3, k))  # Σ_t v_t P(t | λ̃_k) for v = true, proxy, t − 1
        snaps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        start, stopped = 0, False
        for end in bounds:
            if not stopped:
                idx = bs[:, start:end]
                blk = end - start
                cum = rej_pool[idx]  # (c, blk, K): rejection probabilities 1 − a
                np.cumprod(cum, axis=1, out=cum)
                vals = np.zeros((c, 3, blk + 1))
                vals[:, 0, :blk], vals[:, 1, :blk] = tp[idx], zp[idx]
                vals[:, 2, :blk] = np.arange(start, end, dtype=np.float64)
                # Σ_t v_t (S_{t−1} − S_t) = v_0 + Σ_t (v_{t+1} − v_t) S_t   (S_{−1} = 1, v_blk = 0)
                part = vals[:, :, :1] + np.matmul(np.diff(vals, axis=2), cum)
                sums += part * surv[:, None, :]
                surv = surv * cum[:, -1, :]
                stopped = bool((wmax[sl] * surv).sum(1).max() < tol)
            if end in checkpoint:
                snaps[end] = (sums.copy(), surv.copy())
            start = end
        for n, gi in checkpoint.items():
            sm, sv = snaps[n]
            wgt = weights[gi, sl]
            et[sl, gi] = (wgt * (sm[:, 0] + sv * base_t)).sum(1)
            ez[sl, gi] = (wgt * (sm[:, 1] + sv * base_z)).sum(1)
            # expected ε2 = Σ_t P(t|λ̃)((t−1)ℓ1 + ℓ2) + P(fallback|λ̃)·N·ℓ1
            e_eps = sm[:, 2] * l1[None, :] + (1.0 - sv) * l2[None, :] + sv * n * l1[None, :]
            ee[sl, gi] = (wgt * e_eps).sum(1)
    return et, ez, ee


def _privacy(s: MethodSpec, n_grid, r_max, delta_r) -> dict[str, Any]:
    if s.kind in ("bon", "itp"):
        return {"guarantee": "none", "epsilon": math.inf}
    if s.kind == "privbon":
        scale = s.sigma if s.sigma is not None else (0.0 if math.isinf(s.epsilon) else 2 * delta_r / s.epsilon)
        eps = math.inf if scale == 0 else 2 * delta_r / scale
        return {"guarantee": "pure ε-DP per query (exponential mechanism); ε²/8-zCDP", "epsilon": eps,
                "rho": eps**2 / 8 if math.isfinite(eps) else math.inf, "scale": scale}
    acc = PrivITPAccountant(beta=s.beta, r_max=r_max, sensitivity=delta_r, sigma_x=s.sigma_x, sigma_z=s.sigma_z,
                            L=s.L, delta=s.delta)
    return {"guarantee": "ex-post (ε1(δ) + ε2(t; λ̃), δ)", "delta": s.delta, "epsilon1": acc.epsilon1,
            "rho1": acc.rho1, "epsilon_max": [acc.epsilon_max(n) for n in n_grid]}


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o).__name__)


def write_results(results: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``results.json`` (∞ as the string "inf") into ``out_dir``; returns its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(results), indent=2, default=_json_default))
    tmp.replace(path)
    return path


def _finite(o):
    if isinstance(o, float) and math.isinf(o):
        return "inf" if o > 0 else "-inf"
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    return o


def plot_results(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Two PNG figures: true-reward (accuracy) lift vs N and expected proxy reward vs N (log2 x-axis,
    error bars = 1 SE over prompts). Returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, ylabel, fname in (("true_lift", "true-reward lift over base policy (×100 = accuracy lift, %)",
                                "true_lift.png"),
                               ("proxy", "expected proxy reward of the selection", "proxy_reward.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in results["methods"]:
            y = np.asarray(m[key], dtype=float)
            se = np.asarray(m[key + "_se"], dtype=float)
            scale = 100.0 if key == "true_lift" else 1.0
            ax.errorbar(m["n"], y * scale, yerr=se * scale, marker="o", ms=3, capsize=2, label=_legend(m))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (candidates per pool)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{results['n_prompts']} prompts, {results['config']['replicates']} replicates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def _legend(m: dict[str, Any]) -> str:
    pv = m["privacy"]
    if m["spec"]["kind"] == "privbon":
        return f"{m['name']} (ε_eff={pv['epsilon']:.3g}, pure DP)"
    if m["spec"]["kind"] == "privitp":
        return f"{m['name']} (ε1={pv['epsilon1']:.3g}@δ={pv['delta']:g}, ex-post)"
    return m["name"]

