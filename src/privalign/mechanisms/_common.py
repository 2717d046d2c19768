"""Shared validation for the mechanisms (private module)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privalign._validation import check_choice, check_finite_matrix, check_finite_vector, check_real
from privalign.accounting.events import RELATIONS, UNITS

__all__ = ["check_epsilon", "check_sensitivity", "check_unit_relation", "check_scores"]


def check_epsilon(value: Any, name: str = "epsilon", *, allow_inf: bool = False) -> float:
    """ε in (0, inf) (or (0, inf] when ``allow_inf``): NaN, ≤ 0 and (by default) ∞ are refused."""
    return check_real(value, name, low=0.0, closed="neither", allow_inf=allow_inf)


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
