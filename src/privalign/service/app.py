"""The FastAPI application: an OpenAI-compatible private best-of-N service with per-key budgets.

Request flow (every selecting endpoint; the order is the privacy argument):

1. **parse / validate**: body size, JSON schema, limits (``n``, text length, ε), method allowed, seeds
   refused → 400/413/422, nothing charged.
2. **authenticate**: bearer key, salted-hash check, not revoked → 401. For a key this process has
   authenticated before (``KeyCache``), the secret is checked against the remembered hash without a
   database read and step 4's statement checks that the key is still active; when that statement writes
   nothing, the key is authenticated from the database (401) and step 4 is decided again.
3. **idempotency**: a completed request with the same ``Idempotency-Key`` returns its stored answer
   (not charged again); one in flight → 409.
4. **reserve** the worst-case event in the key's filter (database transaction) → 429 naming the remaining
   budget, *before* any score is computed.
5. **generate** candidates (public: the prompt only). Failure → the reservation is **cancelled** (the
   private reward model was not touched) → 502.
6. **score** with the private reward model, clip to ``[0, R_max]``.
7. **select** with :class:`privalign.rng.SecureNoise`.
8. **respond, then settle**: the filter checks the realized event (≤ reserved) and computes the charge;
   the answer (one completion and the ``privacy`` block, whose ``remaining`` comes from the totals the
   reserving statement returned) is sent, and the settle is written after it by a background task
   (:meth:`ServiceState.settle_later`). With an ``Idempotency-Key`` the settle is written before the
   answer is stored and sent.

Fault rules: once step 6 has started, the reservation is never released: a timeout, an exception or a
failed settle leaves it charged at the reserved cost (reconciled later). Before the answer, such a
failure answers 500/503/504 with no selection; a settle that fails after the answer was sent is counted
(``privalign_settle_failures_total``). A database error before the answer → 503 with no selection
released. A process crash leaves the reservation open; :meth:`SQLBudgetStore.reconcile_stale` at start-up
charges it at its reserved cost.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from privalign.errors import (
    BudgetExhaustedError,
    PrivacyParameterError,
    ReservationError,
    UnsupportedEventError,
)
from privalign.service import db
from privalign.service.components import UpstreamError, build_generator, build_scorer
from privalign.service.config import ServiceConfig
from privalign.service.keys import KeyCache, KeyInfo, authenticate
from privalign.service.metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from privalign.service.store import (
    ActiveKeyCheckFailed,
    SQLBudgetStore,
    ledger_event,
    require_active_key,
    reserve_totals,
)

__all__ = ["create_app", "ServiceState"]

log = logging.getLogger("privalign.service")


# ------------------------------------------------------------------------------------------------
# Request / response schemas
# ------------------------------------------------------------------------------------------------


class PrivacyParams(BaseModel):
    """The ``privacy`` object of a request. Unknown fields are refused (a typo must not silently fall
    back to a default); ``seed`` is refused explicitly."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["privbon", "privitp", "bon"] | None = Field(None, description="Selection method.")
    epsilon: float | None = Field(None, gt=0, description="Per-request ε (PrivBoN: the exponential mechanism's ε).")
    n: int | None = Field(None, ge=1, description="Number of candidates to generate (completions endpoints).")
    beta: float | None = Field(None, gt=0, description="PrivITP: KL temperature β.")
    sigma_x: float | None = Field(None, gt=0, description="PrivITP: phase-1 Gaussian noise σ_X.")
    sigma_z: float | None = Field(None, gt=0, description="PrivITP: phase-2 Gaussian noise σ_Z.")
    seed: Any | None = Field(None, description="Refused: the service uses secure noise only.")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(..., max_length=64)
    content: str


class _OpenAIBase(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field("privalign", max_length=200)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, description="Number of returned choices; only 1 is supported.")
    stream: bool | None = None
    seed: int | None = Field(None, description="Refused: the service uses secure noise only.")
    privacy: PrivacyParams | None = None


class ChatCompletionRequest(_OpenAIBase):
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=256)


class CompletionRequest(_OpenAIBase):
    prompt: str


class SelectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str
    candidates: list[str] = Field(..., min_length=1)
    privacy: PrivacyParams | None = None


class ApiError(Exception):
    """An error answer: status, OpenAI-style ``type``, message (never a stack trace), extra fields."""

    def __init__(self, status: int, type_: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.type, self.message, self.extra = status, type_, message, extra


def _error_body(type_: str, message: str, **extra: Any) -> dict:
    return {"error": {"type": type_, "message": message, **extra}}


# ------------------------------------------------------------------------------------------------
# Methods: worst case before, realized after
# ------------------------------------------------------------------------------------------------


class _Plan:
    """A validated selection request: method, parameters, worst-case event."""

    def __init__(self, method: str, epsilon: float, n: int, params: dict[str, float], worst: Any, mech: Any = None) -> None:
        self.method, self.epsilon, self.n, self.params, self.worst, self.mech = method, epsilon, n, params, worst, mech


def _make_plan(cfg: ServiceConfig, pp: PrivacyParams | None, n_default: int) -> _Plan:
    pv, lim = cfg.privacy, cfg.limits
    pp = pp or PrivacyParams()
    if pp.seed is not None:
        raise ApiError(400, "invalid_request_error", "The 'privacy.seed' parameter is not accepted: the service uses secure noise only.", param="privacy.seed")
    method = pp.method or pv.allowed_methods[0]
    if method not in pv.allowed_methods or (method == "bon" and not pv.allow_non_private):
        raise ApiError(
            400, "invalid_request_error", f"The 'privacy.method' parameter must be one of {list(pv.allowed_methods)} on this server. Got {method!r} instead.", param="privacy.method"
        )
    eps = pp.epsilon if pp.epsilon is not None else pv.default_epsilon
    if not (0 < eps <= lim.max_epsilon) or not math.isfinite(eps):
        raise ApiError(400, "invalid_request_error", f"The 'privacy.epsilon' parameter must be in (0, {lim.max_epsilon:g}]. Got {eps!r} instead.", param="privacy.epsilon")
    n = pp.n if pp.n is not None else n_default
    if not (1 <= n <= lim.max_n):
        raise ApiError(400, "invalid_request_error", f"The 'privacy.n' parameter must be in [1, {lim.max_n}]. Got {n!r} instead.", param="privacy.n")
    if method == "bon":
        from privalign.alignment import BestOfN

        sel = BestOfN()
        return _Plan(method, math.inf, n, {}, sel.worst_case_event(n), sel)
    if method == "privbon":
        for extra in ("beta", "sigma_x", "sigma_z"):
            if getattr(pp, extra) is not None:
                raise ApiError(400, "invalid_request_error", f"The 'privacy.{extra}' parameter applies to privitp only.", param=f"privacy.{extra}")
        from privalign.alignment import PrivBoN

        sel = PrivBoN(eps, sensitivity=pv.sensitivity, r_max=pv.reward_max, clip=True)
        return _Plan(method, eps, n, {"sensitivity": pv.sensitivity, "reward_max": pv.reward_max}, sel.worst_case_event(n), sel)
    # privitp: two pools of n (phase 1, phase 2) plus one fallback candidate; privacy.epsilon caps ε_max.
    from privalign.alignment import PrivITP

    itp = dict(pv.privitp)
    for name in ("beta", "sigma_x", "sigma_z"):
        if getattr(pp, name) is not None:
            itp[name] = getattr(pp, name)
    try:
        sel = PrivITP(
            itp["beta"], sigma_x=itp["sigma_x"], sigma_z=itp["sigma_z"], L=itp.get("envelope_l", 3.0),
            r_max=pv.reward_max, delta=pv.delta, sensitivity=pv.sensitivity, clip=True,
        )
        worst = sel.worst_case_event(n)
    except (PrivacyParameterError, TypeError, ValueError, KeyError) as exc:
        raise ApiError(400, "invalid_request_error", f"Invalid privitp parameters: {exc}", param="privacy") from None
    if worst.epsilon_max > eps:
        raise ApiError(
            400,
            "invalid_request_error",
            f"The privitp worst-case cost ε_max={worst.epsilon_max:.6g} (n={n}, β={itp['beta']}, σ_X={itp['sigma_x']}, "
            f"σ_Z={itp['sigma_z']}) exceeds the 'privacy.epsilon' cap {eps:g}: raise epsilon or the noise, or lower n.",
            param="privacy.epsilon",
        )
    return _Plan(method, eps, n, itp, worst, sel)


def _pool_size(plan: _Plan) -> int:
    """Candidates needed: n, or 2n + 1 for privitp (phase-1 pool, phase-2 pool, fallback)."""
    return 2 * plan.n + 1 if plan.method == "privitp" else plan.n


def _select(plan: _Plan, scores: np.ndarray, noise: Any) -> tuple[int, Any]:
    """Run the selection on clipped scores; returns (index into the candidates, realized event)."""
    if plan.method == "privitp":
        n = plan.n
        out = plan.mech.select(scores[:n], rng=noise, pool_b_scores=scores[n : 2 * n])
        from privalign.alignment import FALLBACK

        return (2 * n if out.index == FALLBACK else n + int(out.index)), out.event
    out = plan.mech.select(scores, rng=noise)
    return int(out.index), out.event


# ------------------------------------------------------------------------------------------------
# Accounting per key
# ------------------------------------------------------------------------------------------------


def _filter_for(key: KeyInfo, store: SQLBudgetStore) -> Any:
    """A filter for the key's accounting mode, with the key's granted budget (read at authentication;
    the store caps it again with the value under the row lock, so a concurrent top-up or a stale read can
    only make a request more conservative). Its store is a :class:`_SettleCapture` over ``store``."""
    from privalign.accounting import filters as F

    store = _SettleCapture(store)
    lim_a, lim_b = key.limit
    if key.accounting == "pure":
        return F.PureDPFilter(epsilon=lim_a, store=store)
    if key.accounting == "zcdp":
        return F.ZCDPFilter(rho=lim_a, store=store)
    return F.ExPostFilter(epsilon=lim_a, delta=lim_b, store=store)


def _remaining(key: KeyInfo, snap: dict[str, float]) -> dict[str, float]:
    a = max(0.0, snap["limit_epsilon"] - snap["spent_epsilon"] - snap["reserved_epsilon"])
    b = max(0.0, snap["limit_delta"] - snap["spent_delta"] - snap["reserved_delta"])
    if key.accounting == "zcdp":
        return {"rho": a, "delta": snap["limit_delta"]}
    return {"epsilon": a, "delta": b}


def _remaining_after(key: KeyInfo, snap: dict[str, float], reserved: tuple[float, float], charged: tuple[float, float]) -> dict[str, float]:
    """``remaining`` as of this request's reservation: the totals the reserving statement returned (this
    reservation included), with this reservation settled at ``charged``. Concurrent requests of the same
    key are counted as they stood when this one reserved."""
    s = dict(snap)
    s["spent_epsilon"] = snap["spent_epsilon"] + charged[0]
    s["spent_delta"] = snap["spent_delta"] + charged[1]
    s["reserved_epsilon"] = snap["reserved_epsilon"] - reserved[0]
    s["reserved_delta"] = snap["reserved_delta"] - reserved[1]
    return _remaining(key, s)


class _SettleCapture:
    """A ``BudgetStore`` proxy for one request's filter: reservations and cancellations go to the
    database store; ``settle`` only records the cost the filter computed (after the filter's own checks),
    so that the service can write it at once or after the answer (:meth:`ServiceState.settle_later`)."""

    def __init__(self, store: SQLBudgetStore) -> None:
        self.store = store
        self.captured: tuple[str, tuple[float, float]] | None = None

    def try_reserve(self, principal: str, cost: tuple[float, float], limit: tuple[float, float]) -> str:
        return self.store.try_reserve(principal, cost, limit)

    def settle(self, reservation_id: str, cost: tuple[float, float]) -> None:
        self.captured = (reservation_id, (float(cost[0]), float(cost[1])))

    def cancel(self, reservation_id: str) -> None:
        self.store.cancel(reservation_id)

    def totals(self, principal: str) -> tuple[tuple[float, float], tuple[float, float]]:
        return self.store.totals(principal)


def _reservation_id(res: Any) -> str:
    for attr in ("reservation_id", "id", "store_id"):
        v = getattr(res, attr, None)
        if isinstance(v, str):
            return v
    return str(res)


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
        # Deferred settles (settle_later): the worker threads are joined at interpreter exit, so the
        # settles queued before a graceful shutdown are written. Not yet written: {key id: {reservation
        # id: give-up time (monotonic)}}.
        self.settler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="privalign-settle")
        self._pending: dict[str, dict[str, float]] = {}
        self._pending_cv = threading.Condition()
        self.started = time.time()

    def settle_later(self, key_id: str, reservation_id: str, cost: tuple[float, float], event: dict) -> Callable[[], Awaitable[None]]:
        """Register the settle of an answer that is about to be sent. Returns a coroutine function that the
        endpoint runs once the response has been sent (a Starlette background task, on the event loop); it
        hands the settle to a worker thread of ``self.settler`` without waiting for it.

        Until it commits, the reservation stays charged at its reserved cost (≥ the realized cost), so
        every reservation decided meanwhile is at least as conservative. If it fails, if it never runs
        (the request task is cancelled) or if the process dies first, the reservation stays open and
        reconciliation charges its reserved cost (fail closed).
        """
        with self._pending_cv:
            self._pending.setdefault(key_id, {})[reservation_id] = time.monotonic() + self.cfg.limits.request_timeout_s

        async def after_response() -> None:
            self.settler.submit(self._settle, key_id, reservation_id, cost, event)

        return after_response

    def _settle(self, key_id: str, reservation_id: str, cost: tuple[float, float], event: dict) -> None:
        try:
            self.store.settle(reservation_id, cost, event=event)
        except ReservationError as exc:  # e.g. reconciled first: charged at the reserved cost
            self.metrics.settle_failures.inc()
            log.warning("deferred settle not written: %s", exc)
        except Exception as exc:  # database error: the reservation stays charged, reconciled later
            self.metrics.settle_failures.inc()
            log.error("deferred settle failed: %s; the reservation stays charged at its reserved cost", type(exc).__name__)
        finally:
            with self._pending_cv:
                mine = self._pending.get(key_id, {})
                mine.pop(reservation_id, None)
                if not mine:
                    self._pending.pop(key_id, None)
                self._pending_cv.notify_all()

    def wait_settled(self, key_id: str | None = None, timeout: float | None = None) -> bool:
        """Wait until this process has written the deferred settles of ``key_id`` (of every key if
        ``None``) registered so far. A settle that has not run within ``limits.request_timeout_s`` of its
        registration is given up (its reservation stays charged). Returns ``False`` on ``timeout``."""
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
        done = self.store.reconcile_stale(older_than_s=self.cfg.privacy.reconcile_after_s)
        if done:
            self.metrics.reconciled.inc(len(done))
            log.warning("reconciled %d stale reservation(s) at their reserved cost", len(done))
        return done


# ------------------------------------------------------------------------------------------------
# Core request handling
# ------------------------------------------------------------------------------------------------


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def _auth(state: ServiceState, authorization: str | None) -> KeyInfo:
    key = authenticate(state.store, _bearer(authorization), cache=state.key_cache)
    if key is None:
        raise ApiError(401, "authentication_error", "Missing, unknown or revoked API key.")
    return key


def _check_text(state: ServiceState, text: str, name: str) -> None:
    if len(text) > state.cfg.limits.max_text_chars:
        raise ApiError(
            400, "invalid_request_error", f"The '{name}' parameter must have at most {state.cfg.limits.max_text_chars} characters. Got {len(text)}.", param=name
        )


def _idem_begin(state: ServiceState, key: KeyInfo, idem_key: str | None, req_hash: str) -> tuple[int, dict] | None:
    """Return a stored answer, raise 409/422, or record a pending attempt and return None."""
    if not idem_key:
        return None
    if len(idem_key) > 200:
        raise ApiError(400, "invalid_request_error", "The 'Idempotency-Key' header must have at most 200 characters.")
    with state.engine.begin() as conn:
        row = conn.execute(
            select(db.idempotency).where(db.idempotency.c.principal == key.key_id, db.idempotency.c.idem_key == idem_key)
        ).mappings().first()
        if row is None:
            try:
                conn.execute(
                    db.idempotency.insert().values(
                        principal=key.key_id, idem_key=idem_key, request_hash=req_hash, status="pending", created_at=db.now()
                    )
                )
                return None
            except IntegrityError:
                pass  # a concurrent attempt inserted it first
    if row is None:
        raise ApiError(409, "conflict_error", "A request with this Idempotency-Key is in progress.")
    if row["request_hash"] != req_hash:
        raise ApiError(422, "invalid_request_error", "This Idempotency-Key was used with a different request body.")
    if row["status"] == "done":
        return int(row["status_code"]), json.loads(row["response"])
    raise ApiError(
        409,
        "conflict_error",
        "A request with this Idempotency-Key is in progress or was interrupted; an interrupted attempt stays charged at its reserved cost.",
    )


def _idem_finish(state: ServiceState, key: KeyInfo, idem_key: str | None, status: int, body: dict | None, rid: str | None) -> None:
    if not idem_key:
        return
    with state.engine.begin() as conn:
        cond = (db.idempotency.c.principal == key.key_id) & (db.idempotency.c.idem_key == idem_key)
        if body is None:
            conn.execute(delete(db.idempotency).where(cond & (db.idempotency.c.status == "pending")))
        else:
            conn.execute(
                update(db.idempotency).where(cond).values(status="done", status_code=status, response=json.dumps(body), reservation_id=rid)
            )


def _run_selection(
    state: ServiceState,
    key: KeyInfo,
    plan: _Plan,
    prompt: Any,
    score_prompt: str,
    candidates: list[str] | None,
    gen_kwargs: dict[str, Any],
    endpoint: str,
    reauth: Any = None,
    defer_settle: bool = False,
) -> tuple[int, str, dict, Callable[[], Awaitable[None]] | None]:
    """Reserve → generate → score → select → settle. Returns (index, text, privacy block, deferred settle).

    ``defer_settle``: do not write the settle; return it (:meth:`ServiceState.settle_later`) for the
    endpoint to run after the response has been sent. Otherwise the settle is written before returning
    and the last element is ``None``. Either way the answer's ``remaining`` is computed from the totals
    that the reserving statement returned (:data:`reserve_totals`), as if this request's settle had
    directly followed its reservation.

    ``reauth``: ``None`` if ``key`` was authenticated from the database. Otherwise ``key`` comes from the
    :class:`KeyCache` (the secret matched a remembered hash; revocation and the current limit are
    unknown), and ``reauth()`` authenticates from the database (raising the 401). The reservation is then
    made under :data:`require_active_key`, so that the statement that reserves also checks that the key
    is active; if it writes nothing, the key is authenticated from the database and the reservation is
    decided again exactly as without the cache.
    """
    cfg = state.cfg
    deadline = time.monotonic() + cfg.limits.request_timeout_s
    if state.scorer is None or (candidates is None and state.generator is None):
        if reauth is not None:
            reauth()  # a 401 comes before a 503, as without the key cache
        if state.scorer is None:
            raise ApiError(503, "service_unavailable", "No reward model is configured on this server.")
        raise ApiError(503, "service_unavailable", "No generator is configured on this server; use POST /v1/select.")

    flt = res = None
    charged_private = state.private and plan.method != "bon"
    if charged_private:
        ledger_event.set(plan.worst.to_dict())
        reserve_totals.set(None)
        if reauth is not None:
            token = require_active_key.set(True)
            try:
                flt = _filter_for(key, state.store)
                res = flt.reserve(key.key_id, plan.worst)
            except (ActiveKeyCheckFailed, BudgetExhaustedError, UnsupportedEventError):
                res = None  # nothing was written: authenticate from the database and decide again
            finally:
                require_active_key.reset(token)
            if res is None:
                key = reauth()
    if charged_private and res is None:
        flt = _filter_for(key, state.store)
        try:
            res = flt.reserve(key.key_id, plan.worst)
        except BudgetExhaustedError as exc:
            state.metrics.refusals.labels(endpoint).inc()
            raise ApiError(429, "budget_exhausted", f"Privacy budget exhausted: {exc}", remaining=exc.remaining) from None
        except UnsupportedEventError as exc:
            raise ApiError(400, "invalid_request_error", f"Method {plan.method!r} is not supported by this key's {key.accounting!r} accounting: {exc}", param="privacy.method") from None
    snap = None
    if res is not None:
        state.metrics.epsilon_reserved.labels(key.accounting).inc(float(res.cost[0]))  # the filter's cost of plan.worst
        snap = reserve_totals.get()  # this key's totals right after this reservation

    # Generation: public inputs only. Failure releases the reservation.
    if candidates is None:
        try:
            need = _pool_size(plan)
            fut = state.pool.submit(state.generator, prompt, need, **gen_kwargs)
            candidates = list(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            for i, c in enumerate(candidates):
                if not isinstance(c, str):
                    raise UpstreamError(f"candidate {i} is not a string")
            if len(candidates) != need:
                raise UpstreamError(f"generator returned {len(candidates)} candidates, expected {need}")
        except Exception as exc:  # UpstreamError, FutureTimeout, anything the generator raises
            if res is not None:
                flt.cancel(res)
                state.metrics.cancelled.inc()
            if isinstance(exc, FutureTimeout):
                raise ApiError(504, "upstream_timeout", "The generator timed out; the reservation was released (no private score was computed).") from None
            log.warning("generator failed: %s", type(exc).__name__)
            raise ApiError(502, "upstream_error", "The generator failed; the reservation was released (no private score was computed).") from None

    # From here on the private reward model is touched: the reservation is never released.
    # The scorer runs inline in this request's worker thread (a thread hand-off costs milliseconds under
    # load); it cannot be pre-empted, so a scorer that overruns the deadline finishes, its selection is
    # withheld (504) and the reservation stays charged.
    state.metrics.scorer_calls.inc()
    t_private = time.monotonic()
    try:
        raw = np.asarray(state.scorer(score_prompt, candidates), dtype=np.float64).reshape(-1)
        if raw.shape[0] != len(candidates) or not np.all(np.isfinite(raw)):
            raise ValueError("reward model returned a malformed score vector")
        if time.monotonic() > deadline:
            raise FutureTimeout
    except FutureTimeout:
        raise ApiError(504, "timeout", "Scoring timed out; the reservation stays charged at its reserved cost.") from None
    except Exception as exc:
        log.error("reward model failed: %s", type(exc).__name__)
        raise ApiError(500, "internal_error", "The reward model failed; the reservation stays charged at its reserved cost.") from None
    scores = np.clip(raw, 0.0, cfg.privacy.reward_max)
    if state.private:
        idx, realized = _select(plan, scores, state.noise)
    else:  # benchmark baseline: privacy layer disabled, exact argmax
        idx, realized = int(np.argmax(scores)), plan.worst
    pad = cfg.privacy.pad_selection_s - (time.monotonic() - t_private)
    if pad > 0:  # hide how long the private part took (up to pad_selection_s); see LIMITATIONS.md
        time.sleep(pad)
    block: dict[str, Any] = {"method": plan.method, "n": len(candidates), "accounting": key.accounting}
    settle = None
    if res is not None:
        # The filter checks realized ≤ reserved and computes the cost to charge; its store (_SettleCapture)
        # records that cost instead of writing it.
        flt.settle(res, realized)
        rid, cost = flt.store.captured
        if snap is None:  # pragma: no cover - SQLBudgetStore always sets reserve_totals
            snap = state.store.snapshot(key.key_id) or {}  # read while this reservation is still open
        remaining = _remaining_after(key, snap, res.cost, cost)
        ev = realized.to_dict()
        if defer_settle:
            settle = (key.key_id, rid, cost, ev)
        else:
            state.store.settle(rid, cost, event=ev)  # a DB error here propagates → 503; the reservation stays charged
        rc, wc = cost[0], float(res.cost[0])
        state.metrics.epsilon_charged.labels(key.accounting).inc(rc)
        block.update(
            {
                "epsilon_requested": plan.epsilon,
                "epsilon_reserved": _eps_of(realized=False, plan=plan, ev=plan.worst),
                "epsilon_charged": _eps_of(realized=True, plan=plan, ev=realized),
                "delta": float(getattr(realized, "delta", 0.0) or 0.0),
                "charged": rc,
                "reserved": wc,
                "charge_unit": "rho" if key.accounting == "zcdp" else "epsilon",
                "remaining": remaining,
                "reservation_id": _reservation_id(res),
            }
        )
    else:
        # Non-private (bon, or the benchmark baseline): no guarantee, nothing charged; ε = ∞ is not JSON.
        block.update({"epsilon_requested": None, "epsilon_charged": None, "private": False, "guarantee": "none"})
    state.metrics.selections.labels(plan.method).inc()
    after = state.settle_later(*settle) if settle is not None else None
    return idx, candidates[idx], block, after


def _answer(body: dict, after: Callable[[], Awaitable[None]] | None) -> JSONResponse:
    """The 200 answer; ``after`` (a deferred settle) runs once the response has been sent."""
    return JSONResponse(body, background=None if after is None else BackgroundTask(after))


def _eps_of(*, realized: bool, plan: _Plan, ev: Any) -> float:
    for attr in (("epsilon_realized",) if realized else ("epsilon_max",)) + ("epsilon",):
        v = getattr(ev, attr, None)
        if v is not None:
            return float(v)
    return float(plan.epsilon)


# ------------------------------------------------------------------------------------------------
# App factory
# ------------------------------------------------------------------------------------------------


class _BodyLimit:
    """Pure ASGI middleware: refuse bodies above ``max_bytes`` with 413 (checked on the bytes received)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):  # noqa: ANN001
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cl = dict(scope.get("headers") or []).get(b"content-length")
        too_big = False
        if cl is not None:
            try:
                too_big = int(cl) > self.max_bytes
            except ValueError:
                too_big = True
        body, more = b"", True
        if not too_big and scope.get("method") in ("POST", "PUT", "PATCH"):
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                body += msg.get("body", b"")
                more = msg.get("more_body", False)
                if len(body) > self.max_bytes:
                    too_big = True
                    break
        if too_big:
            resp = JSONResponse(_error_body("invalid_request_error", f"Request body larger than {self.max_bytes} bytes."), status_code=413)
            return await resp(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def _db_error_types() -> list[type[BaseException]]:
    import sqlite3

    types: list[type[BaseException]] = [SQLAlchemyError, sqlite3.Error]
    try:
        import psycopg

        types.append(psycopg.Error)
    except ImportError:  # pragma: no cover - PostgreSQL support is optional
        pass
    return types


def create_app(cfg: ServiceConfig, *, scorer: Any = None, generator: Any = None, private: bool = True) -> FastAPI:
    """Build the app for ``cfg``.

    Args:
      cfg: a validated :class:`ServiceConfig`.
      scorer, generator: override the configured components (tests, embedding in another program).
      private: ``False`` disables the privacy layer and the ledger entirely (no auth, no reservation, exact
        argmax). Only for the benchmark baseline; never exposed through the config file.

    Returns:
      The FastAPI app; its ``state.service`` is the :class:`ServiceState`.
    """
    state = ServiceState(cfg, scorer=scorer, generator=generator, private=private)
    if private:
        state.reconcile()
    app = FastAPI(
        title="privalign private best-of-N service",
        version="1",
        description="OpenAI-compatible completions selected by a differentially private best-of-N over a private reward "
        "model, with per-key privacy budgets. Raw reward scores are never returned.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = state
    if cfg.server.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cfg.server.cors_origins), allow_methods=["GET", "POST"], allow_headers=["*"])
    app.add_middleware(_BodyLimit, max_bytes=cfg.limits.max_body_bytes)

    @app.middleware("http")
    async def _observe(request: Request, call_next):  # noqa: ANN001
        t0 = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception:  # pragma: no cover - last line of defence: no stack traces to clients
            log.exception("unhandled error")
            response = JSONResponse(_error_body("internal_error", "Internal error."), status_code=500)
        path = request.scope.get("route").path if request.scope.get("route") is not None else "other"
        state.metrics.requests.labels(path, str(response.status_code)).inc()
        state.metrics.latency.labels(path).observe(time.perf_counter() - t0)
        return response

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        return JSONResponse(_error_body(exc.type, exc.message, **exc.extra), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = f"The '{loc}' parameter is invalid: {first.get('msg', 'invalid')}." if loc else "Invalid request body."
        return JSONResponse(_error_body("invalid_request_error", msg, param=loc or None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException):
        return JSONResponse(_error_body("invalid_request_error", str(exc.detail)), status_code=exc.status_code)

    async def _db(_request: Request, exc: Exception):
        state.metrics.db_errors.inc()
        log.error("database error: %s", type(exc).__name__)
        return JSONResponse(_error_body("service_unavailable", "The budget database is unavailable; nothing was released."), status_code=503)

    # SQLAlchemy errors, and the raw DBAPI errors of the store's hot path.
    for exc_type in _db_error_types():
        app.add_exception_handler(exc_type, _db)

    @app.exception_handler(ReservationError)
    async def _res(_request: Request, exc: ReservationError):  # pragma: no cover - would be a bug
        log.error("reservation error: %s", exc)
        return JSONResponse(_error_body("internal_error", "Internal accounting error; nothing was released."), status_code=500)

    @app.exception_handler(Exception)
    async def _any(_request: Request, exc: Exception):
        log.error("unhandled %s", type(exc).__name__, exc_info=exc)
        return JSONResponse(_error_body("internal_error", "Internal error."), status_code=500)

    def _handle(endpoint: str, body: BaseModel, authorization: str | None, idem_key: str | None, build) -> JSONResponse:  # noqa: ANN001
        # 1. validate (limits, methods, seeds); 2. authenticate; 3. idempotency; 4-8. _run_selection
        plan, prompt, score_prompt, candidates, gen_kwargs, render = build()
        if not state.private:
            key = KeyInfo("baseline", "", "pure", 0.0, None)
            idx, text, block, _ = _run_selection(state, key, plan, prompt, score_prompt, candidates, gen_kwargs, endpoint)
            return JSONResponse(render(idx, text, block))
        if not idem_key and plan.method != "bon":
            # A key this process has authenticated before: its secret is checked against the remembered
            # hash here, and the reservation statement checks that the key is still active (one round
            # trip fewer). Any doubt falls back to the database (see _run_selection).
            cached = state.key_cache.verify(_bearer(authorization))
            if cached is not None:
                idx, text, block, after = _run_selection(state, cached, plan, prompt, score_prompt, candidates, gen_kwargs,
                                                         endpoint, reauth=lambda: _auth(state, authorization), defer_settle=True)
                return _answer(render(idx, text, block), after)
        key = _auth(state, authorization)
        req_hash = hashlib.sha256((endpoint + "\n" + body.model_dump_json()).encode()).hexdigest() if idem_key else ""
        stored = _idem_begin(state, key, idem_key, req_hash)
        if stored is not None:
            return JSONResponse(stored[1], status_code=stored[0], headers={"Idempotent-Replayed": "true"})
        try:
            # With an Idempotency-Key the settle is written before the answer is stored and sent.
            idx, text, block, after = _run_selection(state, key, plan, prompt, score_prompt, candidates, gen_kwargs, endpoint,
                                                     defer_settle=not idem_key)
        except ApiError as exc:
            # Errors before scoring charged nothing: allow a retry with the same key. Errors after
            # scoring keep the attempt pending (the retry is answered 409, never charged twice).
            if exc.status in (400, 401, 409, 413, 422, 429, 502, 503) and not (exc.status == 503 and "reward" in exc.message):
                _idem_finish(state, key, idem_key, exc.status, None, None)
            raise
        out = render(idx, text, block)
        _idem_finish(state, key, idem_key, 200, out, block.get("reservation_id"))
        return _answer(out, after)

    def _gen_kwargs(req: _OpenAIBase, chat: bool) -> dict[str, Any]:
        lim = cfg.limits
        if req.seed is not None:
            raise ApiError(400, "invalid_request_error", "The 'seed' parameter is not accepted: the service uses secure noise only.", param="seed")
        if req.stream:
            raise ApiError(400, "invalid_request_error", "The 'stream' parameter must be false: streaming is not supported.", param="stream")
        if req.n not in (None, 1):
            raise ApiError(400, "invalid_request_error", f"The 'n' parameter must be 1 (one private selection per request; use privacy.n for the candidate count). Got {req.n}.", param="n")
        mt = req.max_tokens if req.max_tokens is not None else min(256, lim.max_tokens)
        if mt > lim.max_tokens:
            raise ApiError(400, "invalid_request_error", f"The 'max_tokens' parameter must be at most {lim.max_tokens}. Got {mt}.", param="max_tokens")
        return {
            "max_tokens": mt,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "chat": chat,
        }

    def _usage() -> dict[str, int]:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}

    @app.post("/v1/chat/completions", summary="OpenAI-compatible chat completion, privately selected")
    def chat_completions(
        body: ChatCompletionRequest,
        authorization: str | None = Header(None),
        idempotency_key: str | None = Header(None),
    ) -> JSONResponse:
        def build():
            gk = _gen_kwargs(body, True)
            for i, m in enumerate(body.messages):
                _check_text(state, m.content, f"messages[{i}].content")
            total = sum(len(m.content) for m in body.messages)
            if total > cfg.limits.max_text_chars:
                raise ApiError(400, "invalid_request_error", f"The 'messages' parameter must have at most {cfg.limits.max_text_chars} characters in total. Got {total}.", param="messages")
            plan = _make_plan(cfg, body.privacy, cfg.privacy.default_n)
            msgs = [{"role": m.role, "content": m.content} for m in body.messages]
            score_prompt = "\n".join(f"{m['role']}: {m['content']}" for m in msgs)

            def render(idx, text, block):
                return {
                    "id": f"chatcmpl-{uuid.uuid4().hex}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}],
                    "usage": _usage(),
                    "privacy": block,
                }

            return plan, msgs, score_prompt, None, gk, render

        return _handle("/v1/chat/completions", body, authorization, idempotency_key, build)

    @app.post("/v1/completions", summary="OpenAI-compatible text completion, privately selected")
    def completions(
        body: CompletionRequest,
        authorization: str | None = Header(None),
        idempotency_key: str | None = Header(None),
    ) -> JSONResponse:
        def build():
            gk = _gen_kwargs(body, False)
            _check_text(state, body.prompt, "prompt")
            plan = _make_plan(cfg, body.privacy, cfg.privacy.default_n)

            def render(idx, text, block):
                return {
                    "id": f"cmpl-{uuid.uuid4().hex}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": body.model,
                    "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                    "usage": _usage(),
                    "privacy": block,
                }

            return plan, body.prompt, body.prompt, None, gk, render

        return _handle("/v1/completions", body, authorization, idempotency_key, build)

    @app.post("/v1/select", summary="Privately select one of the client's candidates")
    def select_endpoint(
        body: SelectRequest,
        authorization: str | None = Header(None),
        idempotency_key: str | None = Header(None),
    ) -> JSONResponse:
        def build():
            _check_text(state, body.prompt, "prompt")
            if len(body.candidates) > cfg.limits.max_n:
                raise ApiError(400, "invalid_request_error", f"The 'candidates' parameter must have at most {cfg.limits.max_n} items. Got {len(body.candidates)}.", param="candidates")
            for i, c in enumerate(body.candidates):
                _check_text(state, c, f"candidates[{i}]")
            pp = body.privacy
            k = len(body.candidates)
            itp = pp is not None and pp.method == "privitp"
            n_implied = (k - 1) // 2 if itp else k
            if (itp and (k < 3 or k % 2 == 0)) or (pp is not None and pp.n is not None and pp.n != n_implied):
                need = "2n + 1 candidates (phase-1 pool, phase-2 pool, fallback)" if itp else "n candidates"
                raise ApiError(400, "invalid_request_error", f"The 'candidates' parameter must hold {need}; got {k} candidates and privacy.n={None if pp is None else pp.n}.", param="candidates")
            plan = _make_plan(cfg, pp, n_implied)

            def render(idx, text, block):
                return {"id": f"sel-{uuid.uuid4().hex}", "object": "selection", "created": int(time.time()), "index": idx, "text": text, "privacy": block}

            return plan, body.prompt, body.prompt, list(body.candidates), {}, render

        return _handle("/v1/select", body, authorization, idempotency_key, build)

    @app.get("/v1/budget", summary="The calling key's budget and its latest ledger rows")
    def budget(authorization: str | None = Header(None)) -> JSONResponse:
        key = _auth(state, authorization)
        # This process's deferred settles of the key are written first (read-your-writes for its own
        # answers; another replica's pending settles show as reserved until they commit).
        state.wait_settled(key.key_id, timeout=cfg.limits.request_timeout_s)
        snap = state.store.snapshot(key.key_id) or {}
        rows = state.store.ledger_rows(key.key_id, limit=100)
        return JSONResponse(
            {
                "key_id": key.key_id,
                "accounting": key.accounting,
                "unit": "rho" if key.accounting == "zcdp" else "epsilon",
                "limit": {"a": snap.get("limit_epsilon", 0.0), "delta": snap.get("limit_delta", 0.0)},
                "spent": {"a": snap.get("spent_epsilon", 0.0), "delta": snap.get("spent_delta", 0.0)},
                "reserved": {"a": snap.get("reserved_epsilon", 0.0), "delta": snap.get("reserved_delta", 0.0)},
                "remaining": _remaining(key, snap) if snap else {},
                "ledger": rows,
            }
        )

    @app.get("/healthz", summary="Liveness and database reachability")
    def healthz() -> JSONResponse:
        with state.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
            conn.rollback()
        return JSONResponse({"status": "ok", "database": state.engine.dialect.name, "private": state.private})

    @app.get("/metrics", summary="Prometheus metrics (text exposition format)")
    def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
