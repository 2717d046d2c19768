"""Step 3: the private reward model; from here on the reservation is never released."""

from __future__ import annotations

import logging
import time

import numpy as np

from privalign.service.errors import ApiError
from privalign.service.job import Job
from privalign.service.state import ServiceState

__all__ = ["score"]

log = logging.getLogger("privalign.service")


def score(state: ServiceState, job: Job, candidates: list[str], deadline: float) -> np.ndarray:
    """Step 3: the private reward model, inline in this request's worker thread (it cannot be
    pre-empted: a scorer that overruns the deadline finishes, its selection is withheld (504) and the
    reservation stays charged). Clipped to ``[0, R_max]``."""
    state.metrics.scorer_calls.inc()
    try:
        raw = np.asarray(state.scorer(job.score_prompt, candidates), dtype=np.float64).reshape(-1)
        if raw.shape[0] != len(candidates) or not np.all(np.isfinite(raw)):
            raise ValueError("reward model returned a malformed score vector")
    except Exception as exc:  # noqa: BLE001
        log.error("reward model failed: %s", type(exc).__name__)
        raise ApiError(
            500,
            "internal_error",
            "The reward model failed; the reservation stays charged at its reserved cost. "
            "Do not retry: a retry is charged again.",
            charged=True,
        ) from None
    if time.monotonic() > deadline:
        raise ApiError(
            504,
            "timeout",
            "Scoring timed out; the reservation stays charged at its reserved cost. Do not retry: a "
            "retry is charged again.",
            charged=True,
        )
    return np.clip(raw, 0.0, state.cfg.privacy.reward_max)
