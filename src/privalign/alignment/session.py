"""Sessions: a stream of prompts served under a privacy filter, reserve → run → settle (spec §3.2).

For each prompt, in order: reserve the selector's data-independent ``worst_case_event(n)``; if the
filter refuses (``BudgetExhaustedError``) the prompt — and every later one, since the worst case does
not change — is refused *before any score is read*; otherwise draw the candidate pools (a
data-independent shuffle of the prompt's candidates: they are π0 samples), run the selector, and settle
the realized event. A selector that raises after the reservation leaves it charged at the worst case
(fail closed; the mechanism may have read data). This replaces the authors' run-then-check loop
(which overshoots the budget and ignores the withheld run's cost) and reserves a true worst case (a supremum
over the clamped λ̃ interval, not the value at a clean λ).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privalign._validation import check_int
from privalign.alignment.base import FALLBACK, CandidateLayout
from privalign.data.pools import ScoredPool
from privalign.errors import BudgetExhaustedError, PrivacyParameterError
from privalign.rng import as_noise_source

__all__ = [
    "PoolSession",
    "PoolSessionOptions",
    "SessionReport",
    "run_session",
    "privbon_zcdp_comparison",
    "run_pool_session",
    "serve_pool",
]


@dataclass
class SessionReport:
    """What a session did.

    Attributes:
      prompts_served: Prompts answered before the filter refused.
      prompts_refused: Prompts refused (never touched).
      realized_epsilon: Sum of realized per-prompt ε (settled cost in the filter's first coordinate).
      epsilon_max: The per-prompt worst case reserved.
      basic_composition_count: ``T = floor(budget / epsilon_max)``, what basic composition of the worst
        case would allow.
      mean_stopping_time: Mean t over served prompts whose selector reports one (PrivITP/ITP; fallback
        counted as n + 1).
      fallback_rate, mean_true_reward, base_true_reward: Outcome metrics (NaN without true rewards).
      spent, remaining: The filter's final view of the principal.
      per_prompt: One dict per served prompt (index, t, realized ε, λ̃, true reward).
    """

    prompts_served: int
    prompts_refused: int
    realized_epsilon: float
    epsilon_max: float
    budget: float
    basic_composition_count: int
    mean_stopping_time: float
    fallback_rate: float
    mean_true_reward: float
    base_true_reward: float
    spent: dict[str, float]
    remaining: dict[str, float]
    per_prompt: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _layout(selector) -> CandidateLayout:
    """The selector's candidate layout; a duck-typed selector without one gets its method's, by name."""
    from privalign.alignment.selectors import method_class, methods

    layout = getattr(selector, "layout", None)
    if layout is None:
        name = getattr(selector, "name", None)
        layout = method_class(name).layout if name in methods() else CandidateLayout()
    return layout


def run_session(
    pool: ScoredPool,
    selector,
    filter,
    principal: str,
    rng,
    *,
    n: int,
    max_prompts: int | None = None,
    progress: bool = False,
) -> SessionReport:
    """Serve ``pool``'s prompts in order through ``selector`` under ``filter``.

    Args:
      pool: The prompts and their candidates (each needs ``2n + 1`` candidates for two-pool selectors,
        ``n`` otherwise).
      selector: A privalign selector (``worst_case_event``, ``select``).
      filter: A :class:`~privalign.accounting.filters.PrivacyFilter`.
      principal: Whose budget.
      rng: Generator or NoiseSource (pool shuffles and mechanism noise).
      n: Candidates per pool.
      max_prompts: Stop after this many prompts.

    Returns:
      A :class:`SessionReport`.

    Raises:
      PrivacyParameterError: a prompt has too few candidates (checked for all prompts up front, from the
        public counts only, before anything is reserved).
    """
    n = check_int(n, "n", low=1)
    layout = _layout(selector)  # the selector's: n, or 2n + 1
    two = layout.pools > 1
    need = layout.needed(n)
    short = np.flatnonzero(pool.counts < need)
    if short.size:
        raise PrivacyParameterError(
            f"The pool has {short.size} prompt(s) with fewer than {need} candidates (n={n}"
            f"{', two pools + fallback' if two else ''}); first is prompt {int(short[0])} with "
            f"{int(pool.counts[short[0]])}."
        )
    src = as_noise_source(rng)
    worst = selector.worst_case_event(n)
    eps_max = float(filter.cost(worst)[0])
    budget = float(filter.limit_for(principal)[0])
    total = pool.proxy.shape[0] if max_prompts is None else min(pool.proxy.shape[0], int(max_prompts))
    served, rows = 0, []
    it = range(total)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="session", unit="prompt", file=sys.stderr)
    for p in it:
        try:
            res = filter.reserve(principal, worst)
        except BudgetExhaustedError:
            break
        c = int(pool.counts[p])
        perm = src.permutation(c)
        try:
            a_idx = perm[:n]
            b_idx = perm[n : 2 * n] if two else None
            sel = selector.select(
                pool.proxy[p, a_idx], rng=src, pool_b_scores=None if b_idx is None else pool.proxy[p, b_idx]
            )
        except BaseException:
            filter.settle(res, worst)  # fail closed: the mechanism may have read data
            raise
        filter.settle(res, sel.event)
        served += 1
        if sel.index == FALLBACK:
            served_idx = int(perm[2 * n] if two else perm[n])
        else:
            served_idx = int((a_idx if b_idx is None else b_idx)[sel.index])
        realized = float(filter.cost(sel.event, realized=True)[0])
        t = sel.diagnostics.get("t")
        rows.append(
            {
                "prompt": p,
                "candidate": served_idx,
                "fallback": sel.index == FALLBACK,
                "t": None if t is None else int(t),
                "epsilon_realized": realized,
                "lambda_tilde": sel.diagnostics.get("lambda_tilde"),
                "true_reward": float(pool.true[p, served_idx]),
            }
        )
    ts = [(r["t"] if r["t"] and r["t"] > 0 else n + 1) for r in rows if r["t"] is not None]
    truth = [r["true_reward"] for r in rows]
    spent = filter.spent(principal)
    base = (
        float(np.nanmean([np.nanmean(pool.true[p, : pool.counts[p]]) for p in range(total)]))
        if total
        else math.nan
    )
    return SessionReport(
        prompts_served=served,
        prompts_refused=total - served,
        realized_epsilon=float(sum(r["epsilon_realized"] for r in rows)),
        epsilon_max=eps_max,
        budget=budget,
        basic_composition_count=int(math.floor(budget / eps_max)) if eps_max > 0 else total,
        mean_stopping_time=float(np.mean(ts)) if ts else math.nan,
        fallback_rate=float(np.mean([r["fallback"] for r in rows])) if rows else math.nan,
        mean_true_reward=float(np.nanmean(truth)) if truth else math.nan,
        base_true_reward=base,
        spent=spent,
        remaining=filter.remaining(principal),
        per_prompt=rows,
    )


def privbon_zcdp_comparison(
    pool: ScoredPool,
    selector,
    *,
    budget_epsilon: float,
    delta: float,
    n: int,
    rng,
    principal: str = "session",
    max_prompts: int | None = None,
) -> dict[str, Any]:
    """Run the same PrivBoN session under a pure-ε filter (ε per query) and under a zCDP filter
    (ε²/8 per query, budget ρ from ``ZCDPFilter.from_epsilon_delta(budget_epsilon, delta)``); report both.
    """
    from privalign.accounting.conversions import zcdp_to_approx_dp
    from privalign.accounting.filters import PureDPFilter, ZCDPFilter

    gen = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    ss = getattr(gen.bit_generator, "seed_seq", None)
    seeds = ss.spawn(2) if isinstance(ss, np.random.SeedSequence) else [None, None]
    pure = run_session(
        pool,
        selector,
        PureDPFilter(budget_epsilon),
        principal,
        np.random.default_rng(seeds[0]),
        n=n,
        max_prompts=max_prompts,
    )
    zf = ZCDPFilter.from_epsilon_delta(budget_epsilon, delta)
    zc = run_session(
        pool, selector, zf, principal, np.random.default_rng(seeds[1]), n=n, max_prompts=max_prompts
    )
    rho_spent = zc.spent["rho"]
    return {
        "pure": pure.to_dict(),
        "zcdp": {
            **zc.to_dict(),
            "rho_budget": zf.budget[0],
            "target": list(zf.target or ()),
            "epsilon_at_delta": zcdp_to_approx_dp(rho_spent, delta) if rho_spent > 0 else 0.0,
        },
    }


def serve_pool(
    pool: ScoredPool,
    selector,
    *,
    budget_epsilon: float,
    budget_delta: float,
    n: int,
    seed: int | None = None,
    secure: bool = False,
    principal: str = "session",
    max_prompts: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Serve ``pool`` with ``selector`` under the filter its events call for (``selector.accounting``):
    ex-post events (PrivITP) under :class:`~privalign.accounting.filters.ExPostFilter`; pure-ε events
    (PrivBoN) under :class:`~privalign.accounting.filters.PureDPFilter` with ``secure`` noise, else compared
    with a zCDP filter (:func:`privbon_zcdp_comparison`).

    Returns:
      ``{"method", "filter", **report}`` or, for the comparison, ``{"method", "pure", "zcdp", ...}``.
    """
    from privalign.accounting.filters import ExPostFilter, PureDPFilter
    from privalign.rng import SecureNoise

    rng = SecureNoise() if secure else np.random.default_rng(seed)
    if selector.accounting == "ex-post":
        flt: Any = ExPostFilter(budget_epsilon, budget_delta)
        rep = run_session(
            pool, selector, flt, principal, rng, n=n, max_prompts=max_prompts, progress=progress
        )
        return {"method": selector.name, "filter": "ExPostFilter", **rep.to_dict()}
    if secure:
        rep = run_session(
            pool, selector, PureDPFilter(budget_epsilon), principal, rng, n=n, max_prompts=max_prompts
        )
        return {"method": selector.name, "filter": "PureDPFilter", **rep.to_dict()}
    return {
        "method": selector.name,
        **privbon_zcdp_comparison(
            pool,
            selector,
            budget_epsilon=budget_epsilon,
            delta=budget_delta,
            rng=seed,
            n=n,
            principal=principal,
            max_prompts=max_prompts,
        ),
    }


@dataclass(frozen=True)
class PoolSessionOptions:
    """The options of a session over a scored pool besides the method's (``privalign session``'s flags,
    same names and defaults); an error about one names its flag (``argument --score-range: ...``).

    ``score_range`` (``"LOW,HIGH"``, a public bound of the reward model chosen without looking at the
    scores) clips every score into it and shifts it by ``-LOW``, so ``R_max = HIGH - LOW``; left out with
    ``r_max`` and ``clip``, the range the pool's manifest declares is used (a note says so). Otherwise
    ``r_max`` (default 1) and scores outside ``[0, R_max]`` are refused unless ``clip``. ``n=None``: the
    largest ``n ≤ 16`` every prompt supports.
    """

    pool: str
    budget_epsilon: float
    budget_delta: float = 1e-3
    n: int | None = None
    r_max: float | None = None
    score_range: str | None = None
    sensitivity: float | None = None
    clip: bool = False
    seed: int | None = 0
    secure: bool = False
    principal: str = "session"
    max_prompts: int | None = None
    shuffle_seed: int | None = None
    progress: bool = True


@dataclass
class PoolSession:
    """A finished session over a scored pool.

    Attributes:
      record: What ``session.json`` holds: :func:`serve_pool`'s result, the pool read's statistics and,
        when the range came from the pool's manifest, ``score_range``.
      spec: The method and parameters that ran (σ_X filled in with R_max when left out).
      options: The options, with ``r_max`` and ``n`` resolved.
    """

    record: dict[str, Any]
    spec: Any
    options: PoolSessionOptions

    def summary(self) -> dict[str, Any]:
        """The record without the per-prompt rows (``--json``'s output)."""
        summary = {k: v for k, v in self.record.items() if k != "per_prompt"}
        for k in ("pure", "zcdp"):
            if k in summary:
                summary[k] = {kk: vv for kk, vv in summary[k].items() if kk != "per_prompt"}
        return summary

    def write(self, out: str | os.PathLike) -> Path:
        """Write ``out/session.json`` (the directory is created) and return its path."""
        from privalign._json import to_jsonable, write_text_atomic

        outdir = Path(out)
        outdir.mkdir(parents=True, exist_ok=True)
        return write_text_atomic(
            outdir / "session.json", json.dumps(to_jsonable(self.record), indent=2, allow_nan=False)
        )

    def notes(self) -> list[str]:
        """What a person should know about the outcome: a filter that served no prompt (the worst case does
        not fit the budget), or a mean true reward below the base policy's (the noise dominates)."""
        out = self.record
        parts = [("", out)] + [
            (f" by the {name} filter", out[k])
            for k, name in (("pure", "pure-ε"), ("zcdp", "zCDP"))
            if k in out
        ]
        return [n for label, part in parts if (n := self._note(label, part))]

    def _note(self, label: str, part: dict[str, Any]) -> str | None:
        opts = self.options
        served, base = part.get("prompts_served"), part.get("base_true_reward")
        got = part.get("mean_true_reward")
        if served == 0:
            delta = f", delta = {self.spec.get('delta'):g}" if self.spec.get("delta") is not None else ""
            return (
                f"no prompt was served{label}: one prompt's worst-case cost (epsilon_max = "
                f"{part.get('epsilon_max', float('nan')):.3g}{delta}) does not fit the budget "
                f"(--budget-epsilon {opts.budget_epsilon:g}, --budget-delta {opts.budget_delta:g}); "
                "raise the budget or the noise"
            )
        if got is not None and base is not None and got == got and got < base:
            return (
                f"mean true reward {got:.4f} is below the base policy's {base:.4f}: at these settings the "
                f"noise dominates the scores (scores in [0, {opts.r_max:g}]); lower the noise "
                "(--sigma-x/--sigma-z, or a larger --epsilon) for useful selections"
            )
        return None


def _public_range(
    opts: PoolSessionOptions, pool: ScoredPool, note: Callable[[str], None]
) -> tuple[ScoredPool, float, dict[str, str] | None]:
    """The pool with its proxy scores in the public range the selectors assume, ``[0, R_max]``, R_max, and
    the range's record when it came from the pool's manifest.

    With a score range (a public bound of the reward model): every score clipped into it and shifted by
    ``-LOW``, a data-independent map, which keeps the guarantee. Without it, scores outside ``[0, R_max]``
    are refused here (unless ``clip``) in one line that says what to give, not after the first prompts."""
    from privalign._validation import parse_floats
    from privalign.data.pools import declared_score_range, pool_manifest_path

    text, declared_in = opts.score_range, None
    if text is None and opts.r_max is None and not opts.clip:
        declared = declared_score_range(opts.pool)
        if declared is not None:
            low, high, _why = declared
            text, declared_in = f"{low!r},{high!r}", str(pool_manifest_path(opts.pool))
            note(
                f"public score range [{low:g}, {high:g}] declared in {declared_in}: scores clipped into it, "
                f"R_max = {high - low:g} (--score-range to choose another)"
            )
    if text is not None:
        rng_ = parse_floats(text, "score_range")
        if len(rng_) != 2 or not rng_[0] < rng_[1] or not all(np.isfinite(rng_)):
            raise PrivacyParameterError(
                f"argument --score-range: must be LOW,HIGH (finite, LOW < HIGH), got {text!r}"
            )
        lo, hi = rng_
        proxy = np.clip(pool.proxy, lo, hi) - lo  # (NaN padding stays NaN)
        source = {"range": text, "declared_in": declared_in} if declared_in else None
        return ScoredPool(proxy, pool.true, pool.counts, pool.prompts), hi - lo, source
    r_max = 1.0 if opts.r_max is None else opts.r_max
    vals = pool.proxy[np.isfinite(pool.proxy)]
    if not opts.clip and vals.size and (vals.min() < 0.0 or vals.max() > r_max):
        raise PrivacyParameterError(
            f"argument --r-max: the pool's proxy scores do not all lie in the public range "
            f"[0, {r_max:g}] (the values are private: not shown). Give the reward model's public range, "
            "chosen without looking at the scores: --score-range LOW,HIGH (scores clipped into it; for an "
            "unbounded reward such as the linear Bradley-Terry proxy of the shipped HH pools), or --r-max "
            "R_MAX for scores in [0, R_MAX], or --clip to clip into [0, R_MAX]"
        )
    return pool, r_max, None


def run_pool_session(
    opts: PoolSessionOptions, spec: Any, *, note: Callable[[str], None] | None = None
) -> PoolSession:
    """Serve a scored pool's prompts with the selector of ``spec`` (a
    :class:`~privalign.alignment.selectors.SelectorSpec` of a private method) under the options' budget, as
    ``privalign session`` does: check the options, read the pool (optionally shuffled by a public seed),
    map its scores into the public range, pick ``n``, fill PrivITP's σ_X with R_max when left out, and
    :func:`serve_pool`. ``note`` receives one-line notes for a person (a coerced pool read, the declared
    range used).

    Raises:
      PrivacyParameterError: an option out of range or options that do not go together (the message names
        the flag; the budgets are checked under their own names, ``budget_epsilon``/``budget_delta``).
    """
    from privalign._validation import check_real
    from privalign.data.pools import ReadStats

    note = note or (lambda _msg: None)
    if opts.score_range is not None and opts.r_max is not None:
        raise PrivacyParameterError(
            "argument --r-max: not used with --score-range (the range is then [0, HIGH - LOW]); drop one"
        )
    # The budgets under their own names: the filters would call them 'epsilon'/'delta', which are other
    # options of a session (the per-query ε, the per-prompt δ).
    check_real(opts.budget_epsilon, "budget_epsilon", low=0.0, closed="neither")
    # (PrivBoN without secure noise is compared with a zCDP filter converted at δ = budget_delta: δ > 0)
    zcdp = spec.kind.accounting == "pure" and not opts.secure
    check_real(opts.budget_delta, "budget_delta", low=0.0, high=1.0, closed="neither" if zcdp else "left")
    stats = ReadStats()
    pool = ScoredPool.read(opts.pool, stats=stats)
    if stats.describe():
        note(f"reading {opts.pool}: {stats.describe()}")
    if opts.shuffle_seed is not None:
        order = np.random.default_rng(opts.shuffle_seed).permutation(pool.proxy.shape[0])
        pool = ScoredPool(
            pool.proxy[order],
            pool.true[order],
            pool.counts[order],
            tuple(pool.prompts[i] for i in order) if pool.prompts else (),
        )
    pool, r_max, source = _public_range(opts, pool, note)
    n = opts.n
    if n is None:  # the largest n ≤ 16 that every prompt supports (2n + 1 candidates for privitp)
        smallest = int(pool.counts.min()) if pool.counts.size else 0
        n = max([1] + [k for k in range(1, 17) if spec.kind.candidates_needed(k) <= smallest])
    if "sigma_x" in {p.name for p in spec.kind.params} and spec.get("sigma_x") is None:
        spec = type(spec).of(spec.method, **{**spec.as_dict(), "sigma_x": r_max})
    sel = spec.build(r_max=r_max, sensitivity=opts.sensitivity, clip=opts.clip)
    record = serve_pool(
        pool,
        sel,
        budget_epsilon=opts.budget_epsilon,
        budget_delta=opts.budget_delta,
        n=n,
        seed=opts.seed,
        secure=opts.secure,
        principal=opts.principal,
        max_prompts=opts.max_prompts,
        progress=opts.progress,
    )
    record["pool_read"] = stats.to_dict()
    if source is not None:
        record["score_range"] = source
    return PoolSession(record, spec, dataclasses.replace(opts, r_max=r_max, n=n))
