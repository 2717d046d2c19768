"""One way to turn a method name into a selector: the :class:`Selector` protocol, :func:`make_selector`,
:func:`check_method` (the one check of a method name) and :func:`pool_size` (the "n, or 2n + 1 for the
two-pool methods" rule).

The CLI (``select``, ``session``), the sessions, the experiments, the simulation engine's
:class:`~privalign.alignment.simulation.MethodSpec` and the service all build or validate their selectors
here, so which methods exist, a method's parameters, their validation, defaults and ε → scale conversion, and
its candidate count are written once.

Privacy:
  This module only constructs selectors; each selector's docstring states its guarantee, privacy unit and
  neighbouring relation (PrivBoN: ε-DP per query; PrivITP: ex-post (ε, δ); BoN/ITP: none).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

from numpy.typing import ArrayLike

from privalign._validation import check_choice, check_int, check_real
from privalign.accounting.events import PrivacyEvent
from privalign.alignment.base import BatchSelection, Selection, SelectionLaw
from privalign.errors import PrivacyParameterError

__all__ = [
    "METHODS",
    "TWO_POOL_METHODS",
    "Selector",
    "check_method",
    "make_selector",
    "pool_size",
    "uses_two_pools",
]

#: The selection methods, non-private first.
METHODS = ("bon", "itp", "privbon", "privitp")
#: Methods that draw a phase-1 pool A, a fresh phase-2 pool B and one fallback candidate.
TWO_POOL_METHODS = frozenset({"itp", "privitp"})


@runtime_checkable
class Selector(Protocol):
    """What every inference-time selector provides (BoN, ITP, PrivBoN, PrivITP).

    ``worst_case_event(n)`` is data-independent (what a filter reserves before any score is read);
    ``select``/``select_batch`` return the realized event with the choice; ``law`` is the exact law.
    """

    name: str

    def worst_case_event(self, n: int) -> PrivacyEvent: ...

    def select(self, scores: ArrayLike, *, rng: Any, pool_b_scores: ArrayLike | None = None) -> Selection: ...

    def select_batch(
        self, scores: ArrayLike, *, rng: Any, pool_b_scores: ArrayLike | None = None
    ) -> BatchSelection: ...

    def law(self, scores: ArrayLike, *, pool_b_scores: ArrayLike | None = None) -> SelectionLaw: ...


def check_method(method: Any, name: str = "method") -> str:
    """The one check of a method name: returns ``method`` if it is in :data:`METHODS`.

    Args:
      method: The name to check.
      name: Where the caller's user wrote it (``method``, ``kind``, ``privacy.allowed_methods``): the
        parameter the message names. The rest of the message is the same everywhere.

    Raises:
      PrivacyParameterError: ``The '<name>' parameter must be one of ['bon', 'itp', 'privbon', 'privitp'].
        Got <method> instead.``
    """
    return check_choice(method, name, METHODS)


def uses_two_pools(method: str) -> bool:
    """Whether ``method`` (a name in :data:`METHODS`) needs two pools plus a fallback candidate."""
    return check_method(method) in TWO_POOL_METHODS


def pool_size(method: str, n: int, *, fallback_candidate: bool = True) -> int:
    """Candidates one query of ``method`` consumes: ``n``, or ``2n + 1`` for the two-pool methods (phase-1
    pool A, phase-2 pool B, one fresh fallback candidate).

    ``fallback_candidate=False`` leaves out the fallback candidate (``2n`` for the two-pool methods): the
    simulation engine credits the fallback with the prompt's base-policy mean instead of drawing one
    (defect K14), so a prompt needs only the two pools.
    """
    n = check_int(n, "n", low=1)
    if not uses_two_pools(method):
        return n
    return 2 * n + 1 if fallback_candidate else 2 * n


def _required(method: str, name: str, value: Any) -> Any:
    if value is None:
        raise PrivacyParameterError(
            f"The '{name}' parameter is required for method {method!r}. Got None instead."
        )
    return value


def make_selector(
    method: str,
    *,
    epsilon: float | None = None,
    beta: float | None = None,
    sigma_x: float | None = None,
    sigma_z: float | None = None,
    r_max: float = 1.0,
    L: float = 3.0,
    delta: float = 1e-6,
    sensitivity: float | None = None,
    clip: bool = False,
    sigma_reg: float | None = None,
    sigma: float | None = None,
) -> Selector:
    """Build the selector for ``method`` (one of :data:`METHODS`).

    Args:
      method: ``bon``, ``itp``, ``privbon`` or ``privitp``.
      epsilon: PrivBoN's ε (required for ``privbon`` unless ``sigma`` is given; ``inf`` gives plain BoN's
        law and a ``NonPrivateEvent``: not private, and the CLI and the service never reach it this way).
        The Gumbel scale is :func:`~privalign.alignment.priv_bon.privbon_scale` of it (2Δ/ε rounded up: the
        one ε → scale conversion).
      sigma: PrivBoN's Gumbel scale σ given directly instead of ``epsilon`` (``0`` = plain BoN); the charged
        ε is then ``2Δ/σ`` rounded up. Give exactly one of ``epsilon`` and ``sigma``, and not with
        ``sigma_reg``.
      beta: ITP/PrivITP's KL temperature (required for ``itp``/``privitp``).
      sigma_x, sigma_z: PrivITP's Gaussian noise scales (``sigma_z`` defaults to ``sigma_x``).
      r_max, L, delta, sensitivity, clip, sigma_reg: passed to the selector (see its docstring); a
        parameter that a method does not take is ignored.

    Raises:
      PrivacyParameterError: unknown method, or a required parameter is missing (named), or a value is out
        of range (the selector's own check).
    """
    from privalign.alignment.bon import BestOfN
    from privalign.alignment.itp import InferenceTimePessimism
    from privalign.alignment.priv_bon import PrivBoN
    from privalign.alignment.priv_itp import PrivITP

    method = check_method(method)
    if method == "bon":
        return BestOfN()
    if method == "itp":
        return InferenceTimePessimism(_required(method, "beta", beta), r_max=r_max, clip=clip)
    if method == "privbon":
        if sigma is not None:  # σ given: ε = ∞ and σ_reg = σ make the scale exactly σ
            if epsilon is not None or sigma_reg is not None:
                raise PrivacyParameterError(
                    "PrivBoN needs exactly one of 'epsilon' or 'sigma' (and 'sigma' excludes 'sigma_reg'). "
                    f"Got epsilon={epsilon!r}, sigma={sigma!r}, sigma_reg={sigma_reg!r}."
                )
            return PrivBoN(
                math.inf,
                sensitivity=sensitivity,
                r_max=r_max,
                clip=clip,
                sigma_reg=check_real(sigma, "sigma", low=0.0, closed="left"),
            )
        return PrivBoN(
            _required(method, "epsilon", epsilon),
            sensitivity=sensitivity,
            r_max=r_max,
            clip=clip,
            sigma_reg=sigma_reg,
        )
    sx = _required(method, "sigma_x", sigma_x)
    return PrivITP(
        _required(method, "beta", beta),
        sigma_x=sx,
        sigma_z=sx if sigma_z is None else sigma_z,
        r_max=r_max,
        L=L,
        delta=delta,
        sensitivity=sensitivity,
        clip=clip,
    )
