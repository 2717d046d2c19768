"""Validation helpers with one message format.

Format (after scikit-learn): ``The 'epsilon' parameter must be a float in the range (0, inf). Got -1.0
instead.`` Wrong types raise ``TypeError``; wrong values raise :class:`PrivacyParameterError`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from privalign.errors import PrivacyParameterError

__all__ = [
    "check_real",
    "check_int",
    "check_probability",
    "check_finite_vector",
    "check_finite_matrix",
    "check_in_range",
    "check_choice",
    "parse_floats",
    "EPS_MIN",
    "EPS_MAX",
    "EPSILON_RULE",
    "epsilon_problem",
    "check_epsilon_range",
]

#: The one range of a mechanism's ε, applied by every entry point (library constructors, the command line,
#: the service) before any work: ε must be finite and in ``[EPS_MIN, EPS_MAX]``.
#:
#: * ``EPS_MIN = 1e-9``: below it ε is not numerically meaningful in float64. Randomized response flips with
#:   probability ρ = 1/(1+e^ε) = 1/2 − ε/4 + O(ε³); the few ulps (≈ 1e-16) of rounding in ρ must stay far
#:   below ε/4 for the debiasing factor 1/(1−2ρ) to be right, and at 1e-9 they move it by under 1e-6
#:   relative (at ε ≈ 2e-16 ρ rounds to exactly 1/2 and the factor is infinite). It is also the unit of the
#:   service's ledger, the finest ε any privalign accounting records.
#: * ``EPS_MAX = 700``: above ln(max float64) ≈ 709.78, e^ε, the factor the guarantee bounds a probability
#:   ratio by, is not a float64 number; ε that large promises nothing anyway (a non-private run is asked for
#:   by name, never reached through a huge ε).
#:
#: A mechanism may refuse a smaller range still, for a derived parameter (DP-SGD cannot calibrate its
#: noise multiplier below 1e4 for a tiny ε); that refusal also names ε.
EPS_MIN = 1e-9
EPS_MAX = 700.0
#: The rule in words, as the messages quote it.
EPSILON_RULE = f"a finite ε in [{EPS_MIN:g}, {EPS_MAX:g}]"
_TOO_SMALL = (
    f"below {EPS_MIN:g} the noise is numerically meaningless (e.g. randomized response's flip rate "
    "1/(1+e^ε) rounds to 1/2)"
)
_TOO_LARGE = f"above {EPS_MAX:g}, e^ε overflows float64 and no privacy is left to state"


def _fmt_range(low: float | None, high: float | None, closed: str) -> str:
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    left = "[" if closed in ("left", "both") and low is not None else "("
    right = "]" if closed in ("right", "both") and high is not None else ")"
    return f"{left}{lo}, {hi}{right}"


def check_real(
    value: Any,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    closed: str = "neither",
    allow_inf: bool = False,
) -> float:
    """Return ``float(value)`` after checking it is a finite real in the given interval.

    Args:
      value: The value to check.
      name: The parameter's name, used in the message.
      low, high: Bounds (``None`` = unbounded).
      closed: Which ends are closed: ``"neither"``, ``"left"``, ``"right"`` or ``"both"``.
      allow_inf: Accept ``+inf`` (e.g. ε = ∞ meaning "no privacy").

    Raises:
      TypeError: not a real number.
      PrivacyParameterError: NaN, infinite (unless allowed) or outside the interval.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"The '{name}' parameter must be a real number. Got {value!r} of type {type(value).__name__} "
            "instead."
        )
    v = float(value)
    rng = _fmt_range(low, high, closed)
    if math.isnan(v) or (math.isinf(v) and not (allow_inf and v > 0 and high is None)):
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a finite float in the range {rng}. Got {v!r} instead."
        )
    ok = True
    if low is not None:
        ok &= v >= low if closed in ("left", "both") else v > low
    if high is not None:
        ok &= v <= high if closed in ("right", "both") else v < high
    if not ok:
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a float in the range {rng}. Got {v!r} instead."
        )
    return v


def epsilon_problem(value: float) -> str | None:
    """``None`` when ``value`` obeys the ε rule (finite, :data:`EPS_MIN` ≤ ε ≤ :data:`EPS_MAX`); else why
    not, in words to follow the value in a message (the caller names its flag or parameter and the rule,
    :data:`EPSILON_RULE`)."""
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        return "it is not finite"
    if v <= 0:
        return "ε must be > 0"
    if v < EPS_MIN:
        return _TOO_SMALL
    if v > EPS_MAX:
        return _TOO_LARGE
    return None


def check_epsilon_range(value: Any, name: str = "epsilon", *, allow_inf: bool = False) -> float:
    """Return ``float(value)`` after checking the one ε rule: finite and in ``[EPS_MIN, EPS_MAX]``.

    ``allow_inf`` accepts exactly ``+inf`` (a library's explicit "no privacy noise"); a finite ε above
    :data:`EPS_MAX` is still refused (ask for ``inf`` by name instead).

    Raises:
      TypeError: not a real number.
      PrivacyParameterError: NaN, infinite (unless allowed), ≤ 0 or outside the range; the message names
        ``name``, the range and the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"The '{name}' parameter must be a real number. Got {value!r} of type {type(value).__name__} "
            "instead."
        )
    v = float(value)
    if allow_inf and v == math.inf:
        return v
    why = epsilon_problem(v)
    if why is None:
        return v
    extra = f": {why}" if why in (_TOO_SMALL, _TOO_LARGE) else ""
    raise PrivacyParameterError(
        f"The '{name}' parameter must be a finite float in the range [{EPS_MIN:g}, {EPS_MAX:g}]. Got {v!r} "
        f"instead{extra}."
    )


def check_int(value: Any, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``int(value)`` after checking it is an integer in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"The '{name}' parameter must be an int. Got {value!r} of type {type(value).__name__} instead."
        )
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise PrivacyParameterError(
            f"The '{name}' parameter must be an int in the range [{lo}, {hi}]. Got {v} instead."
        )
    return v


def check_probability(value: Any, name: str, *, closed: str = "neither") -> float:
    """A probability in (0, 1) by default (δ, flip probabilities)."""
    return check_real(value, name, low=0.0, high=1.0, closed=closed)


def check_in_range(value: float, name: str, low: float, high: float) -> float:
    """A real in the closed interval ``[low, high]``."""
    return check_real(value, name, low=low, high=high, closed="both")


def check_choice(value: Any, name: str, choices: tuple | list) -> Any:
    if value not in choices:
        raise PrivacyParameterError(
            f"The '{name}' parameter must be one of {list(choices)}. Got {value!r} instead."
        )
    return value


def check_finite_vector(
    values: Any,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    clip: bool = False,
    min_size: int = 1,
) -> np.ndarray:
    """Return a 1-D float64 array, checking it is non-empty and finite.

    If ``low``/``high`` are given, values outside ``[low, high]`` are an error unless ``clip=True``
    (clipping is a data-independent, 1-Lipschitz map, so it never increases sensitivity).
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a 1-D array. Got an array of shape {arr.shape} instead."
        )
    return _check_array(arr, name, low=low, high=high, clip=clip, min_size=min_size)


def check_finite_matrix(
    values: Any,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    clip: bool = False,
) -> np.ndarray:
    """Return a 2-D float64 array (rows = prompts), checking it is non-empty and finite."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 2:
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a 2-D array. Got an array of shape {arr.shape} instead."
        )
    if arr.shape[1] == 0:
        raise PrivacyParameterError(
            f"The '{name}' parameter must have at least one column. Got shape {arr.shape} instead."
        )
    return _check_array(arr, name, low=low, high=high, clip=clip, min_size=1)


def _all_finite(arr: np.ndarray) -> bool:
    """True when every entry is finite, in one pass without a temporary: a finite sum has no NaN or ±inf
    term. A sum that overflows (finite entries) returns False, and the caller checks entry by entry."""
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(np.add.reduce(arr, axis=None)))


def _check_array(arr: np.ndarray, name: str, *, low, high, clip, min_size) -> np.ndarray:
    if arr.size < min_size:
        raise PrivacyParameterError(
            f"The '{name}' parameter must have at least {min_size} element(s). Got {arr.size} instead."
        )
    if _all_finite(arr):
        bad = None
    else:
        bad = ~np.isfinite(arr)
    if bad is not None and bad.any():
        idx = np.argwhere(bad)[0]
        where = int(idx[0]) if idx.size == 1 else tuple(int(i) for i in idx)
        raise PrivacyParameterError(
            f"The '{name}' parameter must contain only finite values. Got {float(arr[tuple(idx)])!r} at "
            f"index {where}."
        )
    if low is not None or high is not None:
        lo = -np.inf if low is None else low
        hi = np.inf if high is None else high
        if clip:
            return np.clip(arr, lo, hi)
        if arr.min() >= lo and arr.max() <= hi:  # two passes, no temporary (the common case)
            return arr
        out = (arr < lo) | (arr > hi)
        if out.any():
            # The values (and their positions) are not quoted: they may be private data, and error
            # messages end up in logs and HTTP responses.
            raise PrivacyParameterError(
                f"The '{name}' parameter must lie in the declared public range [{lo:g}, {hi:g}] "
                "(pass clip=True to clip). Got values outside that range (not quoted: they may be private)."
            )
    return arr


def parse_floats(text: str, name: str) -> list[float]:
    """A comma-separated list of numbers (``"0.5,1,2"``), as the CLI and config strings give it.

    Raises:
      PrivacyParameterError: not numbers, or none (the message names ``name``).
    """
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a comma-separated list of numbers. Got {text!r} instead."
        ) from None
    if not vals:
        raise PrivacyParameterError(
            f"The '{name}' parameter must list at least one number. Got {text!r} instead."
        )
    return vals
