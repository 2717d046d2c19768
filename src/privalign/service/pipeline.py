"""The straight path of every selecting request, one function per step:

    reserve → generate → score → select → charge → respond (encode) → settle

:func:`run` calls the steps in this order; each step is a function in its own module of
:mod:`privalign.service.steps`, applied to the previous step's output.
The order is the privacy argument:

1. :func:`reserve`: the worst-case cost of the plan (:func:`privalign.service.plan.make_plan`, already
   range-checked) is reserved in the key's ledger row by one store operation that returns a
   :class:`~privalign.service.store.Receipt` with the key's totals → 429 naming the remaining budget,
   *before* any score is computed.
2. :func:`generate`: candidates from the public prompt only. Failure → the reservation is **cancelled**
   (the private reward model was not touched) → 502/504, nothing charged.
3. :func:`score`: the private reward model, scores clipped to ``[0, R_max]``. From here on the
   reservation is never released; a failure is answered 500/504 with ``x-should-retry: false``.
4. :func:`select`: the private selection with :class:`privalign.rng.SecureNoise`.
5. :func:`charge`: :meth:`privalign.accounting.filters.PrivacyFilter.charge` (pure: realized ≤ reserved,
   the filter's cost) in exact ledger units.
6. :func:`respond`: the answer is rendered and **encoded to bytes** before the charge is finalised, so a
   request is either answered or refused/cancelled, never charged without an answer (every text was
   checked encodable at validation; an encoding failure would be a bug, answered 500, charged, no retry).
   Then :func:`durable`: the answer is held until its reservation is on disk. With group commit
   (``[database] group_commit``, the default with ``sync = "full"``) the reserve commits without waiting
   for the disk; its flush, shared with every reservation committed before it began, runs in the
   background during generation (steps 2–6) when the request generates, or at the gate in the request's
   thread when the client brought the candidates; nothing that follows scoring (answer or error) is
   released before it completes.
7. settle: written after the answer is sent (a background task; until then the reservation counts at its
   reserved cost, which is ≥ the charge), or before it for ``Idempotency-Key`` requests, whose answer is
   stored with the settle. A settle that fails leaves the reserved cost charged (reconciliation).

A process crash leaves the reservation open; :meth:`SQLBudgetStore.reconcile_stale` charges it at its
reserved cost.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable

import numpy as np

from privalign.service import db
from privalign.service.errors import ApiError
from privalign.service.job import FILTERS, Job, Outcome, Reserved, encode, remaining_dict
from privalign.service.keys import KeyInfo
from privalign.service.state import ServiceState
from privalign.service.steps import charge, durable, generate, reserve, respond, score, select

__all__ = ["ServiceState", "Job", "Outcome", "Reserved", "FILTERS", "run", "encode", "remaining_dict"]

log = logging.getLogger("privalign.service")


def run(
    state: ServiceState,
    key: KeyInfo,
    job: Job,
    *,
    reauth: Callable[[], KeyInfo] | None = None,
    reservation_id: str | None = None,
) -> Outcome:
    """The straight path: reserve → generate → score → select → charge → respond. The settle is left
    to the caller (``Outcome.settle``): written after the answer is sent, or before it is stored.
    ``reservation_id``: the id to reserve under (an ``Idempotency-Key`` attempt records it first).

    The key's fairness limits (:mod:`privalign.service.fairness`) are checked before the reservation:
    a refusal is a 429 with ``Retry-After``, never charged."""
    deadline = time.monotonic() + state.cfg.limits.request_timeout_s
    _preconditions(state, job, reauth)
    if not state.private:
        return _run(state, key, job, reauth, deadline, reservation_id)
    try:
        state.limiter.acquire(key.key_id, job)
    except ApiError as exc:
        if reauth is not None:
            reauth()  # a revoked key hears 401, as without the key cache
        state.metrics.overload.labels(str(exc.extra.get("code"))).inc()
        raise
    try:
        return _run(state, key, job, reauth, deadline, reservation_id)
    finally:
        state.limiter.release(key.key_id)


def _preconditions(state: ServiceState, job: Job, reauth: Callable[[], KeyInfo] | None) -> None:
    """503 (never charged) when a component is missing or the generator is still loading."""
    if state.scorer is None or (job.candidates is None and state.generator is None):
        if reauth is not None:
            reauth()  # a 401 comes before a 503, as without the key cache
        if state.scorer is None:
            raise ApiError(503, "service_unavailable", "No reward model is configured on this server.")
        raise ApiError(
            503, "service_unavailable", "No generator is configured on this server; use POST /v1/select."
        )
    if job.candidates is None and state.loading:
        if reauth is not None:
            reauth()
        raise ApiError(
            503,
            "service_unavailable",
            "The generator is still loading (see GET /readyz); nothing was charged. Retry in a few seconds.",
            headers={"Retry-After": "5"},
        )


def _run(
    state: ServiceState,
    key: KeyInfo,
    job: Job,
    reauth: Callable[[], KeyInfo] | None,
    deadline: float,
    reservation_id: str | None,
) -> Outcome:
    # With group commit the reservation's flush overlaps generation (I/O-bound: the flusher's thread gets
    # the GIL at once); with client-given candidates it runs at the gate, in this thread (scoring is
    # CPU-bound and would delay the flusher's thread by up to the GIL switch interval).
    r = reserve(
        state,
        key,
        job.plan,
        reauth,
        job.endpoint,
        overlap=job.candidates is None,
        reservation_id=reservation_id,
    )
    gen = generate(state, job, r, deadline)
    t_private = time.monotonic()
    try:
        scores = score(state, job, gen.texts, deadline)
    except ApiError:
        durable(
            state, r, deadline
        )  # an error after scoring began leaves only once the reservation is on disk
        raise
    try:
        if state.private:
            idx, realized = select(job.plan, scores, state.noise)
        else:  # benchmark baseline: privacy layer disabled, exact argmax
            idx, realized = int(np.argmax(scores)), job.plan.worst
        pad = state.cfg.privacy.pad_selection_s - (time.monotonic() - t_private)
        if pad > 0:  # hide how long the private part took (up to pad_selection_s); see LIMITATIONS.md
            time.sleep(pad)
        units = charge(r, realized) if r.receipt is not None else None
        out = respond(job, r, idx, gen, realized, units)
    except ApiError:
        durable(state, r, deadline)
        raise
    except Exception as exc:  # noqa: BLE001 - a bug after scoring: charged, never retried
        # The log names the exception and where it was raised, never its message: a message raised after
        # scoring may quote a score or a value computed from the scores (docs/privacy/release.md).
        log.error(
            "selection or encoding failed: %s; traceback (message withheld):\n%s",
            type(exc).__name__,
            "".join(traceback.format_tb(exc.__traceback__)).rstrip(),
        )
        durable(state, r, deadline)
        raise ApiError(
            500,
            "internal_error",
            "Internal error after private scoring; the reservation stays charged at its "
            "reserved cost. Do not retry: a retry is charged again.",
            charged=True,
        ) from None
    # The gate: the encoded answer leaves this function only once its reservation is on disk. With group
    # commit the flush ran in the background during generation, scoring, selection and encoding.
    durable(state, r, deadline)
    if units is not None:
        state.metrics.epsilon_charged.labels(r.key.accounting).inc(db.from_units(units[0], db.EPS_SCALE))
    state.metrics.selections.labels(job.plan.method).inc()
    return out
