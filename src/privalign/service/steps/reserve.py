"""Step 1: reserve the worst case in the key's ledger row (429 before any score), or cancel."""

from __future__ import annotations

from collections.abc import Callable

from privalign.accounting import filters as F
from privalign.errors import BudgetExhaustedError, UnsupportedEventError
from privalign.service import db
from privalign.service import plan as planning
from privalign.service.errors import ApiError
from privalign.service.job import FILTERS, Reserved, unit_name
from privalign.service.keys import KeyInfo
from privalign.service.state import ServiceState
from privalign.service.store import ActiveKeyCheckFailed

__all__ = ["reserve", "cancel"]

def reserve(state: ServiceState, key: KeyInfo, plan: planning.Plan, reauth: Callable[[], KeyInfo] | None,
            endpoint: str = "") -> Reserved:
    """Step 1. ``reauth``: ``None`` if ``key`` was authenticated from the database; otherwise ``key``
    comes from the key cache and the reserving statement also checks that the key is active
    (``require_active``); if it writes nothing, the key is authenticated from the database (401) and the
    reservation decided again exactly as without the cache."""
    if not (state.private and plan.method != "bon"):
        return Reserved(key)
    flt = FILTERS[key.accounting]
    try:
        cost = flt.cost(plan.worst)
    except UnsupportedEventError as exc:
        if reauth is not None:
            key = reauth()
        raise ApiError(400, "invalid_request_error", f"Method {plan.method!r} is not supported by this key's {key.accounting!r} "
                       f"accounting: {exc}", param="privacy.method") from None
    event = plan.worst.to_dict()
    receipt = None
    if reauth is not None:
        try:
            receipt = state.store.reserve(key.key_id, cost, None, event=event, require_active=True)
        except (ActiveKeyCheckFailed, BudgetExhaustedError):
            key = reauth()  # nothing was written: authenticate from the database and decide again
            flt = FILTERS[key.accounting]
    if receipt is None:
        try:
            receipt = state.store.reserve(key.key_id, cost, None, event=event)
        except BudgetExhaustedError as exc:
            state.metrics.refusals.labels(endpoint).inc()
            rem = {unit_name(key): exc.remaining.get("primary", 0.0), "delta": exc.remaining.get("delta", 0.0)}
            raise ApiError(
                429, "budget_exhausted",
                f"Privacy budget exhausted: this request needs {unit_name(key)}={cost[0]:.9g}, delta={cost[1]:.3g}; the key has "
                f"{unit_name(key)}={rem[unit_name(key)]:.9g}, delta={rem['delta']:.3g} left. Nothing was charged. "
                "GET /v1/budget shows the key's budget; ask the operator for a top-up, or lower privacy.epsilon or privacy.n.",
                retry=False, remaining=rem,
            ) from None
    state.metrics.epsilon_reserved.labels(key.accounting).inc(db.from_units(receipt.cost[0], db.EPS_SCALE))
    res = F.Reservation(id=receipt.reservation_id, principal=key.key_id, worst_case=plan.worst, cost=cost)
    return Reserved(key, flt, res, receipt)


def _cancel(state: ServiceState, r: Reserved) -> None:
    if r.receipt is not None:
        state.store.cancel(r.receipt.reservation_id)
        state.metrics.cancelled.inc()




def cancel(state: ServiceState, r: Reserved) -> None:
    """Release a reservation whose mechanism never touched private data."""
    if r.receipt is not None:
        state.store.cancel(r.receipt.reservation_id)
        state.metrics.cancelled.inc()
