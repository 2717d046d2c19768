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

import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from privalign._validation import check_int
from privalign.alignment.base import FALLBACK, CandidateLayout
from privalign.data.pools import ScoredPool
from privalign.errors import BudgetExhaustedError, PrivacyParameterError
from privalign.rng import as_noise_source

__all__ = ["SessionReport", "run_session", "privbon_zcdp_comparison", "serve_pool"]


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
