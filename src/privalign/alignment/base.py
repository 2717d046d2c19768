"""Shared types of the inference-time selectors: :class:`Selection`, :class:`BatchSelection`,
:class:`SelectionLaw`, the :data:`FALLBACK` marker, and what a selector class declares about its method
(:class:`Param`, :class:`CandidateLayout`, :class:`MethodBase`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from privalign._validation import check_finite_matrix, check_finite_vector
from privalign.accounting.events import PrivacyEvent
from privalign.errors import PrivacyParameterError

__all__ = [
    "FALLBACK",
    "Selection",
    "BatchSelection",
    "SelectionLaw",
    "LazyEvents",
    "Param",
    "CandidateLayout",
    "MethodBase",
]

#: Index returned when a rejection-sampling selector accepted nothing: the caller must serve one more
#: *fresh* sample from the base policy (spec §2.2 step 7), not a candidate of the pool already drawn.
FALLBACK = -1


@dataclass(frozen=True)
class Selection:
    """One query's outcome.

    Attributes:
      index: The selected candidate (0-based, into the pool the selector chose from: pool B for the
        two-pool methods), or :data:`FALLBACK`.
      event: The privacy event realized by this selection (what a filter settles).
      worst_case_event: The data-independent worst case (what a filter reserves).
      diagnostics: Released diagnostics (e.g. ``lambda_tilde``, ``t``, ``M``); never private values of a
        private selector.
    """

    index: int
    event: PrivacyEvent
    worst_case_event: PrivacyEvent
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def is_fallback(self) -> bool:
        return self.index == FALLBACK

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": int(self.index),
            "fallback": self.is_fallback,
            "event": self.event.to_dict(),
            "worst_case_event": self.worst_case_event.to_dict(),
            "diagnostics": {
                k: (v.item() if isinstance(v, np.generic) else v) for k, v in self.diagnostics.items()
            },
        }


@dataclass(frozen=True)
class BatchSelection:
    """Outcomes of a vectorized batch: ``indices`` (``FALLBACK`` where nothing was accepted), one realized
    event per row, the common worst case, and diagnostic arrays (one entry per row)."""

    indices: np.ndarray
    events: Sequence[PrivacyEvent]
    worst_case_event: PrivacyEvent
    diagnostics: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, i: int) -> Selection:
        return Selection(
            int(self.indices[i]),
            self.events[i],
            self.worst_case_event,
            {k: v[i].item() if isinstance(v[i], np.generic) else v[i] for k, v in self.diagnostics.items()},
        )


class LazyEvents(Sequence):
    """A read-only sequence of per-row events built on first access (validated events are costly to
    construct by the ten thousand, and most batch callers only read a few)."""

    def __init__(self, factory, length: int) -> None:
        self._factory, self._len = factory, int(length)
        self._cache: dict[int, Any] = {}

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(i)
        ev = self._cache.get(i)
        if ev is None:
            ev = self._cache[i] = self._factory(i)
        return ev


@dataclass(frozen=True)
class SelectionLaw:
    """Exact law of a selection: ``probabilities[i]`` = P(select candidate i), ``fallback`` = P(fallback).

    ``error_bound`` bounds |computed − exact| for every entry (0 for closed forms; for PrivITP the
    quadrature error estimate, see :func:`privalign.alignment.laws.privitp_law`).
    """

    probabilities: np.ndarray
    fallback: float = 0.0
    error_bound: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "probabilities": [float(p) for p in self.probabilities],
            "fallback": float(self.fallback),
            "error_bound": float(self.error_bound),
        }


def _in_public_range(arr: np.ndarray, name: str, r_max: float | None, clip: bool) -> np.ndarray:
    """Clip into ``[0, r_max]`` or refuse out-of-range scores. The message never quotes a score or its
    position: scores are private, and error messages end up in logs and HTTP responses."""
    if r_max is None:
        return arr
    if clip:
        return np.clip(arr, 0.0, r_max)
    if np.any(arr < 0.0) or np.any(arr > r_max):
        raise PrivacyParameterError(
            f"The '{name}' parameter must lie in the declared public range [0, {r_max:g}] (pass clip=True to "
            "clip). Got value(s) outside it (not shown: scores are private)."
        )
    return arr


def _in_range_fast(
    scores, ndim: int, r_max: float | None, clip: bool, row_max: np.ndarray | None = None
) -> np.ndarray | None:
    """The array when it is float64-convertible, ``ndim``-D, non-empty and inside ``[0, r_max]`` (which
    implies finite: NaN fails both comparisons), read once from memory without a temporary; else None (the
    caller then runs the full checks, with their error messages). ``row_max`` (optional, one entry per
    row) receives each row's maximum, which the check computes anyway."""
    if r_max is None or clip:
        return None
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim != ndim or arr.size == 0:
        return None
    # min and max on the same ~1 MB block of rows: the second read comes from cache (one pass over memory)
    rows = arr.reshape(-1, arr.shape[-1])
    step = max(1, (1 << 17) // rows.shape[1])
    for i in range(0, rows.shape[0], step):
        blk = rows[i : i + step]
        if row_max is None:
            top = blk.max()
        else:
            top = np.max(blk, axis=1, out=row_max[i : i + step]).max()
        if not (blk.min() >= 0.0 and top <= r_max):
            return None
    return arr


def scores_matrix_row_max(
    scores, name: str, *, r_max: float, clip: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`scores_matrix` plus each row's maximum when the one-pass check succeeds (else None: the full
    checks ran)."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim == 2 and arr.size:
        top = np.empty(arr.shape[0])
        fast = _in_range_fast(arr, 2, r_max, clip, row_max=top)
        if fast is not None:
            return fast, top
    return scores_matrix(scores, name, r_max=r_max, clip=clip), None


def scores_vector(scores, name: str, *, r_max: float | None, clip: bool) -> np.ndarray:
    """Validate one query's scores (finite, non-empty; in ``[0, r_max]`` unless ``clip``)."""
    fast = _in_range_fast(scores, 1, r_max, clip)
    return (
        fast if fast is not None else _in_public_range(check_finite_vector(scores, name), name, r_max, clip)
    )


def scores_matrix(scores, name: str, *, r_max: float | None, clip: bool) -> np.ndarray:
    fast = _in_range_fast(scores, 2, r_max, clip)
    return (
        fast if fast is not None else _in_public_range(check_finite_matrix(scores, name), name, r_max, clip)
    )


def require_pool_b(pool_b, method: str):
    if pool_b is None:
        raise PrivacyParameterError(
            f"The 'pool_b_scores' parameter is required by {method}: phase 2 must run on a fresh pool of "
            "candidates independent of pool A (see docs/privacy/privitp.md). Got None instead."
        )
    return pool_b


@dataclass(frozen=True)
class Param:
    """One parameter a selection method takes (what every front end reads: CLI flags, TOML keys, the
    service's ``privacy`` object).

    Attributes:
      name: The parameter's name (``epsilon``, ``beta``, ...), as the selector's constructor spells it.
      help: One line for ``--help`` and the service's error messages.
      required: The method cannot run without it (no default).
      default: Used when the front end leaves it out (``None``: the selector's own default).
      bounds: Public bounds a server enforces before any reservation (``None``: only the selector's check).
      default_from: Left out, it takes this other parameter's value (PrivITP's σ_Z defaults to σ_X).
      excludes: Parameters that cannot be given with this one (PrivBoN's ``sigma`` excludes ``epsilon``).
    """

    name: str
    help: str
    required: bool = False
    default: float | None = None
    bounds: tuple[float, float] | None = None
    default_from: str | None = None
    excludes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CandidateLayout:
    """How one query's candidates are laid out in a flat list: ``pools`` pools of ``n`` (phase 1, then
    phase 2), then one fresh fallback candidate when ``fallback``."""

    pools: int = 1
    fallback: bool = False

    def needed(self, n: int) -> int:
        """Candidates one query with pools of ``n`` consumes (``n``, or ``2n + 1`` for ITP/PrivITP)."""
        return self.pools * int(n) + int(self.fallback)

    def n_for(self, k: int) -> int | None:
        """The pool size ``n ≥ 1`` that ``k`` candidates make, or ``None`` when no ``n`` does."""
        n, rest = divmod(int(k) - int(self.fallback), self.pools)
        return n if n >= 1 and rest == 0 else None

    def describe_count(self) -> str:
        """The count as a formula: ``n``, ``2n + 1``."""
        return ("n" if self.pools == 1 else f"{self.pools}n") + (" + 1" if self.fallback else "")

    def describe(self) -> str:
        parts = ["n"] if self.pools == 1 else [f"{self.pools}n"]
        if self.fallback:
            parts.append("1")
        what = " + ".join(parts)
        if self.pools == 1 and not self.fallback:
            return "n candidates"
        return (
            f"{what} candidates ("
            + ", ".join(
                [f"phase-{i + 1} pool" for i in range(self.pools)] + (["fallback"] if self.fallback else [])
            )
            + ")"
        )


class MethodBase:
    """What a selector class declares about its method, with the defaults most methods share.

    A selector class sets ``name`` (the method name every front end uses), ``label`` (the display name),
    ``private``, ``layout`` and ``params``, and implements ``from_params``; it may override
    :meth:`for_budget` (a method whose noise is calibrated to a requested ε, like PrivBoN) and
    :meth:`describe`. Registering the class (:func:`privalign.alignment.selectors.register`) makes the
    method usable by ``make_selector``, the CLI (``select``, ``simulate``), the sessions and the service.
    """

    name: ClassVar[str]
    label: ClassVar[str] = ""
    private: ClassVar[bool] = False
    layout: ClassVar[CandidateLayout] = CandidateLayout()
    params: ClassVar[tuple[Param, ...]] = ()
    #: the noise is calibrated to a requested ε (PrivBoN): a server runs :meth:`for_budget` and charges
    #: exactly the request's ε; otherwise the parameters fix the noise and the worst case is checked
    #: against the request's cap
    spends_budget: ClassVar[bool] = False
    #: a server may offer it (ITP: no, the service's one non-private method is BoN)
    served: ClassVar[bool] = True
    #: the kind of its privacy events: ``"none"``, ``"pure"`` (a pure-ε event per query: PrivBoN) or
    #: ``"ex-post"`` (an ex-post event: PrivITP); sessions pick their filter by it
    accounting: ClassVar[str] = "none"
    #: the noise parameters :meth:`calibrate` fills in (empty: not calibrated to an ε)
    calibrated_params: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def calibrate(
        cls, epsilon: float, n: int, params: Mapping[str, Any], *, r_max: float, sensitivity: float
    ) -> dict[str, Any]:
        """The :attr:`calibrated_params` whose worst-case ε at pools of ``n`` is ``epsilon`` (at most, and
        close to it), given the other parameters."""
        raise NotImplementedError(f"{cls.name} has no noise to calibrate")

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], *, r_max: float = 1.0, sensitivity: float | None = None, clip=False
    ) -> Any:
        """Build the selector from its method parameters (validated by the constructor) and the public
        score range ``[0, r_max]``, Δ_r and the clipping switch."""
        raise NotImplementedError

    @classmethod
    def for_budget(
        cls,
        cap: Fraction,
        n: int,
        params: Mapping[str, Any],
        *,
        r_max: float = 1.0,
        sensitivity: float | None = None,
        clip: bool = False,
    ) -> Any:
        """The selector a server runs for a request that may spend at most ``cap`` (exact, in ε): by
        default the one its parameters give (the caller checks its worst case against ``cap``)."""
        return cls.from_params(params, r_max=r_max, sensitivity=sensitivity, clip=clip)

    @classmethod
    def candidates_needed(cls, n: int) -> int:
        """Candidates one query with pools of ``n`` consumes (see :class:`CandidateLayout`)."""
        return cls.layout.needed(n)

    @classmethod
    def describe(cls, params: Mapping[str, Any]) -> str:
        """A curve's display label (``ITP β=0.05``)."""
        shown = " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
        return f"{cls.label or cls.name} {shown}".strip()

    def worst_case_epsilon(self, n: int) -> float:
        """The ε of :meth:`worst_case_event` (``inf`` when not private)."""
        ev = self.worst_case_event(n)  # type: ignore[attr-defined]
        for attr in ("epsilon_max", "epsilon"):
            v = getattr(ev, attr, None)
            if v is not None:
                return float(v)
        return math.inf

    def pick(self, candidates: Any, *, rng: Any) -> Selection:
        """Select from a flat candidate list laid out by :attr:`layout` (one pool here); the index is
        into that list."""
        return self.select(candidates, rng=rng)  # type: ignore[attr-defined]


def pick_from_pools(selector: Any, candidates: Any, *, rng: Any) -> Selection:
    """The two-pool layout ``[pool A (n), pool B (n), fallback (1)]``: run ``selector`` on the pools and
    map its index (into pool B, or :data:`FALLBACK`) to the flat list (``n + i``, or ``2n``)."""
    flat = np.asarray(candidates, dtype=np.float64)
    n = CandidateLayout(2, True).n_for(flat.size)
    if n is None:
        raise PrivacyParameterError(
            f"The 'candidates' parameter must hold 2n + 1 scores (phase-1 pool, phase-2 pool, fallback) "
            f"for {selector.name}. Got {flat.size}."
        )
    out = selector.select(flat[:n], rng=rng, pool_b_scores=flat[n : 2 * n])
    return dataclasses.replace(out, index=2 * n if out.index == FALLBACK else n + int(out.index))
