"""HTTP routers: the OpenAI-compatible endpoints, ``/v1/select``, ``/v1/budget`` and the operational
endpoints. No SQL here: the routers validate, authenticate, call :func:`privalign.service.pipeline.run`
and the store's idempotency operations, and send the encoded answer."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from privalign.alignment.base import CandidateLayout
from privalign.alignment.selectors import method_class, methods
from privalign.service import pipeline, streaming
from privalign.service.errors import ApiError
from privalign.service.keys import KeyInfo, authenticate
from privalign.service.metrics import CONTENT_TYPE_LATEST
from privalign.service.plan import make_plan
from privalign.service.schemas import (
    UNSUPPORTED_OPENAI_PARAMS,
    ChatCompletionRequest,
    CompletionRequest,
    SelectRequest,
    _OpenAIBase,
)
from privalign.service.store import IdempotencyConflict, IdempotencyMismatch

__all__ = ["openai_router", "select_router", "ops_router", "served_model"]

openai_router = APIRouter()
select_router = APIRouter()
ops_router = APIRouter()


def _state(request: Request) -> pipeline.ServiceState:
    return request.app.state.service


def _bearer(authorization: str | None) -> str | None:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def _auth(state: pipeline.ServiceState, authorization: str | None) -> KeyInfo:
    key = authenticate(state.store, _bearer(authorization), cache=state.key_cache)
    if key is None:
        raise ApiError(401, "authentication_error", "Missing, unknown or revoked API key.")
    return key


def _check_text(state: pipeline.ServiceState, text: str, name: str) -> None:
    lim = state.cfg.limits.max_text_chars
    if len(text) > lim:
        raise ApiError(
            400,
            "invalid_request_error",
            f"The '{name}' parameter must have at most {lim} characters. Got {len(text)}.",
            param=name,
        )


def _send(out: pipeline.Outcome, after: Any = None, headers: dict[str, str] | None = None) -> Response:
    return Response(
        out.content,
        media_type=out.media_type,
        headers=headers,
        background=None if after is None else BackgroundTask(after),
    )


async def _raw_body(request: Request) -> bytes:
    """The request's body as received (already read and cached by FastAPI): what an Idempotency-Key's
    request hash covers. Hashing the bytes, not a re-encoding of the parsed body, means no value the
    schema lets through (a lone surrogate in an extra key, a deeply nested ``stream_options``) can make
    the idempotent path fail."""
    return await request.body()


def _handle(
    state: pipeline.ServiceState,
    job: pipeline.Job,
    raw: bytes,
    authorization: str | None,
    idem_key: str | None,
) -> Response:
    """Authenticate, apply idempotency, run the path, settle after (or, with an Idempotency-Key, before)
    the answer."""
    cfg = state.cfg
    if not state.private:
        out = pipeline.run(state, KeyInfo("baseline", "", "pure", 0.0, None), job)
        return _send(out)
    if not idem_key and job.plan.mech.private:
        # A key this process has authenticated before: its secret is checked against the remembered hash
        # and the reserving statement checks that the key is still active (one round trip fewer).
        cached = state.key_cache.verify(_bearer(authorization))
        if cached is not None:
            out = pipeline.run(state, cached, job, reauth=lambda: _auth(state, authorization))
            return _send(out, state.settle_later(*out.settle) if out.settle else None)
    key = _auth(state, authorization)
    if not idem_key:
        out = pipeline.run(state, key, job)
        return _send(out, state.settle_later(*out.settle) if out.settle else None)
    if len(idem_key) > 200:
        raise ApiError(
            400,
            "invalid_request_error",
            "The 'Idempotency-Key' header must have at most 200 characters.",
            param="Idempotency-Key",
        )
    req_hash = hashlib.sha256(job.endpoint.encode() + b"\n" + raw).hexdigest()
    # An attempt younger than privacy.reconcile_after_s may still be running: a retry that meets it is
    # told to retry (409 idempotency_in_progress); after it, the attempt is over (see idempotency_begin).
    window = cfg.privacy.reconcile_after_s
    attempt = uuid.uuid4().hex  # the id this attempt reserves under, recorded on its pending row
    until = time.monotonic() + window - 1.0  # storing this attempt's answer is retried until then
    try:
        stored = state.store.idempotency_begin(
            key.key_id,
            idem_key,
            req_hash,
            ttl_s=cfg.limits.idempotency_ttl_s,
            reservation_id=attempt,
            stale_after_s=window,
            in_progress_s=window,
        )
    except IdempotencyConflict as exc:
        raise _conflict(exc) from None
    except IdempotencyMismatch as exc:
        raise ApiError(
            422, "invalid_request_error", str(exc), param="Idempotency-Key", code="idempotency_key_reused"
        ) from None
    if stored is not None:
        return _replay(*stored)
    stash = _Stash(state, key.key_id, idem_key, attempt, until)
    try:
        out = pipeline.run(state, key, job, reservation_id=attempt)
    except ApiError as exc:
        if not exc.charged:  # nothing was charged: the client may retry with the same key
            _forget_attempt(state, key.key_id, idem_key, attempt)
        else:  # charged without an answer: this error is the key's answer (replayed, never run again)
            stash.store(exc.status, bytes(JSONResponse(exc.body()).body).decode("utf-8"), None)
        raise
    if out.settle is not None:
        _, rid, units, ev = out.settle
        try:
            state.store.settle(rid, units=units, event=ev)
        except Exception as exc:  # noqa: BLE001 - the reservation stays charged at its reserved cost (reconciled)
            state.metrics.settle_failures.inc()
            pipeline.log.error(
                "settle failed (%s); the reservation stays charged at its reserved cost; the answer is "
                "stored and sent",
                type(exc).__name__,
            )
    stash.store(200, out.content.decode("utf-8"), out.reservation_id)
    return _send(out)


def _conflict(exc: IdempotencyConflict) -> ApiError:
    """The 409 for a pending attempt: ``idempotency_in_progress`` (retry; the stored answer is replayed
    once the attempt stores it) or, final, ``idempotency_answer_lost`` (send a new key)."""
    if exc.final:
        return ApiError(
            409,
            "conflict_error",
            str(exc),
            retry=False,
            param="Idempotency-Key",
            code="idempotency_answer_lost",
        )
    return ApiError(
        409,
        "conflict_error",
        str(exc),
        retry=True,
        headers={"Retry-After": "1"},
        param="Idempotency-Key",
        code="idempotency_in_progress",
    )


def _replay(status: int, text: str) -> Response:
    """A stored answer, sent again (never charged again). A stored error is a charged one: no retry."""
    headers = {"Idempotent-Replayed": "true"}
    if status >= 400:
        headers["x-should-retry"] = "false"
    media = "text/event-stream" if text.startswith("data:") else "application/json"
    return Response(text.encode("utf-8"), status_code=status, media_type=media, headers=headers)


#: At most this many answers are retried in the background at once (a database outage under load must not
#: start a thread per request).
_STASHERS = threading.BoundedSemaphore(64)


class _Stash:
    """Stores an attempt's answer under its Idempotency-Key. If the database fails, storing is retried in
    a background thread until ``until`` (monotonic; the end of the attempt's in-progress window), so that
    the replay becomes reachable once the database is back; meanwhile a retry with the key is answered
    409 ``idempotency_in_progress``, and after the window 409 ``idempotency_answer_lost``."""

    def __init__(self, state: pipeline.ServiceState, key_id: str, idem_key: str, attempt: str, until: float):
        self.state, self.key_id, self.idem_key, self.attempt, self.until = (
            state,
            key_id,
            idem_key,
            attempt,
            until,
        )

    def _finish(self, status: int, text: str, reservation_id: str | None) -> None:
        self.state.store.idempotency_finish(
            self.key_id,
            self.idem_key,
            status_code=status,
            response=text,
            reservation_id=reservation_id,
            ttl_s=self.state.cfg.limits.idempotency_ttl_s,
            attempt=self.attempt,
        )

    def store(self, status: int, text: str, reservation_id: str | None) -> None:
        try:
            self._finish(status, text, reservation_id)
        except Exception as exc:  # noqa: BLE001 - a database error: retried in the background
            self.state.metrics.db_errors.inc()
            pipeline.log.error(
                "storing an Idempotency-Key answer failed (%s); retrying in the background",
                type(exc).__name__,
            )
            if not _STASHERS.acquire(blocking=False):
                pipeline.log.error("too many answers waiting to be stored; this one is not retried")
                return
            threading.Thread(
                target=self._retry, args=(status, text, reservation_id), daemon=True, name="privalign-stash"
            ).start()

    def _retry(self, status: int, text: str, reservation_id: str | None) -> None:
        try:
            self._retry_until(status, text, reservation_id)
        finally:
            _STASHERS.release()

    def _retry_until(self, status: int, text: str, reservation_id: str | None) -> None:
        delay, tries = 0.25, 1
        while time.monotonic() + delay < self.until:
            time.sleep(delay)
            tries += 1
            try:
                self._finish(status, text, reservation_id)
            except Exception as exc:  # noqa: BLE001 - still failing
                self.state.metrics.db_errors.inc()
                pipeline.log.warning(
                    "storing an Idempotency-Key answer failed again (%s)", type(exc).__name__
                )
                delay = min(2 * delay, 5.0)
                continue
            pipeline.log.warning("stored an Idempotency-Key answer after %d tries", tries)
            return
        pipeline.log.error(
            "gave up storing an Idempotency-Key answer after %d tries; a retry with its key is answered 409 "
            "idempotency_answer_lost",
            tries,
        )


def _forget_attempt(state: pipeline.ServiceState, key_id: str, idem_key: str, attempt: str) -> None:
    """Drop the pending row of an attempt that holds no charge. If the database fails here too, the row
    stays: a retry reads the ledger, is told the attempt holds nothing (409, retry later) and takes the
    key over after ``privacy.reconcile_after_s``."""
    try:
        state.store.idempotency_finish(
            key_id, idem_key, status_code=None, response=None, reservation_id=None, ttl_s=0.0, attempt=attempt
        )
    except Exception as exc:  # noqa: BLE001 - answer the original error
        state.metrics.db_errors.inc()
        pipeline.log.error("could not clear an uncharged Idempotency-Key attempt: %s", type(exc).__name__)


# ------------------------------------------------------------------------------------------------
# OpenAI-compatible endpoints
# ------------------------------------------------------------------------------------------------


def _gen_kwargs(state: pipeline.ServiceState, req: _OpenAIBase, chat: bool) -> dict[str, Any]:
    lim = state.cfg.limits
    if req.seed is not None:
        raise ApiError(
            400,
            "invalid_request_error",
            "The 'seed' parameter is not accepted: the service uses secure noise only.",
            param="seed",
            code="unsupported_parameter",
        )
    for name in UNSUPPORTED_OPENAI_PARAMS:
        if getattr(req, name, None) is not None:
            raise ApiError(
                400,
                "invalid_request_error",
                f"The '{name}' parameter is not supported by this server.",
                param=name,
                code="unsupported_parameter",
            )
    if req.n not in (None, 1):
        raise ApiError(
            400,
            "invalid_request_error",
            f"The 'n' parameter must be 1 (one private selection per request; use "
            f"privacy.n for the candidate count). Got {req.n}.",
            param="n",
            code="unsupported_value",
        )
    if req.stream_options is not None and not req.stream:
        raise ApiError(
            400,
            "invalid_request_error",
            "The 'stream_options' parameter needs stream=true.",
            param="stream_options",
        )
    if (
        req.max_tokens is not None
        and req.max_completion_tokens is not None
        and req.max_tokens != req.max_completion_tokens
    ):
        raise ApiError(
            400,
            "invalid_request_error",
            "The 'max_tokens' and 'max_completion_tokens' parameters disagree; set one.",
            param="max_completion_tokens",
        )
    name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    mt = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    mt = min(256, lim.max_tokens) if mt is None else mt
    if mt > lim.max_tokens:
        raise ApiError(
            400,
            "invalid_request_error",
            f"The '{name}' parameter must be at most {lim.max_tokens}. Got {mt}.",
            param=name,
        )
    return {
        "max_tokens": mt,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "chat": chat,
    }


def _include_usage(req: _OpenAIBase) -> bool:
    """``stream_options.include_usage`` (a boolean; other ``stream_options`` fields are ignored)."""
    v = (req.stream_options or {}).get("include_usage", False)
    if not isinstance(v, bool):
        raise ApiError(
            400,
            "invalid_request_error",
            "The 'stream_options.include_usage' parameter must be a boolean.",
            param="stream_options.include_usage",
        )
    return v


def _stream(req: _OpenAIBase, fmt: Callable[..., bytes]) -> Callable[[dict], bytes] | None:
    """The request's stream encoder (``None`` without ``stream: true``), see :mod:`.streaming`."""
    if not req.stream:
        return None
    include_usage = _include_usage(req)
    return lambda body: fmt(body, include_usage=include_usage)


def served_model(state: pipeline.ServiceState) -> str:
    """The id of the one model this server serves: the generator's ``model`` option, else ``privalign``.
    ``GET /v1/models`` lists it and every answer's ``model`` field is it, whatever ``model`` the request
    named (the request's ``model`` selects nothing: there is one model)."""
    opts = state.cfg.generator.options
    return str(opts.get("model") or "privalign") if state.cfg.generator.kind != "none" else "privalign"


@openai_router.get("/v1/models", summary="OpenAI-compatible model list")
def models(request: Request) -> JSONResponse:
    state = _state(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": served_model(state),
                    "object": "model",
                    "created": int(state.started),
                    "owned_by": "privalign",
                }
            ],
        }
    )


@openai_router.post("/v1/chat/completions", summary="OpenAI-compatible chat completion, privately selected")
def chat_completions(
    request: Request,
    body: ChatCompletionRequest,
    authorization: str | None = Header(None),
    idempotency_key: str | None = Header(None),
    raw: bytes = Depends(_raw_body),
) -> Response:
    state = _state(request)
    gk = _gen_kwargs(state, body, True)
    texts = [m.text() for m in body.messages]
    for i, t in enumerate(texts):
        _check_text(state, t, f"messages[{i}].content")
    total = sum(len(t) for t in texts)
    if total > state.cfg.limits.max_text_chars:
        raise ApiError(
            400,
            "invalid_request_error",
            f"The 'messages' parameter must have at most {state.cfg.limits.max_text_chars} "
            f"characters in total. Got {total}.",
            param="messages",
        )
    plan = make_plan(state.cfg, body.privacy, state.cfg.privacy.default_n)
    model = served_model(state)
    msgs = [{"role": m.role, "content": t} for m, t in zip(body.messages, texts, strict=True)]
    score_prompt = "\n".join(f"{m['role']}: {m['content']}" for m in msgs)

    def render(idx: int, text: str, block: dict, finish_reason: str, usage: dict | None) -> dict:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": usage,
            "privacy": block,
        }

    job = pipeline.Job(
        "/v1/chat/completions",
        plan,
        msgs,
        score_prompt,
        None,
        gk,
        render,
        _stream(body, streaming.chat_stream),
    )
    return _handle(state, job, raw, authorization, idempotency_key)


@openai_router.post(
    "/v1/completions", summary="OpenAI-compatible text completion (no chat template), privately selected"
)
def completions(
    request: Request,
    body: CompletionRequest,
    authorization: str | None = Header(None),
    idempotency_key: str | None = Header(None),
    raw: bytes = Depends(_raw_body),
) -> Response:
    state = _state(request)
    gk = _gen_kwargs(state, body, False)
    _check_text(state, body.prompt, "prompt")
    plan = make_plan(state.cfg, body.privacy, state.cfg.privacy.default_n)
    model = served_model(state)

    def render(idx: int, text: str, block: dict, finish_reason: str, usage: dict | None) -> dict:
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}],
            "usage": usage,
            "privacy": block,
        }

    job = pipeline.Job(
        "/v1/completions",
        plan,
        body.prompt,
        body.prompt,
        None,
        gk,
        render,
        _stream(body, streaming.completion_stream),
    )
    return _handle(state, job, raw, authorization, idempotency_key)


# ------------------------------------------------------------------------------------------------
# /v1/select and /v1/budget
# ------------------------------------------------------------------------------------------------


@select_router.post("/v1/select", summary="Privately select one of the client's candidates")
def select_endpoint(
    request: Request,
    body: SelectRequest,
    authorization: str | None = Header(None),
    idempotency_key: str | None = Header(None),
    raw: bytes = Depends(_raw_body),
) -> Response:
    state = _state(request)
    cfg = state.cfg
    _check_text(state, body.prompt, "prompt")
    if len(body.candidates) > cfg.limits.max_n:
        raise ApiError(
            400,
            "invalid_request_error",
            f"The 'candidates' parameter must have at most {cfg.limits.max_n} items. "
            f"Got {len(body.candidates)}.",
            param="candidates",
        )
    for i, c in enumerate(body.candidates):
        _check_text(state, c, f"candidates[{i}]")
    pp = body.privacy
    k = len(body.candidates)
    # the candidate layout of the method make_plan resolves (the request's, else the server's first allowed
    # one): n, or 2n + 1 for the two-pool PrivITP; an unknown method is make_plan's 400
    method = (pp.method if pp is not None else None) or cfg.privacy.allowed_methods[0]
    layout = method_class(method).layout if method in methods() else CandidateLayout()
    n_implied = layout.n_for(k) or 0
    if n_implied < 1 or (pp is not None and pp.n is not None and pp.n != n_implied):
        need = layout.describe()
        raise ApiError(
            400,
            "invalid_request_error",
            f"The 'candidates' parameter must hold {need}; got {k} candidates and "
            f"privacy.n={None if pp is None else pp.n}.",
            param="candidates",
        )
    plan = make_plan(cfg, pp, n_implied, n_implied=True)

    def render(idx: int, text: str, block: dict, finish_reason: str, usage: dict | None) -> dict:
        return {
            "id": f"sel-{uuid.uuid4().hex}",
            "object": "selection",
            "created": int(time.time()),
            "index": idx,
            "text": text,
            "privacy": block,
        }

    job = pipeline.Job("/v1/select", plan, body.prompt, body.prompt, list(body.candidates), {}, render)
    return _handle(state, job, raw, authorization, idempotency_key)


def _request_defaults(state: pipeline.ServiceState) -> dict[str, Any]:
    """What a request that omits privacy fields gets: ``epsilon`` is ``null`` when it must be stated
    (``privacy.require_privacy``), else the ε a request without one spends."""
    pv = state.cfg.privacy
    return {
        "require_privacy": pv.require_privacy,
        "method": pv.allowed_methods[0],
        "epsilon": None if pv.require_privacy else pv.default_epsilon,
        "n": pv.default_n,
    }


@select_router.get("/v1/budget", summary="The calling key's budget and its latest ledger rows (never waits)")
def budget(request: Request, authorization: str | None = Header(None)) -> JSONResponse:
    """The totals of the key's budget as committed now: the key's own budget, or, for a key of a user
    (``user`` is the user's name, else ``null``), the user's budget shared by all of the user's keys, with
    the ledger rows of every one of them. Answers that this process sent but whose settle is not written
    yet count at their reserved cost (``pending_settles`` says how many); the settle follows within
    milliseconds. Field names: ``epsilon`` (``rho`` for zCDP keys) and ``delta``."""
    state = _state(request)
    key = _auth(state, authorization)
    snap = state.store.snapshot(key.principal, units=True) or {}
    rows = state.store.ledger_rows(key.principal, limit=100)
    a = "rho" if key.accounting == "zcdp" else "epsilon"

    def pair(prefix: str) -> dict[str, float]:
        return pipeline.remaining_dict(
            key, (snap.get(f"{prefix}_epsilon", 0), snap.get(f"{prefix}_delta", 0))
        )

    left = (
        max(0, snap.get("limit_epsilon", 0) - snap.get("spent_epsilon", 0) - snap.get("reserved_epsilon", 0)),
        max(0, snap.get("limit_delta", 0) - snap.get("spent_delta", 0) - snap.get("reserved_delta", 0)),
    )
    return JSONResponse(
        {
            "key_id": key.key_id,
            "user": key.user,
            "accounting": key.accounting,
            "unit": a,
            "limit": pair("limit"),
            "spent": pair("spent"),
            "reserved": pair("reserved"),
            "remaining": pipeline.remaining_dict(key, left),
            "pending_settles": state.pending_settles(key.principal),
            "request_defaults": _request_defaults(state),
            "ledger": json.loads(pipeline.encode(rows)),
        }
    )


# ------------------------------------------------------------------------------------------------
# Operations
# ------------------------------------------------------------------------------------------------


async def _ping(state: pipeline.ServiceState) -> Any:
    """The database ping on the operations pool: never queued behind the request thread pool."""
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(state.ops_pool, state.store.ping)


@ops_router.get("/healthz", summary="Liveness and database reachability")
async def healthz(request: Request) -> JSONResponse:
    state = _state(request)
    return JSONResponse(
        {"status": "ok", "database": await _ping(state), "private": state.private, "ready": state.ready}
    )


@ops_router.get(
    "/readyz", summary="Readiness: 200 once the database answers and the generator is warm, else 503"
)
async def readyz(request: Request) -> JSONResponse:
    state = _state(request)
    await _ping(state)
    if not state.ready:
        reason = (
            f"the generator failed to load ({state.warm_error})"
            if state.warm_error
            else "loading the generator"
        )
        return JSONResponse({"ready": False, "reason": reason}, status_code=503, headers={"Retry-After": "5"})
    # saturation (connections.ServerLoad): every request slot taken, so a balancer routes elsewhere
    load = request.app.state.load.snapshot() if hasattr(request.app.state, "load") else {}
    if load.get("saturated"):
        reason = f"saturated: {load['in_flight']} of {load['max_in_flight']} requests in flight"
        return JSONResponse(
            {"ready": False, "reason": reason, "load": load}, status_code=503, headers={"Retry-After": "1"}
        )
    return JSONResponse({"ready": True, "load": load})


@ops_router.get("/metrics", summary="Prometheus metrics (text exposition format)")
def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
