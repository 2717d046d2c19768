"""The straight path of every selecting request, one function per step:

    reserve → generate → score → select → charge → respond (encode) → settle

:func:`run` calls the steps in this order; each step is a plain function of the previous step's output.
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
7. settle: written after the answer is sent (a background task; until then the reservation counts at its
   reserved cost, which is ≥ the charge), or before it for ``Idempotency-Key`` requests, whose answer is
   stored with the settle. A settle that fails leaves the reserved cost charged (reconciliation).

A process crash leaves the reservation open; :meth:`SQLBudgetStore.reconcile_stale` charges it at its
reserved cost.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privalign.accounting import filters as F
from privalign.errors import BudgetExhaustedError, ReservationError, UnsupportedEventError
from privalign.service import db
from privalign.service import plan as planning
from privalign.service.components import UpstreamError, build_generator, build_scorer
from privalign.service.config import ServiceConfig
from privalign.service.errors import ApiError
from privalign.service.keys import KeyCache, KeyInfo
from privalign.service.metrics import ServiceMetrics
from privalign.service.store import ActiveKeyCheckFailed, Receipt, SQLBudgetStore, cost_units

__all__ = ["ServiceState", "Job", "Outcome", "run", "reserve", "generate", "score", "charge", "respond", "encode"]

log = logging.getLogger("privalign.service")

#: The filter of each accounting mode, used for its currency only (cost of an event, charge of a realized
#: event); the limit is the key's granted budget in the ledger, so the filters' own budgets are unused.
FILTERS: dict[str, F.PrivacyFilter] = {
    "pure": F.PureDPFilter(1.0),
    "zcdp": F.ZCDPFilter(1.0),
    "ex-post": F.ExPostFilter(1.0, 0.5),
}


def encode(body: Any) -> bytes:
    """JSON bytes of an answer (UTF-8; NaN/Infinity refused)."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


# ------------------------------------------------------------------------------------------------
# State
# ------------------------------------------------------------------------------------------------


class ServiceState:
    """Everything one app instance owns: config, engine, store, components, noise, metrics, workers."""

    def __init__(self, cfg: ServiceConfig, *, scorer: Any = None, generator: Any = None, private: bool = True) -> None:
        from privalign.rng import SecureNoise

        self.cfg = cfg
        self.private = private
        self.engine = db.make_engine(cfg.database.url, schema=cfg.database.schema or None)
        db.create_schema(self.engine, schema=cfg.database.schema or None)
        self.store = SQLBudgetStore(self.engine, durable=cfg.database.sync == "full")
        self.key_cache = KeyCache()
        self.scorer = scorer if scorer is not None else build_scorer(cfg.reward_model)
        self.generator = generator if generator is not None else build_generator(cfg.generator)
        self.noise = SecureNoise()
        self.metrics = ServiceMetrics()
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="privalign-work")
        # Deferred settles: the worker threads are joined at interpreter exit, so the settles queued
        # before a graceful shutdown are written. Not yet written: {key id: {reservation id: give-up time}}.
        self.settler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="privalign-settle")
        self._pending: dict[str, dict[str, float]] = {}
        self._pending_cv = threading.Condition()
        self.started = time.time()
        # Readiness: a generator with a warm() hook is loading until warm_up() has returned; one without
        # is ready at once.
        self._warm = threading.Event()
        self.warm_error: str | None = None
        self._warming = False
        if not callable(getattr(self.generator, "warm", None)):
            self._warm.set()

    # -- readiness ----------------------------------------------------------------------------
    def start_warm_up(self) -> threading.Thread | None:
        """Load the generator in a background thread (``privalign serve`` does this at start-up), with a
        log line while it loads; :attr:`ready` is false until it has loaded. Without this call a generator
        loads on its first request, as before."""
        if self._warm.is_set():
            return None
        self._warming = True

        def work() -> None:
            t0 = time.monotonic()
            log.warning("loading the generator (%s); /readyz answers 503 until it is warm", self.cfg.generator.kind)
            try:
                self.generator.warm()
            except Exception as exc:  # noqa: BLE001 - reported by /readyz
                self.warm_error = type(exc).__name__
                log.error("the generator failed to load: %s", type(exc).__name__)
                return
            log.warning("generator warm after %.1f s", time.monotonic() - t0)
            self._warm.set()

        t = threading.Thread(target=work, daemon=True, name="privalign-warm-up")
        t.start()
        return t

    @property
    def ready(self) -> bool:
        return self._warm.is_set()

    @property
    def loading(self) -> bool:
        """A warm-up was started and has not finished: generating endpoints answer 503 meanwhile."""
        return self._warming and not self._warm.is_set()

    # -- deferred settles ---------------------------------------------------------------------
    def settle_later(self, key_id: str, reservation_id: str, units: tuple[int, int], event: dict) -> Callable[[], Awaitable[None]]:
        """Register the settle of an answer that is about to be sent. Returns a coroutine function that the
        endpoint runs once the response has been sent (a Starlette background task, on the event loop); it
        hands the settle to a worker thread without waiting for it.

        Until it commits, the reservation stays charged at its reserved cost (≥ the charge), so every
        reservation decided meanwhile is at least as conservative. If it fails, never runs, or the process
        dies first, the reservation stays open and reconciliation charges its reserved cost (fail closed).
        """
        with self._pending_cv:
            self._pending.setdefault(key_id, {})[reservation_id] = time.monotonic() + self.cfg.limits.request_timeout_s

        async def after_response() -> None:
            self.settler.submit(self._settle, key_id, reservation_id, units, event)

        return after_response

    def _settle(self, key_id: str, reservation_id: str, units: tuple[int, int], event: dict) -> None:
        try:
            self.store.settle(reservation_id, units=units, event=event)
        except ReservationError as exc:  # e.g. reconciled first: charged at the reserved cost
            self.metrics.settle_failures.inc()
            log.warning("deferred settle not written: %s", exc)
        except Exception as exc:  # noqa: BLE001 - database error: the reservation stays charged, reconciled later
            self.metrics.settle_failures.inc()
            log.error("deferred settle failed: %s; the reservation stays charged at its reserved cost", type(exc).__name__)
        finally:
            with self._pending_cv:
                mine = self._pending.get(key_id, {})
                mine.pop(reservation_id, None)
                if not mine:
                    self._pending.pop(key_id, None)
                self._pending_cv.notify_all()

    def pending_settles(self, key_id: str) -> int:
        """How many deferred settles of ``key_id`` this process has not written yet (never blocks)."""
        with self._pending_cv:
            return len(self._pending.get(key_id, {}))

    def wait_settled(self, key_id: str | None = None, timeout: float | None = None) -> bool:
        """Wait until this process has written the deferred settles of ``key_id`` (of every key if
        ``None``) registered so far (tests, graceful shutdown). A settle that has not run within
        ``limits.request_timeout_s`` of its registration is given up. Returns ``False`` on ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._pending_cv:
            while True:
                now = time.monotonic()
                left = 0.0
                for k in [key_id] if key_id is not None else list(self._pending):
                    mine = self._pending.get(k, {})
                    for rid, give_up in list(mine.items()):
                        if give_up <= now:
                            del mine[rid]  # never ran: reconciliation charges it
                        else:
                            left = max(left, give_up - now)
                    if not mine:
                        self._pending.pop(k, None)
                if left == 0.0:
                    return True
                if end is not None:
                    if end <= now:
                        return False
                    left = min(left, end - now)
                self._pending_cv.wait(left)

    def reconcile(self) -> list[str]:
        """Charge stale open reservations at their reserved cost and delete expired stored answers."""
        done = self.store.reconcile_stale(older_than_s=self.cfg.privacy.reconcile_after_s)
        if done:
            self.metrics.reconciled.inc(len(done))
            log.warning("reconciled %d stale reservation(s) at their reserved cost", len(done))
        purged = self.store.purge_expired_answers()
        if purged:
            log.info("deleted %d expired stored answer(s)", purged)
        return done


# ------------------------------------------------------------------------------------------------
# The request and its steps
# ------------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One validated selecting request.

    ``render(index, text, privacy_block) -> dict`` builds the answer body; ``stream`` (optional) turns
    that body into the bytes of a server-sent-event stream.
    """

    endpoint: str
    plan: planning.Plan
    prompt: Any
    score_prompt: str
    candidates: list[str] | None
    gen_kwargs: dict[str, Any]
    render: Callable[[int, str, dict], dict]
    stream: Callable[[dict], bytes] | None = None


@dataclass
class Reserved:
    """The outcome of :func:`reserve`: the key (re-authenticated if needed) and, for a private method,
    the filter, the filter's reservation and the store's receipt."""

    key: KeyInfo
    flt: F.PrivacyFilter | None = None
    reservation: F.Reservation | None = None
    receipt: Receipt | None = None


@dataclass
class Outcome:
    """An answer ready to send: its encoded body, and the settle to run (``None`` if nothing to charge)."""

    body: dict
    content: bytes
    media_type: str
    reservation_id: str | None = None
    settle: tuple[str, str, tuple[int, int], dict] | None = field(default=None)


def _unit_name(key: KeyInfo) -> str:
    return "rho" if key.accounting == "zcdp" else "epsilon"


def remaining_dict(key: KeyInfo, units: tuple[int, int]) -> dict[str, float]:
    return {_unit_name(key): db.from_units(units[0], db.EPS_SCALE), "delta": db.from_units(units[1], db.DELTA_SCALE)}


def reserve(state: ServiceState, key: KeyInfo, plan: planning.Plan, reauth: Callable[[], KeyInfo] | None,
            endpoint: str = "") -> Reserved:
    """Step 1. ``reauth``: ``None`` if ``key`` was authenticated from the database; otherwise ``key``
    comes from the key cache and the reserving statement also checks that the key is active
    (``require_active``); if it writes nothing, the key is authenticated from the database (401) and the
    reservation decided again exactly as without the cache."""
    if not (state.private and plan.method != "bon"):
        return Reserved(key)
    flt = FILTERS[key.accounting]
    try:
        cost = flt.cost(plan.worst)
    except UnsupportedEventError as exc:
        if reauth is not None:
            key = reauth()
        raise ApiError(400, "invalid_request_error", f"Method {plan.method!r} is not supported by this key's {key.accounting!r} "
                       f"accounting: {exc}", param="privacy.method") from None
    event = plan.worst.to_dict()
    receipt = None
    if reauth is not None:
        try:
            receipt = state.store.reserve(key.key_id, cost, None, event=event, require_active=True)
        except (ActiveKeyCheckFailed, BudgetExhaustedError):
            key = reauth()  # nothing was written: authenticate from the database and decide again
            flt = FILTERS[key.accounting]
    if receipt is None:
        try:
            receipt = state.store.reserve(key.key_id, cost, None, event=event)
        except BudgetExhaustedError as exc:
            state.metrics.refusals.labels(endpoint).inc()
            rem = {_unit_name(key): exc.remaining.get("primary", 0.0), "delta": exc.remaining.get("delta", 0.0)}
            raise ApiError(
                429, "budget_exhausted",
                f"Privacy budget exhausted: this request needs {_unit_name(key)}={cost[0]:.9g}, delta={cost[1]:.3g}; the key has "
                f"{_unit_name(key)}={rem[_unit_name(key)]:.9g}, delta={rem['delta']:.3g} left. Nothing was charged. "
                "GET /v1/budget shows the key's budget; ask the operator for a top-up, or lower privacy.epsilon or privacy.n.",
                retry=False, remaining=rem,
            ) from None
    state.metrics.epsilon_reserved.labels(key.accounting).inc(db.from_units(receipt.cost[0], db.EPS_SCALE))
    res = F.Reservation(id=receipt.reservation_id, principal=key.key_id, worst_case=plan.worst, cost=cost)
    return Reserved(key, flt, res, receipt)


def _cancel(state: ServiceState, r: Reserved) -> None:
    if r.receipt is not None:
        state.store.cancel(r.receipt.reservation_id)
        state.metrics.cancelled.inc()


def generate(state: ServiceState, job: Job, r: Reserved, deadline: float) -> list[str]:
    """Step 2: public inputs only. Any failure cancels the reservation (nothing charged)."""
    if job.candidates is not None:
        return job.candidates
    need = planning.pool_size(job.plan)
    try:
        fut = state.pool.submit(state.generator, job.prompt, need, **job.gen_kwargs)
        candidates = list(fut.result(timeout=max(0.0, deadline - time.monotonic())))
        for i, c in enumerate(candidates):
            if not isinstance(c, str):
                raise UpstreamError(f"candidate {i} is not a string")
            c.encode("utf-8")  # an unencodable candidate is a generator failure, found before scoring
        if len(candidates) != need:
            raise UpstreamError(f"generator returned {len(candidates)} candidates, expected {need}")
    except Exception as exc:  # noqa: BLE001 - UpstreamError, FutureTimeout, anything the generator raises
        _cancel(state, r)
        if isinstance(exc, FutureTimeout):
            raise ApiError(504, "upstream_timeout", "The generator timed out; the reservation was released (no private score was "
                           "computed).") from None
        log.warning("generator failed: %s", type(exc).__name__)
        raise ApiError(502, "upstream_error", "The generator failed; the reservation was released (no private score was "
                       "computed).") from None
    return candidates


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
        raise ApiError(500, "internal_error", "The reward model failed; the reservation stays charged at its reserved cost. "
                       "Do not retry: a retry is charged again.", charged=True) from None
    if time.monotonic() > deadline:
        raise ApiError(504, "timeout", "Scoring timed out; the reservation stays charged at its reserved cost. Do not retry: a "
                       "retry is charged again.", charged=True)
    return np.clip(raw, 0.0, state.cfg.privacy.reward_max)


def charge(r: Reserved, realized: Any) -> tuple[int, int]:
    """Step 5: the filter's charge for the realized event (checked ≤ reserved), in exact ledger units."""
    cost = r.flt.charge(r.reservation, realized)
    units = cost_units(cost)
    if units[0] > r.receipt.cost[0] or units[1] > r.receipt.cost[1]:  # pragma: no cover - ceil is monotone
        raise ReservationError(f"charge {units} above the reservation {r.receipt.cost}")
    return units


def _eps_of(*, realized: bool, plan: planning.Plan, ev: Any) -> float:
    for attr in (("epsilon_realized",) if realized else ("epsilon_max",)) + ("epsilon",):
        v = getattr(ev, attr, None)
        if v is not None:
            return float(v)
    return float(plan.epsilon)


def respond(job: Job, r: Reserved, idx: int, text: str, n: int, realized: Any, units: tuple[int, int] | None) -> Outcome:
    """Step 6: the privacy block and the answer, encoded to bytes (before anything is settled)."""
    key = r.key
    block: dict[str, Any] = {"method": job.plan.method, "n": n, "accounting": key.accounting}
    settle = None
    if r.receipt is not None:
        rc = r.receipt
        block.update({
            "epsilon_requested": job.plan.epsilon,
            "epsilon_reserved": _eps_of(realized=False, plan=job.plan, ev=job.plan.worst),
            "epsilon_charged": _eps_of(realized=True, plan=job.plan, ev=realized),
            "delta": float(getattr(realized, "delta", 0.0) or 0.0),
            "charged": db.from_units(units[0], db.EPS_SCALE),
            "reserved": db.from_units(rc.cost[0], db.EPS_SCALE),
            "charge_unit": _unit_name(key),
            "remaining": remaining_dict(key, rc.remaining_after(units)),
            "reservation_id": rc.reservation_id,
        })
        settle = (key.key_id, rc.reservation_id, units, realized.to_dict())
    else:
        # Non-private (bon, or the benchmark baseline): no guarantee, nothing charged; ε = ∞ is not JSON.
        block.update({"epsilon_requested": None, "epsilon_charged": None, "private": False, "guarantee": "none"})
    body = job.render(idx, text, block)
    if job.stream is not None:
        return Outcome(body, job.stream(body), "text/event-stream", block.get("reservation_id"), settle)
    return Outcome(body, encode(body), "application/json", block.get("reservation_id"), settle)


def run(state: ServiceState, key: KeyInfo, job: Job, *, reauth: Callable[[], KeyInfo] | None = None) -> Outcome:
    """The straight path: reserve → generate → score → select → charge → respond. The settle is left
    to the caller (``Outcome.settle``): written after the answer is sent, or before it is stored."""
    deadline = time.monotonic() + state.cfg.limits.request_timeout_s
    if state.scorer is None or (job.candidates is None and state.generator is None):
        if reauth is not None:
            reauth()  # a 401 comes before a 503, as without the key cache
        if state.scorer is None:
            raise ApiError(503, "service_unavailable", "No reward model is configured on this server.")
        raise ApiError(503, "service_unavailable", "No generator is configured on this server; use POST /v1/select.")
    if job.candidates is None and state.loading:
        if reauth is not None:
            reauth()
        raise ApiError(503, "service_unavailable", "The generator is still loading (see GET /readyz); nothing was charged. "
                       "Retry in a few seconds.", headers={"Retry-After": "5"})
    r = reserve(state, key, job.plan, reauth, job.endpoint)
    candidates = generate(state, job, r, deadline)
    t_private = time.monotonic()
    scores = score(state, job, candidates, deadline)
    try:
        if state.private:
            idx, realized = planning.select(job.plan, scores, state.noise)
        else:  # benchmark baseline: privacy layer disabled, exact argmax
            idx, realized = int(np.argmax(scores)), job.plan.worst
        pad = state.cfg.privacy.pad_selection_s - (time.monotonic() - t_private)
        if pad > 0:  # hide how long the private part took (up to pad_selection_s); see LIMITATIONS.md
            time.sleep(pad)
        units = charge(r, realized) if r.receipt is not None else None
        out = respond(job, r, idx, candidates[idx], len(candidates), realized, units)
    except ApiError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug after scoring: charged, never retried
        log.error("selection or encoding failed: %s", type(exc).__name__, exc_info=exc)
        raise ApiError(500, "internal_error", "Internal error after private scoring; the reservation stays charged at its "
                       "reserved cost. Do not retry: a retry is charged again.", charged=True) from None
    if units is not None:
        state.metrics.epsilon_charged.labels(r.key.accounting).inc(db.from_units(units[0], db.EPS_SCALE))
    state.metrics.selections.labels(job.plan.method).inc()
    return out
