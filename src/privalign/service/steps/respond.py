"""Step 6: the privacy block and the answer, encoded to bytes before anything is settled."""

from __future__ import annotations

from typing import Any

from privalign.service import db
from privalign.service import plan as planning
from privalign.service.job import Job, Outcome, Reserved, encode, remaining_dict, unit_name

__all__ = ["respond"]


def _eps_of(*, realized: bool, plan: planning.Plan, ev: Any) -> float:
    for attr in (("epsilon_realized",) if realized else ("epsilon_max",)) + ("epsilon",):
        v = getattr(ev, attr, None)
        if v is not None:
            return float(v)
    return float(plan.epsilon)


def respond(
    job: Job, r: Reserved, idx: int, text: str, n: int, realized: Any, units: tuple[int, int] | None
) -> Outcome:
    """Step 6: the privacy block and the answer, encoded to bytes (before anything is settled)."""
    key = r.key
    block: dict[str, Any] = {
        "method": job.plan.method,
        "n": n,
        "accounting": key.accounting,
        "defaulted": list(job.plan.defaulted),  # the privacy fields the server filled in
    }
    settle = None
    if r.receipt is not None:
        rc = r.receipt
        assert units is not None  # a receipt exists only for a private method, which is always charged
        block.update(
            {
                "epsilon_requested": job.plan.epsilon,
                "epsilon_reserved": _eps_of(realized=False, plan=job.plan, ev=job.plan.worst),
                "epsilon_charged": _eps_of(realized=True, plan=job.plan, ev=realized),
                "delta": float(getattr(realized, "delta", 0.0) or 0.0),
                "charged": db.from_units(units[0], db.EPS_SCALE),
                "reserved": db.from_units(rc.cost[0], db.EPS_SCALE),
                "charge_unit": unit_name(key),
                "remaining": remaining_dict(key, rc.remaining_after(units)),
                "reservation_id": rc.reservation_id,
            }
        )
        settle = (key.key_id, rc.reservation_id, units, realized.to_dict())
    else:
        # Non-private (bon, or the benchmark baseline): no guarantee, nothing charged; ε = ∞ is not JSON.
        block.update(
            {"epsilon_requested": None, "epsilon_charged": None, "private": False, "guarantee": "none"}
        )
    body = job.render(idx, text, block)
    if job.stream is not None:
        return Outcome(body, job.stream(body), "text/event-stream", block.get("reservation_id"), settle)
    return Outcome(body, encode(body), "application/json", block.get("reservation_id"), settle)
