"""Step 1: reserve the worst case in the ledger row of the key's budget principal (the key's own budget, or
its user's shared one; 429 before any score), or cancel."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from privalign.accounting import filters as F
from privalign.errors import BudgetExhaustedError, ReservationError, UnsupportedEventError
from privalign.service import db
from privalign.service import plan as planning
from privalign.service.durability import DurabilityError
from privalign.service.errors import ApiError
from privalign.service.job import FILTERS, Reserved, unit_name
from privalign.service.keys import KeyInfo
from privalign.service.state import ServiceState
from privalign.service.store import ActiveKeyCheckFailed

__all__ = ["reserve", "cancel", "durable"]

log = logging.getLogger("privalign.service")


def reserve(
    state: ServiceState,
    key: KeyInfo,
    plan: planning.Plan,
    reauth: Callable[[], KeyInfo] | None,
    endpoint: str = "",
    *,
    overlap: bool = False,
    reservation_id: str | None = None,
) -> Reserved:
    """Step 1. ``reauth``: ``None`` if ``key`` was authenticated from the database; otherwise ``key``
    comes from the key cache and the reserving statement also checks that the key is active
    (``require_active``); if it writes nothing, the key is authenticated from the database (401) and the
    reservation decided again exactly as without the cache.

    The reservation is committed (every later reservation of the key's principal sees it) when this returns;
    with group commit its flush to disk may still be pending (``receipt.ticket``): :func:`durable` must be
    called before anything that depends on the private scores is released. ``overlap``: start that flush now
    in the flusher's thread (the request goes on to generate, waiting on I/O); otherwise it runs at the gate,
    in the request's thread, shared with every reservation committed by then.

    ``reservation_id``: the id to reserve under (default: a fresh one). Any failure other than a refusal
    (a database error) is answered 503 once the reservation is known not to stand: if the statement wrote
    it after all, it is cancelled (nothing private was touched yet); if that cannot be checked, the answer
    says the reservation may stand (charged at its reserved cost by reconciliation) and is ``charged``."""
    if not (state.private and plan.mech.private):
        return Reserved(key)
    rid = reservation_id or uuid.uuid4().hex
    try:
        return _reserve(state, key, plan, reauth, endpoint, overlap, rid)
    except ApiError:
        raise
    except Exception as exc:  # noqa: BLE001 - a database error: say whether anything stands
        raise _reserve_failed(state, rid, exc) from None


def _reserve_failed(state: ServiceState, rid: str, exc: Exception) -> ApiError:
    """The answer to a reserve that raised ``exc``: cancel the reservation if it was written after all."""
    state.metrics.db_errors.inc()
    log.error("reserve failed: %s", type(exc).__name__)
    try:
        state.store.cancel(rid)  # written despite the error (e.g. a commit whose reply was lost)
    except ReservationError:
        pass  # unknown id: nothing was written
    except Exception as exc2:  # noqa: BLE001 - the database is unreachable: the outcome is unknown
        log.error("reservation %s could not be checked: %s", rid, type(exc2).__name__)
        return ApiError(
            503,
            "service_unavailable",
            "The budget database failed while reserving and could not be checked: the reservation may "
            "stand, and is then charged at its reserved cost when reconciled (no answer was computed). A "
            "retry may be charged again.",
            charged=True,
        )
    return ApiError(
        503,
        "service_unavailable",
        "The budget database failed while reserving; nothing was charged. Retry in a few seconds.",
        headers={"Retry-After": "2"},
    )


def _reserve(
    state: ServiceState,
    key: KeyInfo,
    plan: planning.Plan,
    reauth: Callable[[], KeyInfo] | None,
    endpoint: str,
    overlap: bool,
    rid: str,
) -> Reserved:
    flt = FILTERS[key.accounting]
    try:
        cost = flt.cost(plan.worst)
    except UnsupportedEventError as exc:
        if reauth is not None:
            key = reauth()
        raise ApiError(
            400,
            "invalid_request_error",
            f"Method {plan.method!r} is not supported by this key's {key.accounting!r} accounting: {exc}",
            param="privacy.method",
        ) from None
    event = plan.worst.to_dict()
    receipt = None
    if reauth is not None:
        try:
            receipt = state.store.reserve(
                key.principal,
                cost,
                None,
                event=event,
                require_active=True,
                active_key=key.key_id,  # this key, whose user's budget (if any) is the principal
                wait=False,
                background=overlap,
                reservation_id=rid,
            )
        except (ActiveKeyCheckFailed, BudgetExhaustedError):
            key = reauth()  # nothing was written: authenticate from the database and decide again
            flt = FILTERS[key.accounting]
    if receipt is None:
        try:
            receipt = state.store.reserve(
                key.principal, cost, None, event=event, wait=False, background=overlap, reservation_id=rid
            )
        except BudgetExhaustedError as exc:
            state.metrics.refusals.labels(endpoint).inc()
            rem = {
                unit_name(key): exc.remaining.get("primary", 0.0),
                "delta": exc.remaining.get("delta", 0.0),
            }
            raise ApiError(
                429,
                "budget_exhausted",
                f"Privacy budget exhausted: this request needs {unit_name(key)}={cost[0]:.9g}, "
                f"delta={cost[1]:.3g}; {_holder(key)} has "
                f"{unit_name(key)}={rem[unit_name(key)]:.9g}, delta={rem['delta']:.3g} left. "
                "Nothing was charged. "
                "GET /v1/budget shows the budget; ask the operator for a top-up, "
                "or lower privacy.epsilon or privacy.n.",
                retry=False,
                remaining=rem,
            ) from None
    state.metrics.epsilon_reserved.labels(key.accounting).inc(db.from_units(receipt.cost[0], db.EPS_SCALE))
    res = F.Reservation(id=receipt.reservation_id, principal=key.principal, worst_case=plan.worst, cost=cost)
    return Reserved(key, flt, res, receipt)


def _holder(key: KeyInfo) -> str:
    """Whose budget a refusal names: the key's own, or its user's (shared by the user's keys)."""
    return "the key" if key.user is None else f"user {key.user!r} (shared by the user's keys)"


def cancel(state: ServiceState, r: Reserved) -> None:
    """Release a reservation whose mechanism never touched private data. If the database fails, the
    reservation stands (charged at its reserved cost when reconciled): 503, ``charged``."""
    if r.receipt is not None:
        try:
            state.store.cancel(r.receipt.reservation_id)
        except Exception as exc:  # noqa: BLE001 - a database error
            state.metrics.db_errors.inc()
            log.error(
                "reservation %s could not be cancelled: %s", r.receipt.reservation_id, type(exc).__name__
            )
            raise ApiError(
                503,
                "service_unavailable",
                "The budget database failed while releasing the reservation: it stands, and is charged "
                "at its reserved cost when reconciled (no private score was computed). Do not retry: a "
                "retry is charged again.",
                charged=True,
            ) from None
        state.metrics.cancelled.inc()


def durable(state: ServiceState, r: Reserved, deadline: float) -> None:
    """Gate: return once ``r``'s reservation is on disk (at once without group commit, or if it already
    is). Called before any answer or any error that follows scoring is released. If the flush fails or
    does not complete before the request's deadline (at least 1 s from now), nothing is released: 503,
    charged at the reserved cost (the scorer may have run), ``x-should-retry: false``."""
    if r.receipt is None or r.receipt.ticket is None:
        return
    try:
        state.store.wait_durable(r.receipt, timeout=max(1.0, deadline - time.monotonic()))
    except DurabilityError as exc:
        state.metrics.db_errors.inc()
        log.error("reservation %s not confirmed on disk: %s", r.receipt.reservation_id, exc)
        raise ApiError(
            503,
            "service_unavailable",
            "The ledger could not confirm the reservation on disk, so no answer is "
            "released; the reservation stays charged at its reserved cost. Do not retry: a retry is charged "
            "again.",
            charged=True,
        ) from None
