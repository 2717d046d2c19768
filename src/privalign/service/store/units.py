"""Ledger units: costs rounded up and limits rounded down to integer units, and the :class:`Receipt` of a
reservation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from privalign.errors import PrivacyParameterError
from privalign.service import db
from privalign.service.durability import Ticket

EPS, DLT = db.EPS_SCALE, db.DELTA_SCALE


@dataclass(frozen=True)
class Receipt:
    """A reservation written to the ledger.

    Attributes:
      reservation_id: the ledger's reservation id.
      principal: who pays.
      cost: the reserved cost in integer units ``(a, b)``.
      totals: the principal's totals in integer units right after the reservation (this reservation
        included): ``limit_*``, ``spent_*``, ``reserved_*``.
      ticket: with group commit, the flush that makes the reservation durable
        (:meth:`SQLBudgetStore.wait_durable`); ``None`` when the reservation was durable (or not meant to
        be) when the receipt was made.
    """

    reservation_id: str
    principal: str
    cost: tuple[int, int]
    totals: dict[str, int]
    ticket: Ticket | None = field(default=None, compare=False, repr=False)

    def remaining_after(self, charged: tuple[int, int]) -> tuple[int, int]:
        """What is left (units) once this reservation is settled at ``charged``, counting other requests
        as they stood when this one reserved. Never negative."""
        t = self.totals
        a = t["limit_epsilon"] - t["spent_epsilon"] - t["reserved_epsilon"] + self.cost[0] - charged[0]
        b = t["limit_delta"] - t["spent_delta"] - t["reserved_delta"] + self.cost[1] - charged[1]
        return max(0, a), max(0, b)


def cost_units(cost: Sequence[float], name: str = "cost") -> tuple[int, int]:
    """A cost pair ``(a, b)`` (floats) → integer units, rounded **up**."""
    a, b = _check_cost(cost, name)
    return db.units_up(a, EPS), db.units_up(b, DLT)


def limit_units(limit: Sequence[float] | None) -> tuple[int, int] | None:
    """A limit pair → integer units, rounded **down** (``None`` stays ``None``: the granted limit)."""
    if limit is None:
        return None
    la, lb = float(limit[0]), float(limit[1])
    if math.isnan(la) or math.isnan(lb) or la < 0 or lb < 0:
        raise PrivacyParameterError(
            f"The 'limit' parameter must be a pair of non-negative numbers. Got {limit!r} instead."
        )
    cap = db.MAX_UNITS
    return (
        cap if math.isinf(la) else min(cap, db.units_down(min(la, cap / EPS), EPS)),
        cap if math.isinf(lb) else min(cap, db.units_down(min(lb, cap / DLT), DLT)),
    )


def _check_cost(cost: Sequence[float], name: str) -> tuple[float, float]:
    if len(cost) != 2:
        raise PrivacyParameterError(f"The '{name}' parameter must be a pair (a, b). Got {cost!r} instead.")
    if any(isinstance(v, bool) for v in cost):
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a pair of numbers, not bools. Got {cost!r} instead."
        )
    a, b = float(cost[0]), float(cost[1])
    for v in (a, b):
        if math.isnan(v) or v < 0 or math.isinf(v):
            raise PrivacyParameterError(
                f"The '{name}' parameter must be a pair of finite non-negative floats. Got {cost!r} instead."
            )
    return a, b
