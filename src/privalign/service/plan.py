"""Step 0 of the path: turn a validated request's ``privacy`` object into a :class:`Plan` (method,
parameters, worst-case event), range-checking every privacy parameter **before** any reservation.

Public bounds (refused with a 400 naming the parameter, nothing charged):

* ``epsilon``: finite, in ``[limits.min_epsilon, limits.max_epsilon]`` (the floor is 10⁻⁶ by default and
  never below 10⁻⁹, the ledger's unit). PrivBoN's ε is **rounded down to the ledger unit** (10⁻⁹) and the
  exponential mechanism is run at a float ε whose exact value does not exceed it, so the charge is exactly
  the requested number of units: a budget of 2.0 serves exactly twenty ε = 0.1 requests. The float ε and
  the Gumbel scale are the library's (``PrivBoN.for_budget``:
  :func:`privalign.alignment.priv_bon.privbon_epsilon_within`; scale 2Δ/ε rounded up, charged ε rounded up).
* ``n``: in ``[1, limits.max_n]``, and the method's candidate count (PrivITP: ``2n + 1``) at most
  ``limits.max_n``.
* A method's parameters (PrivITP's ``beta``, ``sigma_x``, ``sigma_z``): within the public ``bounds`` the
  selector class declares (``[1e-6, 1e6]`` for each); a field the method does not declare is refused. A
  method whose parameters fix its noise (PrivITP): the worst-case ε_max must be finite, at least the ledger
  unit and at most the request's ``epsilon`` cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np

from privalign.accounting.events import PrivacyEvent
from privalign.alignment.selectors import Selector, method_class, methods
from privalign.errors import PrivacyParameterError
from privalign.service import db
from privalign.service.config import ServiceConfig
from privalign.service.errors import ApiError
from privalign.service.schemas import PrivacyParams

__all__ = ["Plan", "make_plan", "pool_size", "select", "quantize_epsilon"]


@dataclass
class Plan:
    """A validated selection request: method, ε, pool size n, parameters, worst-case event, mechanism."""

    method: str
    epsilon: float
    n: int
    params: dict[str, Any]
    worst: PrivacyEvent
    mech: Selector
    #: the privacy fields the request left to the server's defaults (echoed in the answer's block)
    defaulted: tuple[str, ...] = ()


def _bad(param: str, msg: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, "invalid_request_error", msg, param=param, code=code)


def quantize_epsilon(eps: float) -> tuple[int, float]:
    """``(units, eps_run)``: the requested ε rounded down to the ledger unit (10⁻⁹, read from the
    shortest decimal that round-trips the float, so ``0.1`` is exactly 10⁸ units), and the largest float
    whose exact value is at most ``units`` × 10⁻⁹ (the ε the mechanism runs at)."""
    units = int((Decimal(repr(float(eps))) * db.EPS_SCALE).to_integral_value(rounding="ROUND_FLOOR"))
    target = Fraction(units, db.EPS_SCALE)
    run = float(target)
    while Fraction(run) > target:
        run = math.nextafter(run, 0.0)
    return units, run


def _check_pool(kind: Any, n: int, max_n: int) -> None:
    """``limits.max_n`` caps the candidates a request generates or brings, for every method: PrivITP's
    ``2n + 1`` (two pools of n and a fallback) included. Refused before anything is generated or
    reserved."""
    need = kind.candidates_needed(n)
    if need > max_n:
        most = max((m for m in range(1, max_n + 1) if kind.candidates_needed(m) <= max_n), default=0)
        hint = (
            f"use n ≤ {most}"
            if most >= 1
            else f"this server's limits.max_n is below {kind.name}'s minimum of {kind.candidates_needed(1)}"
        )
        raise _bad(
            "privacy.n",
            f"The 'privacy.n' parameter {n} makes {kind.name} use {kind.layout.describe_count()} = {need} "
            f"candidates, above limits.max_n = {max_n} (the cap on candidates generated or brought): {hint}.",
        )


def _require_privacy(cfg: ServiceConfig, pp: PrivacyParams | None, private: bool) -> None:
    """``privacy.require_privacy``: a request that may spend budget (any private method) states
    ``privacy.epsilon``, the most it may spend, so no request spends a server default the client never
    saw."""
    if not cfg.privacy.require_privacy or not private or (pp is not None and pp.epsilon is not None):
        return
    name = "privacy" if pp is None else "privacy.epsilon"
    raise _bad(
        name,
        f"The '{name}' parameter is required on this server (privacy.require_privacy = true): every request "
        'states the most it may spend, e.g. "privacy": {"epsilon": 0.5} (with the openai client: '
        'extra_body={"privacy": {"epsilon": 0.5}}). GET /v1/budget shows what is left. Nothing was charged.',
        "missing_required_parameter",
    )


def make_plan(
    cfg: ServiceConfig, pp: PrivacyParams | None, n_default: int, *, n_implied: bool = False
) -> Plan:
    """Validate the ``privacy`` object against the server's public bounds and build the plan.

    ``n_implied``: ``n_default`` is the count the request's candidates imply (``/v1/select``), not a
    server default.

    Raises:
      ApiError: 400 naming the parameter, the constraint and the value. Nothing has been reserved.
    """
    plan = _make_plan(cfg, pp, n_default)
    pp = pp or PrivacyParams()
    plan.defaulted = tuple(
        name
        for name, missing in (
            ("method", pp.method is None),
            ("epsilon", pp.epsilon is None and plan.mech.private),
            ("n", pp.n is None and not n_implied),
        )
        if missing
    )
    return plan


def _make_plan(cfg: ServiceConfig, given: PrivacyParams | None, n_default: int) -> Plan:
    pv, lim = cfg.privacy, cfg.limits
    pp = given or PrivacyParams()
    if pp.seed is not None:
        raise _bad(
            "privacy.seed",
            "The 'privacy.seed' parameter is not accepted: the service uses secure noise only.",
        )
    method = pp.method or pv.allowed_methods[0]
    kind = method_class(method) if method in methods() else None
    if kind is None or method not in pv.allowed_methods or (not kind.private and not pv.allow_non_private):
        raise _bad(
            "privacy.method",
            f"The 'privacy.method' parameter must be one of {list(pv.allowed_methods)} on this server. "
            f"Got {method!r} instead.",
        )
    _require_privacy(cfg, given, kind.private)
    eps = pp.epsilon if pp.epsilon is not None else pv.default_epsilon
    if not (math.isfinite(eps) and lim.min_epsilon <= eps <= lim.max_epsilon):
        raise _bad(
            "privacy.epsilon",
            f"The 'privacy.epsilon' parameter must be a finite number in [{lim.min_epsilon:g}, "
            f"{lim.max_epsilon:g}]. Got {eps!r} instead.",
        )
    n = pp.n if pp.n is not None else n_default
    if not (1 <= n <= lim.max_n):
        raise _bad("privacy.n", f"The 'privacy.n' parameter must be in [1, {lim.max_n}]. Got {n!r} instead.")
    _check_pool(kind, n, lim.max_n)
    params = _method_params(cfg, pp, kind)
    units, _ = quantize_epsilon(eps)
    cap = Fraction(units, db.EPS_SCALE)  # the request's ε rounded down to the ledger unit, exactly
    try:
        sel = kind.for_budget(cap, n, params, r_max=pv.reward_max, sensitivity=pv.sensitivity, clip=True)
        worst = sel.worst_case_event(n)
        worst_eps = sel.worst_case_epsilon(n)
    except (PrivacyParameterError, TypeError, ValueError, KeyError, ArithmeticError) as exc:
        if kind.spends_budget:  # pragma: no cover - one or two ulps suffice
            raise _bad(
                "privacy.epsilon", f"The 'privacy.epsilon' parameter {eps!r} cannot be charged exactly."
            ) from None
        raise _bad("privacy", f"Invalid {method} parameters: {exc}") from None
    if not kind.private:
        return Plan(method, math.inf, n, params, worst, sel)
    if kind.spends_budget:  # calibrated: the charged ε is at most the units exactly
        if not worst_eps <= eps:  # pragma: no cover - a selector whose for_budget overshoots the cap
            raise _bad(
                "privacy.epsilon", f"The 'privacy.epsilon' parameter {eps!r} cannot be charged exactly."
            )
        return Plan(method, float(cap), n, params, worst, sel)
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    if not math.isfinite(worst_eps) or worst_eps < 1.0 / db.EPS_SCALE:
        raise _bad(
            "privacy",
            f"The {method} worst-case cost ε_max={worst_eps!r} ({shown}) must be finite and at least 1e-9 "
            "(the ledger unit).",
        )
    if worst_eps > eps:
        raise _bad(
            "privacy.epsilon",
            f"The {method} worst-case cost ε_max={worst_eps:.6g} (n={n}, {shown}) exceeds the "
            f"'privacy.epsilon' cap {eps:g}: raise epsilon or the noise, or lower n.",
        )
    return Plan(method, eps, n, params, worst, sel)


def _method_params(cfg: ServiceConfig, pp: PrivacyParams, kind: Any) -> dict[str, Any]:
    """The method's parameters: the server's defaults (``[privacy.<method>]``), overridden by the request's
    fields, each within the method's public bounds; a field the method does not take is refused."""
    declared = {p.name: p for p in kind.params}
    params = dict(cfg.privacy.params_for(kind.name))
    for name in PrivacyParams.method_fields():
        v = getattr(pp, name)
        if v is None:
            continue
        p = declared.get(name)
        if p is None:
            takers = sorted(m for m in cfg.privacy.allowed_methods if name in _names(m))
            raise _bad(
                f"privacy.{name}",
                f"The 'privacy.{name}' parameter does not apply to {kind.name}"
                + (f" (it applies to {', '.join(takers)})." if takers else "."),
            )
        if p.bounds is not None:
            lo, hi = p.bounds
            if not (math.isfinite(v) and lo <= v <= hi):
                raise _bad(
                    f"privacy.{name}",
                    f"The 'privacy.{name}' parameter must be a finite number in [{lo:g}, {hi:g}]. "
                    f"Got {v!r} instead.",
                )
        params[name] = v
    return params


def _names(method: str) -> set[str]:
    return {p.name for p in method_class(method).params} if method in methods() else set()


def pool_size(plan: Plan) -> int:
    """Candidates needed: n, or 2n + 1 for privitp (phase-1 pool, phase-2 pool, fallback): the
    selector's."""
    return int(plan.mech.candidates_needed(plan.n))


def select(plan: Plan, scores: np.ndarray, noise: Any) -> tuple[int, PrivacyEvent]:
    """Run the selection on the clipped scores of the flat candidate list; returns (index into the
    candidates, realized event). The layout (PrivITP: pool A, pool B, fallback) is the selector's."""
    out = plan.mech.pick(scores, rng=noise)
    return int(out.index), out.event
