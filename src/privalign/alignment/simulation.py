"""The evaluation protocol of spec-inference-time §5.4 on a scored pool, vectorized, with exact laws.

For each prompt, each N in the grid and each of ``m`` replicates: draw N candidates *without
replacement* (the two-pool methods draw 2N: disjoint pools A and B, since PrivITP needs two independent
fresh pools), then compute each method's selection law exactly (argmax, softmax, the ITP sequential
product, and for PrivITP the closed form given λ̃ integrated over λ̃ by Gauss–Legendre quadrature with the
clamp's point masses, see :mod:`privalign.alignment.laws`). The fallback is a fresh π0 sample, so it is
credited with the prompt's base-policy mean. Metrics per method and N: the true-reward lift over the base
policy (×100 = accuracy lift in % for binary rewards), the expected proxy reward, and standard errors over
prompts (``std(ddof=1)/√P``).

Speed: each (prompt, replicate) uses one permutation for all N — pool A = its first N entries, pool B =
the N entries after position max N — so every N's pools are still a uniform draw without replacement
(common random numbers across N); the max-N pools are gathered once per prompt and every N uses their
prefixes. PrivITP's rejection probabilities ``1 − a`` are precomputed once per prompt for every (candidate,
fixed λ̃ node) pair (the closed form; ``G((r − R_max − σ_Z·L)/σ_Z)`` is the same for every node), and because
pool B is nested across N one scan of max N candidates — a cumulative product per (node, replicate) and
one matrix product per segment, nodes dropped once their remaining weighted survival is below 1e-12 —
gives the exact law of every N (see ``_privitp_nested``). ITP and PrivBoN use the same prefix structure
(ITP: summation by parts for the sequential law, the product stopped once the survival is below 1e-12 in
every replicate, the remaining mass credited to the fallback; PrivBoN: one exponential per candidate).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privalign._json import to_jsonable
from privalign._validation import check_choice, check_int, check_real
from privalign.accounting.expost import ell1, ell2
from privalign.accounting.normal import ndtr
from privalign.alignment.bon import BestOfN
from privalign.alignment.figures import plot_results  # re-exported: plotting lives in alignment.figures
from privalign.alignment.itp import InferenceTimePessimism
from privalign.alignment.laws import lambda_quadrature, privitp_acceptance
from privalign.alignment.normalizer import solve_normalizer
from privalign.alignment.priv_bon import PrivBoN
from privalign.alignment.priv_itp import PrivITP
from privalign.alignment.selectors import METHODS as _METHODS
from privalign.alignment.selectors import (
    Selector,
    SelectorSpec,
    check_method,
    make_selector,
    method_class,
    pool_size,
    uses_two_pools,
)
from privalign.data.pools import ScoredPool
from privalign.errors import PrivacyParameterError

__all__ = [
    "MethodSpec",
    "SimulationReport",
    "prepare_scores",
    "run_protocol",
    "simulate",
    "plot_results",
    "write_results",
]

METHODS = _METHODS  # re-exported (the selectors' list)


@dataclass(frozen=True)
class MethodSpec:
    """One curve of the protocol: a method, its parameters and a legend label.

    The method names, the parameters (their declaration, defaults, validation and messages), PrivBoN's
    ε → scale conversion, the candidate layout and the display label are the selector class's
    (:mod:`privalign.alignment.selectors`): the spec is checked by building its selector once, and the
    engine reads the validated parameters, the Gumbel scale and PrivITP's accountant from
    :meth:`selector`. The engine itself stays vectorised for the built-in methods (it computes their laws
    in closed form over all replicates); any other registered method is evaluated through its exact
    ``law``.

    Args:
      kind: A method name (checked by :func:`~privalign.alignment.selectors.check_method`).
      beta: β for ITP/PrivITP.
      epsilon: PrivBoN's ε (scale 2Δ/ε); or give ``sigma`` (the Gumbel scale; ε_eff = 2Δ/σ reported).
      sigma_x, sigma_z, L, delta: PrivITP parameters (``sigma_z`` defaults to ``sigma_x``, as in
        ``make_selector``).
      label: Legend label (default: the method's own, built from the parameters).
      params: Parameters of a registered method that the fields above do not name, as ``(name, value)``
        pairs.
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
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        check_method(self.kind, "kind")
        # the method's defaults (e.g. σ_Z = σ_X), visible in the spec
        resolved = self.selector_spec().resolved()
        for f in _SPEC_FIELDS:
            if getattr(self, f) is None and resolved.get(f) is not None:
                object.__setattr__(self, f, resolved[f])
        self.selector()  # the factory's validation (names the parameter; nothing is kept)

    @classmethod
    def from_spec(cls, spec: SelectorSpec, *, label: str | None = None) -> MethodSpec:
        """A curve from a parsed :class:`~privalign.alignment.selectors.SelectorSpec`."""
        given = spec.as_dict()
        fields_ = {k: given.pop(k) for k in list(given) if k in _SPEC_FIELDS}
        return cls(spec.method, label=label, params=tuple(given.items()), **fields_)

    def selector_spec(self) -> SelectorSpec:
        """This curve's method and the parameters it declares (fields the method does not take are
        ignored, as ``make_selector`` does)."""
        declared = {p.name for p in method_class(self.kind).params}
        given = {f: getattr(self, f) for f in _SPEC_FIELDS if f in declared}
        return SelectorSpec.of(self.kind, **given, **dict(self.params))

    def selector(self, *, r_max: float = 1.0, sensitivity: float | None = None) -> Selector:
        """This curve's selector (the public score range ``[0, r_max]``, Δ_r = ``sensitivity``, default
        ``r_max``)."""
        return make_selector(self.selector_spec(), r_max=r_max, sensitivity=sensitivity)

    @property
    def two_pools(self) -> bool:
        return uses_two_pools(self.kind)

    def privbon_scale(self, sensitivity: float) -> float:
        """PrivBoN's Gumbel scale, the selector's: ``sigma`` if given, else
        :func:`~privalign.alignment.priv_bon.privbon_scale` of ``epsilon`` (2Δ/ε rounded up)."""
        sel = self.selector(sensitivity=sensitivity)
        assert isinstance(sel, PrivBoN)  # a privbon spec
        return sel.scale

    def name(self) -> str:
        if self.label:
            return self.label
        return str(method_class(self.kind).describe(self.selector_spec().resolved()))

    def to_dict(self) -> dict[str, Any]:
        """The spec as written into ``results.json`` (``params`` only when a registered method has any)."""
        d = asdict(self)
        if not d["params"]:
            del d["params"]
        else:
            d["params"] = dict(self.params)
        return d


_SPEC_FIELDS = ("beta", "epsilon", "sigma", "sigma_x", "sigma_z", "L", "delta")


def prepare_scores(
    pool: ScoredPool, *, transform: str = "none", score_range: tuple[float, float] = (0.0, 1.0)
):
    """Return ``(z, clipped, r_max)``: the (optionally globally z-normalised) proxy rewards, and the same
    clipped to the public range and shifted to ``[0, r_max]`` for the methods that need bounded scores.

    ``global_z`` uses the pool's own mean and std (as the authors' scripts do): acceptable for offline
    evaluation, but the statistics depend on the private scores (LIMITATIONS.md).
    """
    check_choice(transform, "transform", ("none", "global_z"))
    lo, hi = float(score_range[0]), float(score_range[1])
    if not hi > lo:
        raise PrivacyParameterError(
            f"The 'score_range' parameter must satisfy low < high. Got {score_range!r} instead."
        )
    z = pool.proxy.copy()
    if transform == "global_z":
        vals = z[np.isfinite(z)]
        z = (z - vals.mean()) / vals.std()
    clipped = np.clip(z, lo, hi) - lo
    return z, clipped, hi - lo


def _privitp_nodes(spec: PrivITP, r_max: float, panel_width: float | None, order: int):
    lo, hi = -spec.beta, r_max - spec.beta
    pw = panel_width if panel_width is not None else 3.0 * min(spec.sigma_x, spec.sigma_z)
    nodes, _ = lambda_quadrature(
        np.array([0.0]), spec.sigma_x, lo, hi, panel_width=pw, order=order, max_panels=400
    )
    return nodes, pw


def run_protocol(
    pool: ScoredPool,
    specs: list[MethodSpec],
    *,
    n_grid: list[int],
    replicates: int = 50,
    random_state: int | np.random.SeedSequence | None = None,
    transform: str = "none",
    score_range: tuple[float, float] = (0.0, 1.0),
    sensitivity: float | None = None,
    skip_short: bool = False,
    quad_order: int = 6,
    quad_panel_width: float | None = None,
    progress: bool = True,
    max_chunk: int = 4_000_000,
    per_prompt: bool = False,
) -> dict[str, Any]:
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
      per_prompt: Also return, per method, the per-prompt lifts ``true_lift_per_prompt`` (a list over
        the evaluated prompts of lists over ``n_grid``; for PrivITP also ``expected_epsilon2_per_prompt``)
        and, at the top level, ``prompt_index`` (each evaluated prompt's row in ``pool``), for paired
        tests across N or across methods on the same prompts.

    Returns:
      A JSON-able dict: ``config``, ``methods`` (per method: ``n``, ``true_lift``, ``true_lift_se``,
      ``proxy``, ``proxy_se``, ``privacy``), ``n_prompts``, ``skipped_prompts``, ``seconds`` (wall time of
      the evaluation).

    Raises:
      PrivacyParameterError: bad parameters; pools with fewer candidates than needed (unless
        ``skip_short``); an empty pool after skipping.
    """
    t0 = time.perf_counter()
    n_grid, replicates, need = _check_protocol(pool, specs, n_grid, replicates, skip_short)
    sub, keep = pool.restrict(need)
    if keep.size == 0:
        raise PrivacyParameterError(f"No prompt has at least {need} candidates; nothing to evaluate.")
    if not sub.has_true:
        raise PrivacyParameterError(
            "The pool has candidates without a true reward ('is_correct' or 'true_reward')."
        )
    z, clipped, r_max = prepare_scores(sub, transform=transform, score_range=score_range)
    n_clipped, n_finite = _count_clipped(z, score_range)
    delta_r = (
        r_max if sensitivity is None else check_real(sensitivity, "sensitivity", low=0.0, closed="neither")
    )
    # each curve's selector, from the one factory: validated parameters, PrivBoN's scale (ε → σ rounded up)
    # and charged ε, PrivITP's accountant; each selector's kernel computes its law's values
    sels = [s.selector(r_max=r_max, sensitivity=delta_r) for s in specs]
    kernels = [
        _kernel(sel, i, r_max=r_max, delta_r=delta_r, panel_width=quad_panel_width, order=quad_order)
        for i, sel in enumerate(sels)
    ]
    ss = (
        random_state
        if isinstance(random_state, np.random.SeedSequence)
        else np.random.SeedSequence(random_state)
    )
    rng = np.random.default_rng(ss)
    P, G = keep.size, len(n_grid)
    res_true = {i: np.zeros((P, G)) for i in range(len(specs))}
    res_proxy = {i: np.zeros((P, G)) for i in range(len(specs))}
    res_eps = {i: np.full((P, G), np.nan) for i in range(len(specs))}
    two = any(sel.layout.pools > 1 for sel in sels)
    for p in _progress(range(P), progress):
        c = int(sub.counts[p])
        perm = rng.permuted(np.broadcast_to(np.arange(c), (replicates, c)), axis=1)
        draw = _Draw.make(clipped[p, :c], sub.true[p, :c], z[p, :c], perm, max(n_grid), two_pools=two)
        for i, (et, ez, ee) in enumerate(_evaluate_prompt(draw, kernels, n_grid, max_chunk)):
            res_true[i][p], res_proxy[i][p] = et, ez
            if ee is not None:
                res_eps[i][p] = ee
    base_true = np.array([sub.true[p, : sub.counts[p]].mean() for p in range(P)])
    base_proxy = np.array([z[p, : sub.counts[p]].mean() for p in range(P)])
    methods = [
        _method_entry(s, kernels[i], res_true[i], res_proxy[i], res_eps[i], base_true, n_grid, per_prompt)
        for i, s in enumerate(specs)
    ]
    out = {
        "config": {
            "n_grid": list(n_grid),
            "replicates": replicates,
            "transform": transform,
            "score_range": list(score_range),
            "r_max": r_max,
            "sensitivity": delta_r,
            "seed_entropy": str(ss.entropy),
            "skip_rule": f"prompts with < {need} candidates skipped"
            if skip_short
            else "none (all prompts had enough candidates)",
        },
        "n_prompts": int(P),
        "skipped_prompts": int(pool.counts.size - P),
        "clipped_scores": n_clipped,
        "clipped_fraction": n_clipped / max(1, n_finite),
        "base_true": float(base_true.mean()),
        "base_proxy": float(base_proxy.mean()),
        "methods": methods,
        "seconds": time.perf_counter() - t0,
    }
    if per_prompt:
        out["prompt_index"] = [int(k) for k in keep]
    return out


def _check_protocol(pool: ScoredPool, specs, n_grid, replicates, skip_short) -> tuple[list[int], int, int]:
    """Validate the protocol's arguments; returns ``(n_grid, replicates, need)`` with ``need`` the number of
    candidates a prompt must have (``2·max N`` if any two-pool method, else ``max N``)."""
    if not specs:
        raise PrivacyParameterError("The 'specs' parameter must name at least one method. Got [] instead.")
    n_grid = [check_int(n, "n_grid[i]", low=1) for n in n_grid]
    if not n_grid:
        raise PrivacyParameterError("The 'n_grid' parameter must be non-empty. Got [] instead.")
    replicates = check_int(replicates, "replicates", low=1)
    # the two pools, without the fallback candidate (a fresh π0 sample: credited with the base-policy mean)
    need = max(pool_size(s.kind, max(n_grid), fallback_candidate=False) for s in specs)
    short = int(np.sum(pool.counts < need))
    if short and not skip_short:
        raise PrivacyParameterError(
            f"The pool has {short} prompt(s) with fewer candidates than needed ({need} = "
            f"{'2·' if need != max(n_grid) else ''}max N); smallest pool has {int(pool.counts.min())}. "
            "Lower 'n_grid' or pass skip_short=True."
        )
    return n_grid, replicates, need


def _privitp_precompute(s: PrivITP, r_max: float, delta_r: float, panel_width, order: int) -> tuple:
    """PrivITP's per-run constants: ``(nodes, W, panel width, ℓ1, ℓ2, order)`` at the fixed λ̃ nodes."""
    nodes, pw = _privitp_nodes(s, r_max, panel_width, order)
    w = r_max + s.sigma_z * s.L - nodes
    l1 = ell1(nodes, width=w, r_max=r_max, sensitivity=delta_r, sigma_z=s.sigma_z)
    l2 = ell2(nodes, width=w, r_max=r_max, sensitivity=delta_r, sigma_z=s.sigma_z)
    return nodes, w, pw, l1, l2, order


def _progress(it, show: bool):
    if not show:
        return it
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return it
    return tqdm(it, desc="simulate", unit="prompt", file=sys.stderr)


@dataclass
class _Draw:
    """One prompt's draws: the clipped/true/proxy scores of all its candidates (``cp``, ``tp``, ``zp``), the
    replicates' permutations ``perm`` (m, C), and the max-N pools gathered once — pool A ``perm[:, :n_max]``
    (``ca``, ``za``, ``ta``) and, for the two-pool methods, pool B ``perm[:, n_max:2·n_max]`` (``tb``, ``zb``
    and their scan differences ``dv_b``; ``cb``). Every N uses prefixes (views). ``lam`` caches λ̂ of pool
    A per (β, N), shared by ITP and PrivITP."""

    cp: np.ndarray
    tp: np.ndarray
    zp: np.ndarray
    perm: np.ndarray
    n_max: int
    ca: np.ndarray
    za: np.ndarray
    ta: np.ndarray
    cb: np.ndarray | None = None
    tb: np.ndarray | None = None
    zb: np.ndarray | None = None
    dv_b: np.ndarray | None = None
    lam_cache: dict = field(default_factory=dict)

    @classmethod
    def make(cls, cp, tp, zp, perm, n_max: int, *, two_pools: bool = True) -> _Draw:
        pa = perm[:, :n_max]
        d = cls(cp, tp, zp, perm, n_max, cp[pa], zp[pa], tp[pa])
        if two_pools:
            pb = perm[:, n_max : 2 * n_max]
            d.cb, d.tb, d.zb = cp[pb], tp[pb], zp[pb]
            d.dv_b = _scan_differences(d.tb, d.zb)  # (m, 3, n_max), shared by ITP and PrivITP
        return d

    @property
    def base_t(self) -> float:
        return self.tp.mean()

    @property
    def base_z(self) -> float:
        return self.zp.mean()

    def lam(self, beta: float, n: int) -> np.ndarray:
        if (beta, n) not in self.lam_cache:
            self.lam_cache[(beta, n)] = solve_normalizer(self.ca[:, :n], beta)
        return self.lam_cache[(beta, n)]


def _evaluate_prompt(draw: _Draw, kernels, n_grid, max_chunk):
    """Per method: the replicate means over the N grid of the expected true value, expected proxy value
    and (PrivITP) expected ε2, each of shape (G,) (ε2 None for the other methods)."""
    for k in kernels:
        k.prepare(draw, n_grid, max_chunk)
    G = len(n_grid)
    out = [(np.zeros(G), np.zeros(G), np.full(G, np.nan) if k.reports_epsilon2 else None) for k in kernels]
    softmax_cache: dict[int, np.ndarray | None] = {}
    for g, n in enumerate(n_grid):
        for i, k in enumerate(kernels):
            et, ez, ee = k.values(draw, g, n, softmax_cache)
            if ee is not None:
                eps = out[i][2]
                assert eps is not None  # a kernel reporting ε2 has its row
                eps[g] = ee.mean()
            out[i][0][g] = et.mean()
            out[i][1][g] = ez.mean()
    return out


def _kernel(sel: Selector, key: int, *, r_max: float, delta_r: float, panel_width, order: int) -> _Kernel:
    """The selector's kernel: the vectorised closed form of a built-in method (keyed by its class), or its
    exact ``law`` for any other selector."""
    make = _KERNELS.get(type(sel), _LawKernel)
    return make(sel, key, r_max=r_max, delta_r=delta_r, panel_width=panel_width, order=order)


class _Kernel:
    """What the engine asks of a method: per prompt ``prepare``; per N the replicates' expected true and
    proxy values (and, for PrivITP, the expected realized ε2); the curve's privacy report."""

    reports_epsilon2 = False

    def __init__(self, sel, key: int, *, r_max: float, delta_r: float, panel_width, order: int) -> None:
        self.sel, self.key, self.r_max = sel, key, r_max

    def prepare(self, draw: _Draw, n_grid, max_chunk) -> None:
        pass

    def values(self, draw: _Draw, g: int, n: int, softmax_cache: dict):
        raise NotImplementedError

    def privacy(self, n_grid) -> dict[str, Any]:
        """The curve's privacy report, from its selector (built with the run's r_max and Δ_r)."""
        if not self.sel.private:
            return {"guarantee": "none", "epsilon": math.inf}
        return {
            "guarantee": f"{self.sel.name}: worst case per query",
            "epsilon_max": [self.sel.worst_case_epsilon(n) for n in n_grid],
        }

    def entry(self, entry: dict[str, Any], res_eps, per_prompt: bool) -> None:
        """Add the method's own fields to its results entry."""


class _BoNKernel(_Kernel):
    def values(self, draw, g, n, softmax_cache):
        return (*_bon_values(draw, n), None)


class _PrivBoNKernel(_Kernel):
    def values(self, draw, g, n, softmax_cache):
        return (*_privbon_values(draw, n, self.sel.scale, softmax_cache, self.key), None)

    def privacy(self, n_grid) -> dict[str, Any]:
        sel = self.sel
        if sel.scale == 0.0:  # ε = ∞ or σ = 0: plain BoN, no noise, no guarantee (event: NonPrivateEvent)
            return {"guarantee": "none", "epsilon": math.inf, "scale": 0.0}
        eps = sel.epsilon_effective  # 2Δ/σ rounded up
        return {
            "guarantee": "pure ε-DP per query (exponential mechanism); ε²/8-zCDP",
            "epsilon": eps,
            "rho": eps**2 / 8 if math.isfinite(eps) else math.inf,
            "scale": sel.scale,  # σ, or 2Δ/ε rounded up
        }


class _ITPKernel(_Kernel):
    def values(self, draw, g, n, softmax_cache):
        return (*_itp_values(draw, self.sel.beta, n, self.r_max, (draw.base_t, draw.base_z)), None)


class _PrivITPKernel(_Kernel):
    reports_epsilon2 = True

    def __init__(self, sel, key, *, r_max, delta_r, panel_width, order) -> None:
        super().__init__(sel, key, r_max=r_max, delta_r=delta_r, panel_width=panel_width, order=order)
        self.pre = _privitp_precompute(sel, r_max, delta_r, panel_width, order)
        self.nested: tuple | None = None

    def prepare(self, draw, n_grid, max_chunk) -> None:
        s = self.sel
        nodes, w, *_ = self.pre
        rej_t = _rejection_table(draw.cp, nodes, w, s.sigma_z, self.r_max + s.sigma_z * s.L)  # (K, C)
        for n in n_grid:
            draw.lam(s.beta, n)
        self.nested = _privitp_nested(s, self.pre, rej_t.T, draw, n_grid, self.r_max, max_chunk)

    def values(self, draw, g, n, softmax_cache):
        assert self.nested is not None  # prepared for this prompt
        return tuple(x[:, g] for x in self.nested)

    def privacy(self, n_grid) -> dict[str, Any]:
        acc = self.sel.accountant
        return {
            "guarantee": "ex-post (ε1(δ) + ε2(t; λ̃), δ)",
            "delta": self.sel.delta,
            "epsilon1": acc.epsilon1,
            "rho1": acc.rho1,
            "epsilon_max": acc.epsilon_max_many(n_grid),
        }

    def entry(self, entry, res_eps, per_prompt) -> None:
        entry["privacy"]["expected_epsilon2_realized"] = np.nanmean(res_eps, axis=0).tolist()
        entry["quadrature"] = {
            "nodes": int(self.pre[0].size),
            "order": self.pre[5],
            "panel_width": self.pre[2],
        }
        if per_prompt:
            entry["expected_epsilon2_per_prompt"] = res_eps.tolist()


class _LawKernel(_Kernel):
    """Any selector: its exact ``law`` per replicate (pool A, and pool B for a two-pool layout; the
    fallback credited with the prompt's base-policy mean). Exact, not vectorised."""

    def values(self, draw, g, n, softmax_cache):
        two = self.sel.layout.pools > 1
        m = draw.ca.shape[0]
        et, ez = np.empty(m), np.empty(m)
        for r in range(m):
            if two:
                assert draw.cb is not None and draw.tb is not None and draw.zb is not None  # two-pool draws
                law = self.sel.law(draw.ca[r, :n], pool_b_scores=draw.cb[r, :n])
                t, zz = draw.tb[r, :n], draw.zb[r, :n]
            else:
                law = self.sel.law(draw.ca[r, :n])
                t, zz = draw.ta[r, :n], draw.za[r, :n]
            p = np.asarray(law.probabilities, dtype=np.float64)
            et[r] = p @ t + law.fallback * draw.base_t
            ez[r] = p @ zz + law.fallback * draw.base_z
        return et, ez, None


def _bon_values(draw: _Draw, n: int):
    j = np.argmax(draw.za[:, :n], axis=1)
    rows = np.arange(draw.za.shape[0])
    return draw.ta[rows, j], draw.za[rows, j]


def _privbon_values(draw: _Draw, n: int, scale: float, softmax_cache: dict, key):
    ca, ta, za = draw.ca, draw.ta, draw.za
    if scale > 0:
        # softmax(c/σ) over the prefix = e/Σe for any per-row shift of the exponent: one exp of the max-N
        # pool per replicate, shifted by its row max (per prefix when that could leave the normal range)
        if key not in softmax_cache:
            e = ca / scale
            top = e.max(axis=1, keepdims=True)
            shared = bool(np.all(top[:, 0] - e.min(axis=1) < 600.0))
            softmax_cache[key] = np.exp(e - top) if shared else None
        e = softmax_cache[key]
        if e is None:
            e = ca[:, :n] / scale
            e = np.exp(e - e.max(axis=1, keepdims=True))
        else:
            e = e[:, :n]
        tot = e.sum(axis=1)
        return np.einsum("ij,ij->i", e, ta[:, :n]) / tot, np.einsum("ij,ij->i", e, za[:, :n]) / tot
    pr = _onehot(ca[:, :n])
    return (pr * ta[:, :n]).sum(1), (pr * za[:, :n]).sum(1)


def _itp_values(draw: _Draw, beta: float, n: int, r_max: float, bases):
    # rejection 1 − a = clip((R_max − r)/(R_max − λ̂), 0, 1), a = clip((r − λ̂)/(R_max − λ̂), 0, 1)
    cb, tb, zb, dv_b = draw.cb, draw.tb, draw.zb, draw.dv_b
    assert cb is not None and tb is not None and zb is not None and dv_b is not None  # two-pool draws
    lam = draw.lam(beta, n)[:, None]
    rej = r_max - cb[:, :n]
    rej /= r_max - lam
    np.clip(rej, 0.0, 1.0, out=rej)
    return _sequential_expectation(rej, (tb, zb), (dv_b[:, 0, :-1], dv_b[:, 1, :-1]), bases)


def _method_entry(
    s: MethodSpec, kernel: _Kernel, res_true, res_proxy, res_eps, base_true, n_grid, per_prompt
) -> dict[str, Any]:
    lift = res_true - base_true[:, None]
    entry = {
        "name": s.name(),
        "spec": s.to_dict(),
        "n": list(n_grid),
        "true_value": res_true.mean(0).tolist(),
        "true_lift": lift.mean(0).tolist(),
        "true_lift_se": _se(lift).tolist(),
        "proxy": res_proxy.mean(0).tolist(),
        "proxy_se": _se(res_proxy).tolist(),
        "privacy": kernel.privacy(n_grid),
    }
    kernel.entry(entry, res_eps, per_prompt)
    if per_prompt:
        entry["true_lift_per_prompt"] = lift.tolist()
    return entry


def _onehot(x):
    out = np.zeros_like(x)
    out[np.arange(x.shape[0]), np.argmax(x, axis=1)] = 1.0
    return out


def _se(x: np.ndarray) -> np.ndarray:
    if x.shape[0] < 2:
        return np.zeros(x.shape[1])
    return x.std(axis=0, ddof=1) / math.sqrt(x.shape[0])


def _rejection_table(cp, nodes, w, sigma_z, top):
    """``1 − a(r; λ̃_k)`` for every candidate score ``r`` (``cp``) and λ̃ node, shape ``(K, C)``.

    Same closed form as :func:`privalign.alignment.laws.privitp_acceptance` (linear space,
    ``a = [G(hi) − G(lo)]/(hi − lo)``, ``hi = (r − λ̃)/σ_Z``, ``lo = (r − λ̃ − W)/σ_Z``), using that
    ``λ̃ + W = top = R_max + σ_Z·L`` for every node: ``G(lo)`` depends on the score only and is evaluated
    once per candidate, ``G(hi)`` once per (candidate, node). Falls back to ``privitp_acceptance`` when a
    window ``W/σ_Z ≤ 1e-3`` (where that function switches to log space).
    """
    if not np.all(w / sigma_z > 1e-3):
        return 1.0 - privitp_acceptance(cp[None, :], nodes[:, None], w[:, None], sigma_z)
    inv_sqrt_2pi = 1.0 / math.sqrt(2.0 * math.pi)

    def g(x):  # G(x) = xΦ(x) + φ(x), with in-place temporaries
        out = ndtr(x)
        out *= x
        phi = np.multiply(x, x)
        phi *= -0.5
        np.exp(phi, out=phi)
        phi *= inv_sqrt_2pi
        out += phi
        return out

    g_lo = g((cp - top) / sigma_z)  # (C,)
    hi = (cp[None, :] - nodes[:, None]) / sigma_z  # (K, C)
    a = g(hi)
    a -= g_lo[None, :]
    a *= (sigma_z / w)[:, None]
    np.clip(a, 0.0, 1.0, out=a)
    return np.subtract(1.0, a, out=a)


def _scan_differences(vt, vz):
    """``dv[:, j, t] = v_{t+1} − v_t`` for the values (true, proxy, position) along the (m, n) pools, with
    the padding ``v_n = (0, 0, n)``; shape (m, 3, n)."""
    m, n = vt.shape
    dv = np.empty((m, 3, n))
    for j, v in enumerate((vt, vz)):
        np.subtract(v[:, 1:], v[:, :-1], out=dv[:, j, :-1])
        dv[:, j, -1] = -v[:, -1]
    dv[:, 2] = 1.0
    return dv


def _sequential_expectation(rej, values, diffs, bases, *, tol=1e-12, block=256):
    """``Σ_{t<N} P(t)·v_t + P(fallback)·base`` row-wise for the sequential law ``P(t) = a_t Π_{i<t}(1 − a_i)``
    (the law of :func:`privalign.alignment.laws.sequential_law`), from the rejection probabilities
    ``rej = 1 − a`` of shape (m, N) (overwritten). With the survival ``S_t = Π_{i≤t}(1 − a_i)``, summing
    by parts: ``Σ_{t<E} v_t P(t) = v_0 + Σ_{t<E} (v_{t+1} − v_t) S_t − v_E S_{E−1}`` and
    ``P(fallback) = S_{N−1}``.

    ``values`` and ``diffs`` hold, per value, the (m, ≥N) values along the pool and their differences
    ``v_{t+1} − v_t`` (prefixes are used, so one array serves every N). The product is taken in blocks of
    ``block`` positions and stops at the end E of the first block where ``S_{E−1} < tol`` in every row; the
    remaining mass ``S_{E−1}`` is then credited to the fallback, so any expectation is off by at most
    ``tol·(max|v| + |base|)`` (tol = 1e-12, as for PrivITP's scan)."""
    n = rej.shape[1]
    accs = [v[:, 0].copy() for v in values]
    carry = None
    start = 0
    while start < n:
        end = min(start + block, n)
        seg = rej[:, start:end]
        if carry is not None:
            seg[:, 0] *= carry
        np.cumprod(seg, axis=1, out=seg)
        hi = min(end, n - 1)  # the last position has no difference term (v_N is not part of the pool)
        if hi > start:
            for acc, d in zip(accs, diffs, strict=True):
                acc += np.einsum("ij,ij->i", d[:, start:hi], seg[:, : hi - start])
        carry = seg[:, -1]
        start = end
        if start < n and carry.max() < tol:
            break
    # close the sum at E = start: Σ_{t<E} v_t P(t) = acc − v_E·S_{E−1} if E < N (the difference term at E − 1
    # was added), acc − v_{N−1}·S_{N−1} if E = N; plus the fallback mass S_{E−1} credited with base
    out = []
    for acc, v, base in zip(accs, values, bases, strict=True):
        last_v = v[:, start] if start < n else v[:, n - 1]
        out.append(acc - last_v * carry + carry * base)
    return tuple(out)


def _privitp_nested(s, pre, rej_pool, draw: _Draw, n_grid, r_max, max_chunk, *, block=256, tol=1e-12):
    """PrivITP's exact expected true/proxy value and expected ε2, per replicate and N.

    Pool A for N is ``perm[:, :N]`` and pool B is ``perm[:, n_max:n_max + N]``: disjoint, and for each N a
    uniform draw without replacement, nested across N. Because B is a prefix of the same sequence, the
    sequential law of every N is read off one scan of ``n_max`` candidates: with the survival
    ``S_t = Π_{i≤t}(1 − a_i)`` (t = 0-based position), ``P(t) = S_{t−1} − S_t`` and the fallback mass is
    ``S_{N−1}``; summing by parts, ``Σ_{t<N} v_t P(t) = v_0 + Σ_{t<N} (v_{t+1} − v_t) S_t − v_N S_{N−1}``
    (any ``v_N``), so each segment of the scan adds one matrix product to the running sums. ``rej_pool``
    (C, K) holds the rejection probability 1 − a of every candidate at every fixed λ̃ node; only the node
    weights (from λ̂ of pool A) depend on N.

    The scan runs over segments ending at every N of the grid and every ``block`` positions, as one
    (node × replicate × segment) block: gather, cumulative product (the carried survival multiplies the
    first entry), matrix product. A node stops being scanned at the end of a segment once
    ``w_k·S_t < tol/K`` for every replicate, with ``w_k`` the node's largest weight over the N of the grid
    still ahead (λ̃ nodes where acceptance is likely stop after a few hundred candidates): the probability
    mass skipped for any N is then ≤ tol in total, any expectation is off by ≤ tol·(max|value| + |base
    value|) (tol = 1e-12), and the stopped node's remaining mass is credited to the fallback.

    Args:
      draw: The prompt's draws (:class:`_Draw`; ``perm``, the scores, pool B's values and differences when
        gathered, and the λ̂ cache of pool A, filled here for the N not yet solved).

    Returns:
      Arrays of shape (m, G): expected true value, expected proxy value, expected ε2.
    """
    nodes, _w, pw, l1, l2, order = pre
    cp, tp, zp, perm, n_max = draw.cp, draw.tp, draw.zp, draw.perm, draw.n_max
    base_t, base_z, lam_cache = draw.base_t, draw.base_z, draw.lam_cache
    pool_b_diffs = draw.dv_b
    m = perm.shape[0]
    k = nodes.size
    g = len(n_grid)
    lams = np.empty((g, m))
    for gi, n in enumerate(n_grid):
        lam = lam_cache.get((s.beta, n))
        lams[gi] = lam_cache[(s.beta, n)] = solve_normalizer(cp[perm[:, :n]], s.beta) if lam is None else lam
    weights = lambda_quadrature(
        lams, s.sigma_x, -s.beta, r_max - s.beta, panel_width=pw, order=order, max_panels=400
    )[1]  # (G, m, K)
    n_arr = np.asarray(n_grid)
    rej_t = np.ascontiguousarray(np.asarray(rej_pool, dtype=np.float64).T)  # (K, C)
    bounds = sorted(set(n_grid) | set(range(block, n_max, block)) | {n_max})
    step = max(1, int(max_chunk // max(min(n_max, block) * k, 1)))
    et, ez, ee = np.empty((m, g)), np.empty((m, g)), np.empty((m, g))
    cut = tol / k
    pool_b_values: tuple[np.ndarray, np.ndarray]
    if draw.tb is not None and draw.zb is not None:  # already gathered
        pool_b_values = (draw.tb, draw.zb)
    else:
        pb = perm[:, n_max : 2 * n_max]
        pool_b_values = (tp[pb], zp[pb])
    for r0 in range(0, m, step):
        sl = slice(r0, r0 + step)
        bs = perm[sl, n_max : 2 * n_max]
        vb = [np.asarray(v[sl], dtype=np.float64) for v in pool_b_values]
        c = bs.shape[0]
        dv = _scan_differences(*vb) if pool_b_diffs is None else np.asarray(pool_b_diffs)[sl]  # (c, 3, n_max)
        v0 = np.stack([vb[0][:, 0], vb[1][:, 0], np.zeros(c)], axis=1)  # (c, 3)

        def v_at(e, _vb=vb, _c=c):  # (c, 3): v_e, with the padding at e = n_max
            if e < n_max:
                return np.stack([_vb[0][:, e], _vb[1][:, e], np.full(_c, float(e))], axis=1)
            return np.array([0.0, 0.0, float(e)])

        wgt = weights[:, sl].transpose(0, 2, 1)  # (G, K, c)
        # state of the nodes still scanned (compacted), and final Σ_{t<stop} v_t P(t) / survival of
        # stopped ones
        act = np.arange(k)
        table = rej_t
        surv = np.ones((k, c))
        sums = np.zeros((k, c, 3))  # Σ_{t<end} (v_{t+1} − v_t) S_t
        done_q = np.zeros((k, c, 3))
        done_s = np.zeros((k, c))
        w_ahead = None
        snaps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        start = 0
        for end in bounds:
            if act.size:
                cum = np.take(table, bs[:, start:end], axis=1)  # (k_act, c, blk): 1 − a
                cum[:, :, 0] *= surv
                np.cumprod(cum, axis=2, out=cum)
                sums += np.matmul(cum.transpose(1, 0, 2), dv[:, :, start:end].transpose(0, 2, 1)).transpose(
                    1, 0, 2
                )
                surv = cum[:, :, -1].copy()
                if w_ahead is None:
                    ahead = n_arr > end
                    w_ahead = wgt[ahead][:, act].max(axis=0) if ahead.any() else np.zeros((act.size, c))
                keep = (w_ahead * surv).max(axis=1) >= cut
                if not keep.all():
                    gone = ~keep
                    done_q[act[gone]] = v0[None] + sums[gone] - v_at(end)[None] * surv[gone][:, :, None]
                    done_s[act[gone]] = surv[gone]
                    act, surv, sums, w_ahead = act[keep], surv[keep], sums[keep], w_ahead[keep]
                    # nodes tend to stop in order of λ̃, leaving a contiguous range: a view, no copy
                    contiguous = act.size and act[-1] - act[0] + 1 == act.size
                    table = rej_t[act[0] : act[-1] + 1] if contiguous else rej_t[act]
            if end in n_grid:
                # Σ_{t<N} v_t P(t) = v_0 + sums − v_N·S_{N−1}  (per node, per replicate, per value)
                q, sv = done_q.copy(), done_s.copy()
                q[act] = v0[None] + sums - v_at(end)[None] * surv[:, :, None]
                sv[act] = surv
                snaps[end] = (q, sv)
                w_ahead = None  # the N still ahead changed
            start = end
        for gi, n in enumerate(n_grid):
            sm, sv = snaps[n]
            w_g = wgt[gi]  # (K, c)
            et[sl, gi] = (w_g * (sm[:, :, 0] + sv * base_t)).sum(0)
            ez[sl, gi] = (w_g * (sm[:, :, 1] + sv * base_z)).sum(0)
            # expected ε2 = Σ_t P(t|λ̃)((t−1)ℓ1 + ℓ2) + P(fallback|λ̃)·N·ℓ1
            e_eps = sm[:, :, 2] * l1[:, None] + (1.0 - sv) * l2[:, None] + sv * n * l1[:, None]
            ee[sl, gi] = (w_g * e_eps).sum(0)
    return et, ez, ee


#: the vectorised kernels of the built-in selectors (any other selector: :class:`_LawKernel`)
_KERNELS: dict[type, type[_Kernel]] = {
    BestOfN: _BoNKernel,
    PrivBoN: _PrivBoNKernel,
    InferenceTimePessimism: _ITPKernel,
    PrivITP: _PrivITPKernel,
}


def _count_clipped(z: np.ndarray, score_range) -> tuple[int, int]:
    """``(clipped, finite)``: the finite scores outside the public range, and the finite scores."""
    lo, hi = float(score_range[0]), float(score_range[1])
    finite = np.isfinite(z)
    return int(np.sum(finite & ((z < lo) | (z > hi)))), int(finite.sum())


@dataclass(frozen=True)
class SimulationReport:
    """What :func:`simulate` produced: the protocol's results (:func:`run_protocol`'s dict), the files it
    wrote, and the share of finite scores that the public range clipped."""

    results: dict[str, Any]
    results_path: Path | None
    figures: list[Path]

    @property
    def clipped_fraction(self) -> float:
        """Finite scores outside the public ``score_range`` (after the transform) over all finite scores
        of the evaluated prompts: they are clipped for the bounded-score methods."""
        return float(self.results["clipped_fraction"])

    @property
    def clipped_scores(self) -> int:
        return int(self.results["clipped_scores"])

    @property
    def max_n(self) -> int:
        return int(self.results["config"]["n_grid"][-1])

    def summary(self) -> dict[str, Any]:
        """A short JSON-able summary: files, sizes, clipping, and per method the lift at the largest N
        and the privacy report."""
        res = self.results
        return {
            "results": None if self.results_path is None else str(self.results_path),
            "figures": [str(f) for f in self.figures],
            "n_prompts": res["n_prompts"],
            "skipped_prompts": res["skipped_prompts"],
            "seconds": res["seconds"],
            "max_n": self.max_n,
            "transform": res["config"]["transform"],
            "score_range": list(res["config"]["score_range"]),
            "clipped_fraction": self.clipped_fraction,
            "methods": [
                {"name": m["name"], "true_lift_at_max_n": m["true_lift"][-1], "privacy": m["privacy"]}
                for m in res["methods"]
            ],
        }


def simulate(
    pool: ScoredPool,
    specs: list[MethodSpec],
    *,
    n_grid: list[int],
    out: str | Path | None = None,
    formats: tuple[str, ...] = ("png",),
    figure_backend: str = "auto",
    **protocol: Any,
) -> SimulationReport:
    """Run the protocol (:func:`run_protocol`, keyword arguments passed on) with BLAS on one thread, and
    with ``out`` write ``results.json`` and the figures (``formats``; drawn by ``figure_backend``) there.

    The scores are prepared once (transform, clipping); the report's ``clipped_fraction`` counts what the
    public range clipped.

    Raises:
      PrivacyParameterError: bad parameters (see :func:`run_protocol`); ``pillow`` with a PDF format.
    """
    from threadpoolctl import threadpool_limits

    from privalign.alignment.figures import needs_matplotlib, preload_matplotlib

    if "pdf" in formats and figure_backend == "pillow":
        raise PrivacyParameterError(
            "The 'figure_backend' parameter 'pillow' draws PNG only; with PDF use 'auto' or 'matplotlib'."
        )
    # matplotlib (PDF, or backend matplotlib) is imported in a thread while the engine runs
    preloading = (
        preload_matplotlib() if out is not None and needs_matplotlib(formats, figure_backend) else None
    )
    try:
        # BLAS on one thread while the engine runs: its matrix products are small (one prompt's nodes ×
        # replicates × one block), so more BLAS threads only spin-wait between them and burn CPU. The results
        # do not depend on the thread count (tests/alignment/test_alignment_pinned.py).
        with threadpool_limits(limits=1, user_api="blas"):
            res = run_protocol(pool, specs, n_grid=n_grid, **protocol)
    finally:
        if preloading is not None:
            preloading.join()  # never leave an import running in a thread (also on errors)
    if out is None:
        return SimulationReport(res, None, [])
    path = write_results(res, out)
    figs = plot_results(res, out, formats=formats, backend=figure_backend)
    return SimulationReport(res, path, list(figs))


def write_results(results: dict[str, Any], out_dir: str | Path) -> Path:
    """Write ``results.json`` (∞ as the string "inf") into ``out_dir``; returns its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_jsonable(results), indent=2, allow_nan=False))
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
