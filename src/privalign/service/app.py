"""The FastAPI application: an OpenAI-compatible private best-of-N service with per-key budgets.

The request path is :mod:`privalign.service.pipeline` (reserve → generate → score → select → charge →
respond, one function per step); the routers are in :mod:`privalign.service.routes`, the request schemas
in :mod:`privalign.service.schemas`, the privacy-parameter checks in :mod:`privalign.service.plan`. This
module assembles them: middleware (body limit, metrics), error handlers (no stack traces; database errors
→ 503 before anything is released), and the routers.

Order of refusals (nothing is charged by any of them): a cached key over its limits 429 (before its body
is read) → body size 413 → requests in flight 503/429 (counted once the body is in) → schema 400 (strict
types, encodable text) → parameters 400 (ranges, methods, seeds) → authentication 401 → idempotency
409/422 → the key's concurrency and rate 429 → budget 429.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from privalign.errors import ReservationError
from privalign.service.config import ServiceConfig
from privalign.service.connections import InFlightLimit, ServerLoad, bearer_token
from privalign.service.errors import ApiError, error_body, validation_code
from privalign.service.fairness import KeyPrecheck
from privalign.service.pipeline import ServiceState
from privalign.service.routes import openai_router, ops_router, select_router

__all__ = ["create_app"]

log = logging.getLogger("privalign.service")


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
            resp = JSONResponse(
                error_body(
                    "invalid_request_error",
                    f"Request body larger than {self.max_bytes} bytes.",
                    code="request_too_large",
                ),
                status_code=413,
            )
            return await resp(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def _db_error_types() -> list[type[Exception]]:
    import sqlite3

    types: list[type[Exception]] = [SQLAlchemyError, sqlite3.Error]
    try:
        import psycopg

        types.append(psycopg.Error)
    except ImportError:  # pragma: no cover - PostgreSQL support is optional
        pass
    return types


def _param_of(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if p == "body":
            continue
        if isinstance(p, int):
            parts[-1:] = [f"{parts[-1]}[{p}]"] if parts else [f"[{p}]"]
        elif "[" in str(p) or str(p) in ("str", "list[ContentPart]"):
            continue  # pydantic's union/validator branch names
        else:
            parts.append(str(p))
    return ".".join(parts)


def create_app(
    cfg: ServiceConfig, *, scorer: Any = None, generator: Any = None, private: bool = True
) -> FastAPI:
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
        version="2",
        description=(
            "OpenAI-compatible completions selected by a differentially private best-of-N over a private "
            "reward model, with per-key privacy budgets. Raw reward scores are never returned."
        ),
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = state
    if cfg.server.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cfg.server.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["*"],
        )
    # requests in flight, in total and per client address, counted once the body is complete (inside the
    # body limit: a slow body holds no slot), with slots kept for keys this process has authenticated
    load = ServerLoad()
    app.state.load = load  # /readyz: requests in flight (and, under privalign serve, connections)
    app.add_middleware(
        InFlightLimit,
        total=cfg.server.max_in_flight,
        per_ip=cfg.server.max_in_flight_per_ip,
        counter=lambda reason: state.metrics.overload.labels(reason).inc(),
        reserved=cfg.server.in_flight_reserved_for_keys if private else 0,
        known_key=lambda scope: state.key_cache.verify(bearer_token(scope)) is not None,
        load=load,
    )
    app.add_middleware(_BodyLimit, max_bytes=cfg.limits.max_body_bytes)
    # a cached key over its limits is refused before its body is read (fairness.KeyPrecheck)
    app.add_middleware(KeyPrecheck, state=state)

    @app.middleware("http")
    async def _observe(request: Request, call_next):  # noqa: ANN001
        t0 = time.perf_counter()
        try:
            response = await call_next(request)
        except RuntimeError as exc:
            if str(exc) != "No response returned.":  # pragma: no cover - would be a bug
                log.exception("unhandled error")
                response = JSONResponse(error_body("internal_error", "Internal error."), status_code=500)
            else:  # the client left before its body arrived (closed, timed out, evicted): nobody to answer,
                # nothing reserved, and no log line (a slow-body attacker must not fill the log)
                response = Response(status_code=499)
        except Exception:  # pragma: no cover - last line of defence: no stack traces to clients
            log.exception("unhandled error")
            response = JSONResponse(error_body("internal_error", "Internal error."), status_code=500)
        route = request.scope.get("route")
        path = route.path if route is not None else "other"
        state.metrics.requests.labels(path, str(response.status_code)).inc()
        state.metrics.latency.labels(path).observe(time.perf_counter() - t0)
        return response

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        return JSONResponse(
            error_body(exc.type, exc.message, **exc.extra),
            status_code=exc.status,
            headers=exc.headers or None,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = _param_of(tuple(first.get("loc", ())))
        msg = str(first.get("msg", "invalid")).encode("utf-8", "replace").decode("utf-8")
        text = f"The '{loc}' parameter is invalid: {msg}." if loc else f"Invalid request body: {msg}."
        code = validation_code(str(first.get("type", "")))
        return JSONResponse(
            error_body("invalid_request_error", text, param=loc or None, code=code), status_code=400
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(
            error_body("invalid_request_error", str(exc.detail), code=code), status_code=exc.status_code
        )

    async def _db(_request: Request, exc: Exception):
        state.metrics.db_errors.inc()
        log.error("database error: %s", type(exc).__name__)
        return JSONResponse(
            error_body("service_unavailable", "The budget database is unavailable; nothing was released."),
            status_code=503,
        )

    for exc_type in _db_error_types():
        app.add_exception_handler(exc_type, _db)

    @app.exception_handler(ReservationError)
    async def _res(_request: Request, exc: ReservationError):  # pragma: no cover - would be a bug
        log.error("reservation error: %s", exc)
        return JSONResponse(
            error_body("internal_error", "Internal accounting error; nothing was released."),
            status_code=500,
            headers={"x-should-retry": "false"},
        )

    @app.exception_handler(Exception)
    async def _any(_request: Request, exc: Exception):
        log.error("unhandled %s", type(exc).__name__, exc_info=exc)
        return JSONResponse(
            error_body("internal_error", "Internal error."),
            status_code=500,
            headers={"x-should-retry": "false"},
        )

    app.include_router(openai_router)
    app.include_router(select_router)
    app.include_router(ops_router)
    return app
