"""Step 5: the filter's charge for the realized event (pure), in exact ledger units."""

from __future__ import annotations

from typing import Any

from privalign.errors import ReservationError
from privalign.service.job import Reserved
from privalign.service.store import cost_units

__all__ = ["charge"]


def charge(r: Reserved, realized: Any) -> tuple[int, int]:
    """Step 5: the filter's charge for the realized event (checked ≤ reserved), in exact ledger units."""
    assert r.flt is not None and r.reservation is not None and r.receipt is not None  # private methods only
    cost = r.flt.charge(r.reservation, realized)
    units = cost_units(cost)
    if units[0] > r.receipt.cost[0] or units[1] > r.receipt.cost[1]:  # pragma: no cover - ceil is monotone
        raise ReservationError(f"charge {units} above the reservation {r.receipt.cost}")
    return units
