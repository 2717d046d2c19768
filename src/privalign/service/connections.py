"""Connection-level defences of ``privalign serve``: what uvicorn 0.54 does not do by itself.

uvicorn's HTTP/1.1 protocol (h11; httptools is not a dependency) times a connection out only in the
keep-alive wait *after* a response (``timeout_keep_alive``): a connection that sends nothing, or part of
its headers, is never closed, and any byte cancels the keep-alive timer. ``limit_concurrency`` counts open
**connections** as well as running requests, so idle sockets alone make every request, ``/healthz``
included, a ``text/plain`` 503 without ``Retry-After``. ``h11_max_incomplete_event_size`` bounds the size
of a header block, not the time it takes. uvicorn starts the app as soon as a request's headers are in,
while its body may still be arriving. So the service runs uvicorn with ``limit_concurrency=None``, its own
protocol class (:func:`guarded_protocol`, a subclass of uvicorn's ``H11Protocol``), its own server class
(:class:`GuardedServer`) and the app wrapped in :class:`BodyFirst`, which add:

* a **header deadline**: a request's header block must be complete within ``server.header_timeout_s`` of
  the connection opening or of the previous response; else the connection is closed (with an
  OpenAI-shaped 408 if part of a request had arrived);
* a **body deadline and minimum body rate**: the body must be complete within ``server.body_timeout_s`` of
  its headers, and from :data:`BODY_GRACE_S` after them on it must keep up with
  ``server.min_body_bytes_per_s``; else the connection is closed;
* **bodies first** (:class:`BodyFirst`): the app sees a request only once its body is in (up to 64 KiB;
  a longer body is streamed after that), so a request whose body never completes never enters the app:
  it is not in flight, nothing is reserved, nothing is logged;
* **caps on requests waiting for their body** (``server.max_body_waiting_per_ip``,
  ``server.max_body_waiting``): beyond a cap the *oldest* body-waiting request of that address (of any
  address) is closed, so slow or half-open bodies cannot hold capacity that others need;
* **per-address and total connection caps with idle eviction** (:class:`ConnectionGuard`): a new
  connection beyond ``server.max_connections_per_ip`` (or ``server.max_connections``) closes an *idle*
  connection of that address (of any address), one that is waiting for headers or in keep-alive, never
  one whose request is running: the oldest that never completed a request (silent and slowloris sockets)
  before any keep-alive connection of a client that did. Only if every such connection is busy is the
  newcomer refused: its request gets an OpenAI-shaped 429 (per address) or 503 (in total) with
  ``Retry-After`` and the connection is closed;
* a **per-address connection rate** (``server.connection_rate_per_ip`` new connections per second, 2 s
  of it banked): a connection beyond it is dropped as soon as it is accepted (reset, nothing set up,
  nothing evicted), so a client that reopens whatever the server closes cannot turn eviction into a
  loop that the server pays for;
* a **bounded accept batch** (:class:`GuardedServer`): asyncio accepts at most :data:`ACCEPT_BATCH`
  connections per event-loop tick (the kernel queues up to :data:`LISTEN_BACKLOG`), so a connect flood
  cannot queue thousands of accepts ahead of the requests of established connections.

A client that holds hundreds of idle, slow or half-open sockets therefore keeps at most the caps open and
cannot lock anyone out; what such attacks still cost the tenants is measured in BENCHMARKS.md ("the soak
under attack"). Requests in flight are limited by the ASGI middleware :class:`InFlightLimit` (total and
per address, counted once the body is complete, with slots kept for keys this process has
authenticated; ``/healthz``, ``/readyz`` and ``/metrics`` are exempt); :class:`ServerLoad` is what
``/readyz`` reports. Per-key limits are in :mod:`.fairness`.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "ACCEPT_BATCH",
    "BodyFirst",
    "ConnectionGuard",
    "GuardSettings",
    "GuardedServer",
    "LISTEN_BACKLOG",
    "InFlightLimit",
    "ServerLoad",
    "bearer_token",
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


def bearer_token(scope: dict) -> str | None:
    """The bearer token of an ASGI request's ``Authorization`` header, or ``None``."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            return value[7:].strip().decode("latin-1") if value[:7].lower() == b"bearer " else None
    return None


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


#: Connections asyncio accepts per event-loop tick (it accepts up to its ``backlog`` argument per tick, and
#: each costs a task, a transport and a protocol): a connect flood then cannot queue thousands of accepts
#: ahead of the established connections' requests; the rest wait in the kernel's queue.
ACCEPT_BATCH = 16
#: The kernel's queue of connections not yet accepted (``listen``), set after asyncio's ``listen``.
LISTEN_BACKLOG = 2048

#: A request body may arrive slower than ``min_body_bytes_per_s`` during its first second.
BODY_GRACE_S = 1.0


@dataclass(frozen=True)
class GuardSettings:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096
    max_connections_per_ip: int = 64
    refuse_grace_s: float = 2.0  # a refused connection has this long to send its request and read the 429
    max_body_waiting: int = 256  # requests whose body is still arriving, in total (oldest closed beyond)
    max_body_waiting_per_ip: int = 16  # per client address (that address's oldest closed beyond)
    min_body_bytes_per_s: float = 1024.0  # after BODY_GRACE_S, a slower body closes its connection
    connection_rate_per_ip: float = 64.0  # new connections per second per address (burst: 2 s worth)


class ConnectionGuard:
    """The open connections of one server, by client address, oldest first (event-loop thread only).

    ``counter(reason)`` is called for every eviction or refusal (the app's metrics).
    """

    def __init__(self, settings: GuardSettings, counter: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.by_ip: dict[str, OrderedDict[Any, None]] = {}
        self.all: OrderedDict[Any, None] = OrderedDict()
        self.uploading: OrderedDict[Any, None] = OrderedDict()  # requests whose body arrives, oldest first
        self.uploading_by_ip: dict[str, OrderedDict[Any, None]] = {}
        self._rate: dict[str, tuple[float, float]] = {}  # address -> (connection tokens, at)
        self.counter = counter or (lambda _reason: None)

    def rate_ok(self, ip: str, now: float) -> bool:
        """Take one token of ``ip``'s connection bucket (``connection_rate_per_ip`` per second, at most 2 s
        worth banked); ``False`` if it is empty (the connection is then dropped, evicting nothing)."""
        rate = self.settings.connection_rate_per_ip
        if rate <= 0 or not ip:
            return True
        burst = max(1.0, 2.0 * rate)
        tokens, at = self._rate.get(ip, (burst, now))
        tokens = min(burst, tokens + (now - at) * rate)
        if tokens < 1.0:
            self._rate[ip] = (tokens, now)
            return False
        self._rate[ip] = (tokens - 1.0, now)
        if len(self._rate) > 65_536:  # forget full buckets (addresses gone quiet)
            for k in [k for k, (t, a) in self._rate.items() if t + (now - a) * rate >= burst]:
                del self._rate[k]
        return True

    def body_started(self, proto: Any, ip: str) -> None:
        """``proto``'s request has its headers and awaits its body: register it, closing the oldest
        body-waiting request of ``ip`` (of any address) if ``max_body_waiting_per_ip``
        (``max_body_waiting``) is reached. Such a request holds nothing: it is not in flight, and the app
        sees a disconnect before anything is reserved."""
        s = self.settings
        mine = self.uploading_by_ip.get(ip)
        if s.max_body_waiting_per_ip and mine is not None and len(mine) >= s.max_body_waiting_per_ip:
            self.counter("body_waiting_per_ip")
            next(iter(mine)).drop_upload()
        if s.max_body_waiting and len(self.uploading) >= s.max_body_waiting:
            self.counter("body_waiting_total")
            next(iter(self.uploading)).drop_upload()
        self.uploading_by_ip.setdefault(ip, OrderedDict())[proto] = None
        self.uploading[proto] = None

    def body_ended(self, proto: Any, ip: str) -> None:
        if self.uploading.pop(proto, 0) is None:
            mine = self.uploading_by_ip[ip]
            mine.pop(proto, None)
            if not mine:
                del self.uploading_by_ip[ip]

    def load(self) -> dict[str, int]:
        """Open connections and requests whose body is arriving (``/readyz``)."""
        return {"connections": len(self.all), "body_waiting": len(self.uploading)}

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # uvicorn's set-up (an h11 connection and more) waits for connection_made's rate check
        self._init_args, self._dropped = (args, kwargs), False
        self.loop = kwargs.get("_loop") or asyncio.get_event_loop()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.guard.rate_ok(ip, self.loop.time()):
            # over the address's connection rate: dropped before anything is set up or evicted, so a
            # client that reopens what the server closes cannot make the server churn faster
            self._dropped = True
            self.guard.counter("connection_rate_per_ip")
            transport.abort()
            return
        args, kwargs = self._init_args
        H11Protocol.__init__(self, *args, **kwargs)
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._uploading = False
        self._body_start = 0.0
        self._body_bytes = 0
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
        if self._dropped:
            return
        self._disarm()
        if getattr(self, "_uploading", False):
            self._end_upload()
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

    def _body_check(self) -> None:
        """The body deadline and the minimum body rate: close the connection (the app sees
        ``http.disconnect`` before anything is reserved) if the body is not complete within
        ``body_timeout_s`` of its headers, or if fewer than ``min_body_bytes_per_s × (t − BODY_GRACE_S)``
        of its bytes have arrived ``t`` seconds after them; else check again when it would fall behind."""
        self._deadline = None
        if self.transport.is_closing() or not self._uploading:
            return
        s = self.guard.settings
        elapsed = self.loop.time() - self._body_start
        rate = s.min_body_bytes_per_s
        if elapsed >= s.body_timeout_s:
            reason = "body_timeout"
        elif rate > 0 and not self.flow.read_paused and self._body_bytes < rate * (elapsed - BODY_GRACE_S):
            reason = "body_too_slow"  # (not while the server itself has paused reading: flow control)
        else:
            behind = BODY_GRACE_S + (self._body_bytes + 1) / rate if rate > 0 else math.inf
            self._arm(max(0.05, min(s.body_timeout_s, behind) - elapsed), self._body_check)
            return
        self.guard.counter(reason)
        self._end_upload()
        self.transport.close()

    def _end_upload(self) -> None:
        self._uploading = False
        self.guard.body_ended(self, self.client_ip)

    def drop_upload(self) -> None:
        """Close this connection, whose request body is still arriving (a body-waiting cap was reached)."""
        self._end_upload()
        self.evict()

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
            if self._uploading:
                self._body_bytes += len(data)
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is None or self.transport.is_closing():
            return
        if self.cycle is not cycle:  # a new request's headers arrived: its body is due, or it is complete
            if self.conn.their_state is h11.SEND_BODY:
                self._uploading, self._body_start, self._body_bytes = True, self.loop.time(), 0
                self.guard.body_started(self, self.client_ip)
                s = self.guard.settings
                first = min(s.body_timeout_s, BODY_GRACE_S if s.min_body_bytes_per_s > 0 else math.inf)
                self._arm(first, self._body_check)
            else:
                self._disarm()
        elif self._uploading and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the body is complete (or the request was answered without it)
            self._end_upload()

    def on_response_complete(self) -> None:
        self.served += 1
        if self._uploading:  # answered before its body was read (413, a cached key's 429)
            self._disarm()
            self._end_upload()
        super().on_response_complete()
        if self._admitted and not self.transport.is_closing():
            # the next request's headers are due within the header deadline (uvicorn's keep-alive timer
            # closes an idle connection earlier; any byte cancels that timer, never this one)
            self._got_bytes = False
            self._arm(self.guard.settings.header_timeout_s, self._header_timeout)


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` bound to ``guard``."""
    return type("GuardedH11Protocol", (_GuardedH11,), {"guard": guard})


class BodyFirst:
    """Pure ASGI wrapper around the whole app (``privalign serve`` runs it outermost): a ``POST``, ``PUT``
    or ``PATCH`` request's body, up to ``preread`` bytes, is received **before** the app sees the request.
    A request whose client leaves (or is closed by the body deadline, the minimum body rate or a
    body-waiting cap) before its body arrives therefore never enters the app: no middleware, no log line,
    nothing counted in flight or reserved, so slow or half-open bodies cost the server next to nothing.
    A longer body is handed on after ``preread`` bytes, the rest streamed as usual."""

    def __init__(self, app: Any, preread: int = 65536) -> None:
        self.app, self.preread = app, preread

    async def __call__(self, scope, receive, send):  # noqa: ANN001
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        size, more = 0, True
        while more and size <= self.preread:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None  # gone before its body arrived: uvicorn answers nobody, logs nothing
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = msg.get("more_body", False)
        first: dict | None = {"type": "http.request", "body": b"".join(chunks), "more_body": more}

        async def replay():  # noqa: ANN202
            nonlocal first
            if first is not None:
                msg, first = first, None
                return msg
            return await receive()

        return await self.app(scope, replay, send)


class ServerLoad:
    """What ``/readyz`` reports: requests in flight (set by :class:`InFlightLimit`) and, under ``privalign
    serve``, the open connections and body-waiting requests of its :class:`ConnectionGuard`."""

    def __init__(self) -> None:
        self.in_flight: InFlightLimit | None = None
        self.guard: ConnectionGuard | None = None

    def snapshot(self) -> dict[str, Any]:
        """``{"in_flight", "max_in_flight", ["connections", "body_waiting"], "saturated"}``: saturated when
        the requests in flight are at ``max_in_flight`` (a new one would be refused 503)."""
        lim = self.in_flight
        out: dict[str, Any] = {
            "in_flight": lim.running if lim else 0,
            "max_in_flight": lim.total if lim else 0,
        }
        if self.guard is not None:
            out.update(self.guard.load())
        out["saturated"] = bool(lim and lim.total and lim.running >= lim.total)
        return out


class InFlightLimit:
    """Pure ASGI middleware: at most ``total`` requests in flight (503) and ``per_ip`` per client address
    (429), each with ``Retry-After: 1``; :data:`EXEMPT_PATHS` pass. 0 disables a limit.

    It sits inside the body limit, so a request counts only once its **body is complete** (a slow body
    holds no slot; :class:`ConnectionGuard` bounds such requests). ``reserved`` of the ``total`` slots (at
    most half of them) are kept for requests whose bearer token ``known_key(scope)`` recognises (a key this
    process has authenticated): requests without one are refused 503 once ``total - reserved`` are in
    flight, so a first request of a new key still gets in.
    """

    def __init__(
        self,
        app: Any,
        total: int,
        per_ip: int,
        counter: Callable[[str], None] | None = None,
        *,
        reserved: int = 0,
        known_key: Callable[[dict], bool] | None = None,
        load: ServerLoad | None = None,
    ) -> None:
        self.app, self.total, self.per_ip = app, total, per_ip
        self.reserved = min(reserved, total // 2)  # at most half: unknown keys must still get in
        self.known_key = known_key
        self.counter = counter or (lambda _reason: None)
        self.running = 0
        self.by_ip: dict[str, int] = {}
        if load is not None:
            load.in_flight = self

    async def __call__(self, scope, receive, send):  # noqa: ANN001
        if scope["type"] != "http" or scope.get("path") in EXEMPT_PATHS:
            return await self.app(scope, receive, send)
        ip = (scope.get("client") or ("",))[0]
        refuse: tuple[int, str, str] | None = None
        if self.total and self.running >= self.total - self.reserved:
            if self.running >= self.total or self.known_key is None or not self.known_key(scope):
                refuse = (
                    503,
                    "The server is at its limit of requests in flight; retry shortly.",
                    "server_overloaded",
                )
        if refuse is None and self.per_ip and self.by_ip.get(ip, 0) >= self.per_ip:
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


class GuardedServer(uvicorn.Server):
    """``uvicorn.Server`` whose listening sockets queue :data:`LISTEN_BACKLOG` connections in the kernel
    while the loop accepts at most ``config.backlog`` (:data:`ACCEPT_BATCH` under
    :func:`privalign.service.server.uvicorn_config`) per tick: asyncio uses one number for both."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in getattr(self, "servers", []):
            for ts in server.sockets:
                dup = socket.fromfd(ts.fileno(), ts.family, ts.type)
                try:
                    dup.listen(LISTEN_BACKLOG)
                finally:
                    dup.close()
