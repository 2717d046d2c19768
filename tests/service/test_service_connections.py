"""Connection-level defences: idle and half-open sockets cannot lock the service out.

Against a real ``privalign serve`` process on 127.0.0.1. Before the fix, uvicorn ran with
``limit_concurrency=512``, which counts open connections: 800 idle sockets made every request, ``/healthz``
included, a ``text/plain`` 503, and nothing ever closed a socket that sent nothing or part of its headers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx

from conftest import write_config
from privalign.service.keys import create_key

N_IDLE = 900


def _config(tmp_path, reward_model, **server):
    return write_config(
        tmp_path / "svc.toml",
        {
            "database": {"url": f"sqlite:///{tmp_path / 'svc.db'}"},
            **({"server": server} if server else {}),
            "privacy": {"allowed_methods": ["privbon"], "default_epsilon": 0.01},
            "reward_model": {"kind": "linear", "path": str(reward_model)},
            "generator": {"kind": "none"},
        },
    )


def _key(tmp_path) -> str:
    from privalign.service import db

    eng = db.make_engine(f"sqlite:///{tmp_path / 'svc.db'}")
    db.create_schema(eng)
    _, tok = create_key(eng, budget_epsilon=10.0)
    eng.dispose()
    return tok


def _open_idle(port: int, n: int) -> list[socket.socket]:
    """``n`` sockets from 127.0.0.1: every other one sends nothing, the others part of a header block."""
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            except OSError:  # dropped by the server's per-address connection rate
                pass
        socks.append(s)
    return socks


def _closed(s: socket.socket) -> bool:
    s.settimeout(0.0)
    try:
        s.recv(65536)  # b"" (FIN), or a 408 answer that a FIN follows
        return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def _timed(fn) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def test_900_idle_and_half_open_sockets_leave_healthz_and_tenants_answering(
    tmp_path, reward_model, server_process
):
    """The default config (no new keys: this test also runs against the old server, where it fails)."""
    srv = server_process(_config(tmp_path, reward_model)).start()
    tok = _key(tmp_path)
    socks = _open_idle(srv.port, N_IDLE)
    try:
        time.sleep(0.5)  # the server has accepted them
        with httpx.Client(timeout=10.0) as c:
            for _ in range(3):
                dt, r = _timed(lambda: c.get(srv.url + "/healthz"))
                assert r.status_code == 200, (r.status_code, r.text[:200])
                assert dt < 2.0, dt
                dt, r = _timed(
                    lambda: c.post(
                        srv.url + "/v1/select",
                        headers={"Authorization": f"Bearer {tok}"},
                        json={
                            "prompt": "q",
                            "candidates": ["a kind reply", "a rude reply"],
                            "privacy": {"method": "privbon", "epsilon": 0.01},
                        },
                    )
                )
                assert r.status_code == 200, (r.status_code, r.text[:200])
                assert dt < 2.0, dt
        # the attacker keeps at most max_connections_per_ip (128) sockets: the oldest idle ones were closed
        assert sum(_closed(s) for s in socks) >= N_IDLE - 128
    finally:
        for s in socks:
            s.close()


def test_the_header_deadline_closes_silent_and_slow_sockets(tmp_path, reward_model, server_process):
    srv = server_process(_config(tmp_path, reward_model, header_timeout_s=1.0, keep_alive_s=30.0)).start()
    socks = _open_idle(srv.port, 20)
    try:
        # keep-alive (30 s) does not close a connection that has sent nothing: the header deadline does
        time.sleep(2.5)
        assert all(_closed(s) for s in socks)
        # a half-open request hears why: an OpenAI-shaped 408
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        s.settimeout(5.0)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), head
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "header_timeout"
        # a request that sends its headers in time is served
        assert httpx.get(srv.url + "/healthz", timeout=5).status_code == 200
    finally:
        for s in socks:
            s.close()


def test_in_flight_limits_answer_in_openai_shape_with_retry_after():
    """The in-flight middleware: a second request from one address beyond ``per_ip`` is a 429, beyond
    ``total`` a 503, each ``{"error": {message, type, param, code}}`` with ``Retry-After``; /healthz
    passes."""
    from privalign.service.connections import InFlightLimit

    gate = asyncio.Event()

    async def slow_app(scope, receive, send):
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def call(mw, path, ip):
        out: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(msg):
            out.append(msg)

        await mw({"type": "http", "path": path, "client": (ip, 1), "headers": []}, receive, send)
        return out

    async def go():
        reasons: list[str] = []
        mw = InFlightLimit(slow_app, total=2, per_ip=1, counter=reasons.append)
        first = asyncio.create_task(call(mw, "/v1/select", "10.0.0.1"))
        await asyncio.sleep(0)
        per_ip = await call(mw, "/v1/select", "10.0.0.1")
        second = asyncio.create_task(call(mw, "/v1/select", "10.0.0.2"))
        await asyncio.sleep(0)
        total = await call(mw, "/v1/select", "10.0.0.3")
        health = asyncio.create_task(call(mw, "/healthz", "10.0.0.1"))
        await asyncio.sleep(0)
        gate.set()
        ok = await asyncio.gather(first, second, health)
        return per_ip, total, ok, reasons

    per_ip, total, ok, reasons = asyncio.run(go())
    for out, status, code in (
        (per_ip, 429, "too_many_concurrent_requests"),
        (total, 503, "server_overloaded"),
    ):
        assert out[0]["status"] == status
        headers = dict(out[0]["headers"])
        assert headers[b"retry-after"] == b"1" and headers[b"content-type"] == b"application/json"
        err = json.loads(out[1]["body"])["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == code
    assert [o[0]["status"] for o in ok] == [200, 200, 200]
    assert reasons == ["too_many_concurrent_requests", "server_overloaded"]


def _asgi_request(app, path: str, body: bytes, headers: list, chunks: list[bytes] | None = None):
    """Call ``app`` with one HTTP request whose body arrives as ``chunks`` (then never ends, if the last
    chunk says more); returns a task whose result is the messages sent."""
    out: list[dict] = []
    parts = list(chunks) if chunks is not None else [body]
    stall = asyncio.Event()

    async def receive():
        if parts:
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": chunks is not None}
        await stall.wait()  # a slow body: the rest never arrives
        return {"type": "http.disconnect"}

    async def send(msg):
        out.append(msg)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST" if body or chunks else "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-length", str(len(body)).encode()), *headers],
        "client": ("10.0.0.9", 5000),
        "server": ("127.0.0.1", 8000),
    }

    async def run():
        await app(scope, receive, send)
        return out

    return asyncio.ensure_future(run()), stall


def _select_app(tmp_path, reward_model, **server):
    from privalign.service.app import create_app
    from privalign.service.config import load_config

    return create_app(load_config(_config(tmp_path, reward_model, **server)))


def test_a_slow_body_holds_no_in_flight_slot(tmp_path, reward_model):
    """``max_in_flight = 1``: a request whose body is still arriving does not take the slot, so another
    tenant's complete request is answered 200 (before issue 36 it was counted from its headers: 503)."""
    app = _select_app(tmp_path, reward_model, max_in_flight=1)
    tok = _key(tmp_path)
    body = json.dumps(
        {
            "prompt": "q",
            "candidates": ["a kind reply", "a rude reply"],
            "privacy": {"method": "privbon", "epsilon": 0.01},
        }
    ).encode()
    ctype = (b"content-type", b"application/json")

    async def go():
        slow, stall = _asgi_request(app, "/v1/select", b"x" * 4000, [ctype], chunks=[b"{"])
        await asyncio.sleep(0.2)  # the slow request has its headers and one body byte
        ok, _ = _asgi_request(app, "/v1/select", body, [ctype, (b"authorization", f"Bearer {tok}".encode())])
        done = await asyncio.wait_for(ok, 30)
        stall.set()  # the slow client leaves
        await asyncio.wait_for(slow, 30)
        return done

    out = asyncio.run(go())
    assert out[0]["status"] == 200, out[1].get("body", b"")[:300]


def test_readyz_reports_saturation(tmp_path, reward_model):
    """``/readyz`` reports the requests in flight, and answers 503 ``saturated`` (``Retry-After``) while
    every slot is taken, so a balancer sends new requests elsewhere."""
    app = _select_app(tmp_path, reward_model, max_in_flight=4)

    async def go():
        first, _ = _asgi_request(app, "/readyz", b"", [])
        first = await asyncio.wait_for(first, 30)
        app.state.load.in_flight.running = 4  # every slot taken (as four running requests would)
        full, _ = _asgi_request(app, "/readyz", b"", [])
        full = await asyncio.wait_for(full, 30)
        app.state.load.in_flight.running = 0
        return first, full

    first, full = asyncio.run(go())
    assert first[0]["status"] == 200
    load = json.loads(first[1]["body"])["load"]
    assert load["in_flight"] == 0 and load["max_in_flight"] == 4 and load["saturated"] is False
    assert full[0]["status"] == 503 and dict(full[0]["headers"])[b"retry-after"] == b"1"
    doc = json.loads(full[1]["body"])
    assert doc["ready"] is False and doc["reason"].startswith("saturated")
    assert doc["load"]["saturated"] is True
