"""Shared validation for the mechanisms (private module)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privalign._validation import (
    check_choice,
    check_epsilon_range,
    check_finite_matrix,
    check_finite_vector,
    check_real,
)
from privalign.accounting.events import RELATIONS, UNITS

__all__ = [
    "check_epsilon",
    "check_sensitivity",
    "check_unit_relation",
    "check_scores",
    "gumbel_scale",
    "gumbel_epsilon",
]


def _div_up(num: float, den: float) -> float:
    """The smallest float ``q`` with ``q·den ≥ num`` in exact arithmetic (num, den > 0 finite).

    IEEE division rounds to nearest, so ``num / den`` can be half an ulp *below* the real quotient; for a
    noise scale or a charged ε that would be the non-conservative side.
    """
    from fractions import Fraction

    q = num / den
    if math.isfinite(q) and Fraction(q) * Fraction(den) < Fraction(num):
        q = math.nextafter(q, math.inf)
    return q


def _div_down(num: float, den: float) -> float:
    """The largest float ``q`` with ``q·den ≤ num`` in exact arithmetic (num, den > 0 finite)."""
    from fractions import Fraction

    q = num / den
    if math.isfinite(q) and Fraction(q) * Fraction(den) > Fraction(num):
        q = math.nextafter(q, 0.0)
    return q


def _finite_ratio(q: float, what: str, num_name: str, num: float, den_name: str, den: float) -> float:
    if not math.isfinite(q) or q <= 0.0:
        from privalign.errors import PrivacyParameterError

        raise PrivacyParameterError(
            f"The {what} {num_name}/{den_name} must be a finite positive float. Got {num_name}={num!r}, "
            f"{den_name}={den!r} instead."
        )
    return q


def gumbel_scale(sensitivity: float, epsilon: float) -> float:
    """The exponential mechanism's Gumbel scale 2Δ/ε, rounded up (never below the real 2Δ/ε): the scale
    actually used then gives a privacy loss of at most ε, not ε plus a rounding error."""
    return _finite_ratio(
        _div_up(2.0 * sensitivity, epsilon),
        "Gumbel scale",
        "2*sensitivity",
        2.0 * sensitivity,
        "epsilon",
        epsilon,
    )


def gumbel_epsilon(sensitivity: float, scale: float) -> float:
    """The ε of Gumbel noise of a given scale, 2Δ/σ, rounded up (what an accountant must be charged)."""
    return _finite_ratio(
        _div_up(2.0 * sensitivity, scale),
        "charged epsilon",
        "2*sensitivity",
        2.0 * sensitivity,
        "scale",
        scale,
    )


def check_epsilon(value: Any, name: str = "epsilon", *, allow_inf: bool = False) -> float:
    """ε by the one rule (finite, in ``[EPS_MIN, EPS_MAX]``; ``_validation.check_epsilon_range``),
    or exactly ∞ when ``allow_inf``: NaN, ≤ 0, tiny and huge finite ε are refused."""
    return check_epsilon_range(value, name, allow_inf=allow_inf)


def check_sensitivity(value: Any, name: str = "sensitivity") -> float:
    """A sensitivity in (0, inf)."""
    return check_real(value, name, low=0.0, closed="neither")


def check_unit_relation(unit: Any, relation: Any) -> None:
    check_choice(unit, "unit", UNITS)
    check_choice(relation, "relation", RELATIONS)


def check_scores(scores: Any, name: str = "scores") -> np.ndarray:
    """A non-empty, finite 1-D vector or 2-D matrix (rows = independent queries) of float64."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim == 1:
        return check_finite_vector(arr, name)
    if arr.ndim == 2:
        return check_finite_matrix(arr, name)
    from privalign.errors import PrivacyParameterError

    raise PrivacyParameterError(
        f"The '{name}' parameter must be a 1-D vector or a 2-D array (queries × candidates). "
        f"Got an array of shape {arr.shape} instead."
    )


def is_inf(x: float) -> bool:
    return math.isinf(x)
