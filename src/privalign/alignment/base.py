"""Shared types of the inference-time selectors: :class:`Selection`, :class:`BatchSelection`,
:class:`SelectionLaw` and the :data:`FALLBACK` marker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privalign._validation import check_finite_matrix, check_finite_vector
from privalign.accounting.events import PrivacyEvent
from privalign.errors import PrivacyParameterError

__all__ = ["FALLBACK", "Selection", "BatchSelection", "SelectionLaw", "LazyEvents"]

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
