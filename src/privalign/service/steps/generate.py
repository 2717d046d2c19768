"""Step 2: candidates from the public prompt only; any failure cancels the reservation."""

from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout

from privalign.service import plan as planning
from privalign.service.components import Generation, UpstreamError
from privalign.service.errors import ApiError
from privalign.service.job import Job, Reserved
from privalign.service.state import ServiceState
from privalign.service.steps.reserve import cancel

__all__ = ["generate"]

log = logging.getLogger("privalign.service")


def generate(state: ServiceState, job: Job, r: Reserved, deadline: float) -> Generation:
    """Step 2: public inputs only. Any failure cancels the reservation (nothing charged). The candidates
    come with the generator's token counts and finish reasons (:class:`Generation`); the client's own
    candidates (``/v1/select``) have none."""
    if job.candidates is not None:
        return Generation.of(job.candidates)
    need = planning.pool_size(job.plan)
    try:
        fut = state.pool.submit(state.generator, job.prompt, need, **job.gen_kwargs)
        gen = Generation.of(fut.result(timeout=max(0.0, deadline - time.monotonic())))
        for c in gen.texts:
            c.encode("utf-8")  # an unencodable candidate is a generator failure, found before scoring
            if len(c) > state.cfg.limits.max_text_chars:  # bounds the scorer's work, as for brought ones
                raise UpstreamError("a candidate is longer than limits.max_text_chars")
        if len(gen.candidates) != need:
            raise UpstreamError(f"generator returned {len(gen.candidates)} candidates, expected {need}")
    except Exception as exc:  # noqa: BLE001 - UpstreamError, FutureTimeout, anything the generator raises
        cancel(state, r)
        if isinstance(exc, FutureTimeout):
            raise ApiError(
                504,
                "upstream_timeout",
                "The generator timed out; the reservation was released (no private score was computed).",
            ) from None
        log.warning("generator failed: %s", type(exc).__name__)
        raise ApiError(
            502,
            "upstream_error",
            "The generator failed; the reservation was released (no private score was computed).",
        ) from None
    return gen
