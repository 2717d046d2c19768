"""Label privacy for the estimators: randomized response on 0/1 labels and the debiased labels.

Shared by :class:`privalign.estimation.iht.RRIHT` and :class:`privalign.estimation.baselines.DenseRR` (a
small module below both, so neither imports the other).

Privacy:
  Unit: one label. Relation: ``replace_one``. Guarantee: ε-label-DP (randomized response,
  :class:`privalign.mechanisms.RandomizedResponse`); the debiasing is post-processing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privalign.accounting.events import PrivacyEvent
from privalign.errors import PrivacyParameterError

__all__ = ["privatize_labels", "debiased_labels"]


def privatize_labels(y: np.ndarray, epsilon: float, rng: Any) -> tuple[np.ndarray, float, PrivacyEvent]:
    """Randomized response on 0/1 labels (``privalign.mechanisms.RandomizedResponse``, unit ``"label"``).

    Returns:
      ``(y_tilde, flip_probability, event)`` with ``y_tilde`` float64 in {0, 1}.
    """
    from privalign.mechanisms.randomized_response import RandomizedResponse

    rr = RandomizedResponse(epsilon, unit="label", relation="replace_one")
    return rr(y, rng=rng).astype(np.float64), float(rr.flip_probability), rr.event


def debiased_labels(y_tilde: np.ndarray, flip_probability: float) -> np.ndarray:
    """Form (3) of spec §6: ``ŷ = (ỹ − ρ)/(1 − 2ρ)``, so ``E[ŷ | y] = y``."""
    rho = float(flip_probability)
    if not 0.0 <= rho < 0.5:
        raise PrivacyParameterError(
            f"The 'flip_probability' parameter must be in [0, 0.5). Got {rho!r} instead."
        )
    return (np.asarray(y_tilde, dtype=np.float64) - rho) / (1.0 - 2.0 * rho)
