"""Best-of-N (non-private baseline, spec-inference-time §2.1)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from privalign.accounting.events import NonPrivateEvent
from privalign.alignment.base import (
    BatchSelection,
    MethodBase,
    Selection,
    SelectionLaw,
    scores_matrix,
    scores_vector,
)
from privalign.alignment.laws import bon_law

__all__ = ["BestOfN"]


class BestOfN(MethodBase):
    """Return the candidate with the largest proxy reward (first one on ties).

    Privacy:
      None: the selection is a deterministic function of the private scores. Event: ``NonPrivateEvent``
      (every accountant reports ε = ∞).

    References:
      Huang et al. 2025, arXiv 2503.21878 (BoN is not scaling-monotonic).
    """

    name = "bon"
    label = "BoN"

    @classmethod
    def from_params(cls, params, *, r_max=1.0, sensitivity=None, clip=False) -> BestOfN:
        return cls()

    @classmethod
    def describe(cls, params) -> str:
        return cls.label

    def worst_case_event(self, n: int | None = None) -> NonPrivateEvent:
        return NonPrivateEvent()

    def select(self, scores: ArrayLike, *, rng=None, pool_b_scores=None) -> Selection:
        """Select ``argmax(scores)``; ``rng`` and ``pool_b_scores`` are ignored (one pool).

        Raises:
          PrivacyParameterError: empty or non-finite ``scores``.
        """
        r = scores_vector(scores, "scores", r_max=None, clip=False)
        i = int(np.argmax(r))
        return Selection(i, NonPrivateEvent(), NonPrivateEvent(), {"n": r.size})

    def select_batch(self, scores: ArrayLike, *, rng=None, pool_b_scores=None) -> BatchSelection:
        r = scores_matrix(scores, "scores", r_max=None, clip=False)
        ev = NonPrivateEvent()
        return BatchSelection(np.argmax(r, axis=1), [ev] * r.shape[0], ev, {})

    def law(self, scores: ArrayLike, *, pool_b_scores=None) -> SelectionLaw:
        r = scores_vector(scores, "scores", r_max=None, clip=False)
        return SelectionLaw(bon_law(r))
