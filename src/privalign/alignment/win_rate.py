"""The exact win probability of best-of-N against one sample of the base policy (no Monte Carlo).

Used by the win-rate experiment and by the RLHF evaluation (:mod:`privalign.rlhf.evaluate`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["bon_win_probability"]


def bon_win_probability(selector: np.ndarray, judge: np.ndarray) -> np.ndarray:
    """Exact per-prompt win probability of best-of-N against one uniformly random base candidate.

    Best-of-N picks a candidate with the largest ``selector`` score (uniformly among tied maxima); the base
    policy's single sample is a uniformly random candidate of the same prompt (the pool holds i.i.d. samples
    of the base policy); a win counts 1, a judge tie ½ (so a selector that ignores the text scores exactly ½).

    Args:
      selector: ``(P, N)`` scores used to pick.
      judge: ``(P, N)`` judge scores.

    Returns:
      ``(P,)`` win probabilities in [0, 1].
    """
    selector = np.asarray(selector, float)
    judge = np.asarray(judge, float)
    top = selector >= selector.max(axis=1, keepdims=True) - 1e-12 * np.maximum(
        1.0, np.abs(selector).max(axis=1, keepdims=True)
    )
    gt = (judge[:, :, None] > judge[:, None, :]).mean(axis=2)
    eq = (judge[:, :, None] == judge[:, None, :]).mean(axis=2)
    w = gt + 0.5 * eq  # (P, N): win probability of candidate k against a random base candidate
    return (w * top).sum(axis=1) / top.sum(axis=1)
