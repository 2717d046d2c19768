"""Connection-level defences of ``privalign serve``: what uvicorn 0.54 does not do by itself.

uvicorn's HTTP/1.1 protocol (h11; httptools is not a dependency) times a connection out only in the
keep-alive wait *after* a response (``timeout_keep_alive``): a connection that sends nothing, or part of
its headers, is never closed, and any byte cancels the keep-alive timer. ``limit_concurrency`` counts open
**connections** as well as running requests, so idle sockets alone make every request, ``/healthz``
included, a ``text/plain`` 503 without ``Retry-After``. ``h11_max_incomplete_event_size`` bounds the size
of a header block, not the time it takes. So the service runs uvicorn with ``limit_concurrency=None`` and
its own protocol class, :func:`guarded_protocol` (a subclass of uvicorn's ``H11Protocol``), which adds:

* a **header deadline**: a request's header block must be complete within ``server.header_timeout_s`` of
  the connection opening or of the previous response; else the connection is closed (with an
  OpenAI-shaped 408 if part of a request had arrived);
* a **body deadline**: the body must be complete within ``server.body_timeout_s`` of its headers; else the
  connection is closed (the app sees a disconnect before anything is reserved);
* **per-address and total connection caps with idle eviction** (:class:`ConnectionGuard`): a new
  connection beyond ``server.max_connections_per_ip`` (or ``server.max_connections``) closes an *idle*
  connection of that address (of any address), one that is waiting for headers or in keep-alive, never
  one whose request is running: the oldest that never completed a request (silent and slowloris sockets)
  before any keep-alive connection of a client that did. Only if every such connection is busy is the
  newcomer refused: its request gets an OpenAI-shaped 429 (per address) or 503 (in total) with
  ``Retry-After`` and the connection is closed. A client that holds hundreds of idle sockets therefore
  keeps at most the cap open and cannot lock anyone out.

Requests in flight are limited by the ASGI middleware :class:`InFlightLimit` (total and per address;
``/healthz``, ``/readyz`` and ``/metrics`` are exempt). Per-key limits are in :mod:`.fairness`.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "ConnectionGuard",
    "GuardSettings",
    "InFlightLimit",
    "guarded_protocol",
    "overload_body",
    "EXEMPT_PATHS",
]

#: Paths that no overload limit applies to: cheap, unauthenticated operations that must keep answering.
EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def overload_body(status: int, message: str, code: str) -> dict:
    """OpenAI's error shape for an overload refusal: ``{"error": {"message", "type", "param", "code"}}``."""
    type_ = "rate_limit_error" if status == 429 else "service_unavailable" if status == 503 else "timeout"
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _raw_response(status: int, message: str, code: str, retry_after: int | None) -> bytes:
    """A complete HTTP/1.1 response with ``connection: close`` (written to a transport directly)."""
    body = json.dumps(overload_body(status, message, code)).encode()
    reason = {408: b"Request Timeout", 429: b"Too Many Requests", 503: b"Service Unavailable"}[status]
    head = [
        b"HTTP/1.1 %d %s" % (status, reason),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    if retry_after is not None:
        head += [b"retry-after: %d" % retry_after, b"x-should-retry: true"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


@dataclass(frozen=True)
class GuardSettings:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096
    max_connections_per_ip: int = 64
    refuse_grace_s: float = 2.0  # a refused connection has this long to send its request and read the 429


class ConnectionGuard:
    """The open connections of one server, by client address, oldest first (event-loop thread only).

    ``counter(reason)`` is called for every eviction or refusal (the app's metrics).
    """

    def __init__(self, settings: GuardSettings, counter: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.by_ip: dict[str, OrderedDict[Any, None]] = {}
        self.all: OrderedDict[Any, None] = OrderedDict()
        self.counter = counter or (lambda _reason: None)

    def admit(self, proto: Any, ip: str) -> tuple[int, str] | None:
        """Register ``proto``; evict an idle connection if a cap is reached. Returns ``None`` (admitted), or
        ``(status, code)`` if the newcomer must be refused (every connection over the cap is busy)."""
        s = self.settings
        mine = self.by_ip.get(ip)
        if s.max_connections_per_ip and mine is not None and len(mine) >= s.max_connections_per_ip:
            if not self._evict(mine):
                self.counter("connections_per_ip")
                return 429, "too_many_connections"
            self.counter("evicted_idle_per_ip")
        if s.max_connections and len(self.all) >= s.max_connections:
            if not self._evict(self.all):
                self.counter("connections_total")
                return 503, "server_overloaded"
            self.counter("evicted_idle_total")
        self.by_ip.setdefault(ip, OrderedDict())[proto] = None
        self.all[proto] = None
        return None

    def _evict(self, conns: OrderedDict[Any, None]) -> bool:
        """Close one idle connection of ``conns``, in this order of preference: the oldest that has never
        completed a request and is at least 1 s old (a silent or slowloris socket; a well-behaved client
        sends its request at once), else the oldest that has never completed a request, else the oldest
        idle one (a keep-alive connection)."""
        now = asyncio.get_running_loop().time() if conns else 0.0
        tiers: list[Any] = [None, None, None]
        for p in conns:  # oldest first
            if not p.idle():
                continue
            fresh = p.served == 0
            if fresh and now - p.opened >= 1.0:
                tiers[0] = p
                break
            if fresh and tiers[1] is None:
                tiers[1] = p
            elif tiers[2] is None:
                tiers[2] = p
        victim = next((p for p in tiers if p is not None), None)
        if victim is None:
            return False
        self.release(victim, victim.client_ip)  # now: its connection_lost comes later
        victim.evict()
        return True

    def release(self, proto: Any, ip: str) -> None:
        self.all.pop(proto, None)
        mine = self.by_ip.get(ip)
        if mine is not None:
            mine.pop(proto, None)
            if not mine:
                del self.by_ip[ip]


def _refusal_app(status: int, message: str, code: str, close: bool = False) -> Any:
    """An ASGI app that answers every request with the overload refusal (``Retry-After: 1``)."""
    body = json.dumps(overload_body(status, message, code)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"x-should-retry", b"true"),
    ] + ([(b"connection", b"close")] if close else [])

    async def app(scope, receive, send):  # noqa: ANN001
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": headers,
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with header/body deadlines and the connection caps of ``guard``."""

    guard: ConnectionGuard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._got_bytes = False
        self.opened = self.loop.time()
        self.served = 0  # requests completed on this connection
        self.client_ip = self.client[0] if self.client else ""
        refused = self.guard.admit(self, self.client_ip)
        self._admitted = refused is None
        if refused is None:
            self._arm(self.guard.settings.header_timeout_s, self._header_timeout)
        else:
            status, code = refused
            what = "this client address" if status == 429 else "this server"
            self.app = _refusal_app(
                status,
                f"Too many open connections from {what}; close idle connections and retry.",
                code,
                True,
            )
            self._arm(
                min(self.guard.settings.refuse_grace_s, self.guard.settings.header_timeout_s), self.evict
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if getattr(self, "_admitted", False):
            self.guard.release(self, self.client_ip)
        super().connection_lost(exc)

    # -- deadlines -----------------------------------------------------------------------------
    def _arm(self, seconds: float, fn: Callable[[], None]) -> None:
        self._disarm()
        if seconds > 0 and math.isfinite(seconds):
            self._deadline = self.loop.call_later(seconds, fn)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()  # type: ignore[union-attr]
            self._deadline = None

    def _header_timeout(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or not self.idle():
            return
        self.guard.counter("header_timeout")
        if self._got_bytes:  # part of a request arrived: say why it is closed
            self.transport.write(
                _raw_response(408, "The request headers were not received in time.", "header_timeout", None)
            )
        self.transport.close()

    def _body_timeout(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.guard.counter("body_timeout")
            self.transport.close()  # the app sees http.disconnect before anything is reserved

    # -- state ---------------------------------------------------------------------------------
    def idle(self) -> bool:
        """No request is running on this connection (waiting for headers, or in keep-alive)."""
        return self.cycle is None or self.cycle.response_complete

    def evict(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    # -- hooks ---------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if data:
            self._got_bytes = True
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is None or self.transport.is_closing():
            return
        if self.cycle is not cycle:  # a new request's headers arrived: its body is due, or it is complete
            if self.conn.their_state is h11.SEND_BODY:
                self._arm(self.guard.settings.body_timeout_s, self._body_timeout)
            else:
                self._disarm()
        elif not self.cycle.response_complete and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the body is complete

    def on_response_complete(self) -> None:
        self.served += 1
        super().on_response_complete()
        if self._admitted and not self.transport.is_closing():
            # the next request's headers are due within the header deadline (uvicorn's keep-alive timer
            # closes an idle connection earlier; any byte cancels that timer, never this one)
            self._got_bytes = False
            self._arm(self.guard.settings.header_timeout_s, self._header_timeout)


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` bound to ``guard``."""
    return type("GuardedH11Protocol", (_GuardedH11,), {"guard": guard})


class InFlightLimit:
    """Pure ASGI middleware: at most ``total`` requests in flight (503) and ``per_ip`` per client address
    (429), each with ``Retry-After: 1``; :data:`EXEMPT_PATHS` pass. 0 disables a limit."""

    def __init__(
        self, app: Any, total: int, per_ip: int, counter: Callable[[str], None] | None = None
    ) -> None:
        self.app, self.total, self.per_ip = app, total, per_ip
        self.counter = counter or (lambda _reason: None)
        self.running = 0
        self.by_ip: dict[str, int] = {}

    async def __call__(self, scope, receive, send):  # noqa: ANN001
        if scope["type"] != "http" or scope.get("path") in EXEMPT_PATHS:
            return await self.app(scope, receive, send)
        ip = (scope.get("client") or ("",))[0]
        refuse: tuple[int, str, str] | None = None
        if self.total and self.running >= self.total:
            refuse = (
                503,
                "The server is at its limit of requests in flight; retry shortly.",
                "server_overloaded",
            )
        elif self.per_ip and self.by_ip.get(ip, 0) >= self.per_ip:
            refuse = (
                429,
                f"Too many requests in flight from this client address (limit {self.per_ip}).",
                "too_many_concurrent_requests",
            )
        if refuse is not None:
            self.counter(refuse[2])
            return await _refusal_app(*refuse)(scope, receive, send)
        self.running += 1
        self.by_ip[ip] = self.by_ip.get(ip, 0) + 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.running -= 1
            left = self.by_ip[ip] - 1
            if left:
                self.by_ip[ip] = left
            else:
                del self.by_ip[ip]
