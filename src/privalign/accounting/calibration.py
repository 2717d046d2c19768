"""One calibration routine: bisection on a monotone feasibility predicate, ending on the safe side.

Every privacy calibration in the package asks the same question: given a parameter ``x`` (a noise scale,
a per-step ε, a zCDP ρ) and a monotone test ``ok(x)`` ("the accounted cost at ``x`` fits the budget"),
find the threshold where ``ok`` switches. Calibration must err on the safe side: a value a little too
noisy (or a budget a little too small) costs utility, one a little past the threshold breaks the
guarantee. :func:`bisect_monotone` therefore only ever returns a point at which ``ok`` was *evaluated and
held*; the bracket end on the other side, where ``ok`` failed, is never returned, whatever the tolerance,
the iteration cap or ties in the predicate.

The predicate is a plain ``Callable[[float], bool]`` so that a test with several parts (Peeling checks ε
and δ) needs no scalarisation. ``ok`` need not be continuous: step functions (costs rounded to a grid,
piecewise bounds) are handled, and the result is then the feasible end of the final bracket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from privalign.errors import PrivacyParameterError

__all__ = ["CalibrationLimitError", "bisect_monotone"]


class CalibrationLimitError(PrivacyParameterError):
    """The bracket search passed its limit without finding a feasible (or infeasible) point."""


def _bracket(
    ok: Callable[[float], bool], lo: float, hi: float, *, above: bool, grow: float, limit: float
) -> tuple[float, float]:
    """Move the bracket until ``ok`` holds at its feasible end and fails at the other; return it.

    Both ends returned have been evaluated. When ``feasible="above"`` and ``ok(0)`` holds, ``(0, 0)`` is
    returned: 0 is feasible and nothing lies below it.
    """
    if above:  # ok holds for large x
        lo_tested = False
        while not ok(hi):
            lo, hi, lo_tested = hi, hi * grow, True
            if hi > limit:
                raise CalibrationLimitError(f"no feasible point up to {limit!r}")
        while not lo_tested and ok(lo):  # the starting lo may already be feasible: move down
            if lo == 0.0:
                return 0.0, 0.0
            hi, lo = lo, lo / grow
        return lo, hi
    lo_tested = False  # ok holds for small x
    while ok(hi):
        lo, hi, lo_tested = hi, hi * grow, True
        if hi > limit:
            raise CalibrationLimitError(f"the feasible region extends past {limit!r}")
    if not lo_tested and not ok(lo):
        raise CalibrationLimitError(f"no feasible point in [{lo!r}, {hi!r}]")
    return lo, hi


def bisect_monotone(
    ok: Callable[[float], bool],
    lo: float,
    hi: float,
    *,
    feasible: Literal["above", "below"],
    rtol: float = 0.0,
    grow: float = 2.0,
    limit: float = math.inf,
    max_iter: int = 200,
) -> float:
    """The threshold of a monotone predicate, to relative tolerance, always on the feasible side.

    ``feasible="above"``: ``ok`` is False below some x* and True above it (a noise scale: more noise
    always fits); the result is the *smallest* feasible point found, ≥ x*. ``feasible="below"``: ``ok`` is
    True below x* and False above (a budget: spending less always fits); the result is the *largest*
    feasible point found, ≤ x*.

    Conservative by construction: the returned value ``x`` is always a point where ``ok(x)`` was called
    and returned True. It is the feasible end of the final bracket, never the midpoint or the infeasible
    end, so a privacy calibration built on it meets its budget even when the tolerance is loose, the
    iteration cap is hit, or ``ok`` is a step function. If the feasible end of the starting bracket was
    never tested, it is tested before being returned.

    Bracket search: with ``feasible="above"``, ``hi`` is multiplied by ``grow`` until ``ok(hi)``;
    then, if ``lo`` is still untested, ``lo`` is divided by ``grow`` while ``ok(lo)`` (stopping at
    ``lo == 0``, which is then returned if feasible). With ``feasible="below"``, ``hi`` is multiplied by
    ``grow`` while ``ok(hi)`` (the feasible end moves up with it), and ``lo`` must be feasible.

    Args:
      ok: the feasibility test; must be monotone in the stated direction on ``[0, limit]``.
      lo: lower end of the starting bracket, ≥ 0.
      hi: upper end of the starting bracket, > ``lo``.
      feasible: on which side of the threshold ``ok`` holds.
      rtol: stop once ``hi − lo ≤ rtol·hi``; 0 bisects to adjacent floats.
      grow: factor > 1 for the bracket search.
      limit: the bracket search gives up (``CalibrationLimitError``) once ``hi`` passes it.
      max_iter: at most this many bisection steps (the result stays feasible when the cap is hit).

    Returns:
      A float x with ``ok(x)`` True and, unless ``max_iter`` ran out, an infeasible point within
      ``rtol·x`` (or one float step) on the other side.

    Raises:
      CalibrationLimitError: the bracket search passed ``limit``, or no point of the bracket is feasible.
      PrivacyParameterError: a bad bracket or option (message names it).

    Example:
      >>> x = bisect_monotone(lambda s: 1.0 / s <= 0.25, 1.0, 2.0, feasible="above", rtol=1e-12)
      >>> x >= 4.0 and x - 4.0 <= 1e-11
      True
    """
    if feasible not in ("above", "below"):
        raise PrivacyParameterError(f"The 'feasible' parameter must be 'above' or 'below'. Got {feasible!r}.")
    if not (0.0 <= lo < hi) or math.isnan(hi):
        raise PrivacyParameterError(f"The bracket must satisfy 0 <= lo < hi. Got lo={lo!r}, hi={hi!r}.")
    if not grow > 1.0 or not rtol >= 0.0 or max_iter < 0:
        raise PrivacyParameterError(
            f"Need grow > 1, rtol >= 0 and max_iter >= 0. "
            f"Got grow={grow!r}, rtol={rtol!r}, max_iter={max_iter!r}."
        )
    above = feasible == "above"
    lo, hi = _bracket(ok, lo, hi, above=above, grow=grow, limit=limit)
    for _ in range(max_iter):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi) or hi - lo <= rtol * hi:
            break
        if ok(mid) == above:  # mid is on the feasible side: it becomes that end of the bracket
            hi = mid
        else:
            lo = mid
    return hi if above else lo
