"""Connection attacks in processes of their own:
``python _conn_attack.py MODE PORT SOCKETS ADDRESSES [PROCESSES]``.

Starts PROCESSES (default 1) attacking processes, each holding SOCKETS sockets; runs until a line
arrives on stdin, then writes one JSON object to stdout: ``opened`` (connections opened),
``closed_by_server`` (closed or reset by the server, then reopened) and ``connect_errors``.
Attacker addresses are ``127.0.0.2`` … ``127.0.0.(ADDRESSES + 1)`` (loopback; the victim uses
127.0.0.1). Each process spreads its sockets over them round-robin. Modes:

* ``slowbody``: complete ``POST /v1/select`` headers (``Content-Length: 4000``, no ``Authorization``)
  and one body byte, then nothing; reopened when the server closes them.
* ``halfopen``: the same headers, 100 body bytes, then ``shutdown(SHUT_WR)``; reopened when closed.
* ``churn``: idle sockets (half send part of a header block), more than the server's per-address cap;
  each one the server closes is reopened at once (eviction + reconnect).
* ``rst``: each process connects and resets (``SO_LINGER`` 0) in a loop (SOCKETS is ignored).

Run apart from the test so that the victim's latency is the server's, not the attacker's.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import selectors
import socket
import struct
import sys
import threading

HEAD = (
    b"POST /v1/select HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
)


def _open(mode: str, port: int, src: str, i: int) -> socket.socket | None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(src, 0))
        if mode == "slowbody":
            s.sendall(HEAD + b"{")
        elif mode == "halfopen":
            s.sendall(HEAD + b"{" + b" " * 99)
            s.shutdown(socket.SHUT_WR)
        elif mode == "churn" and i % 2:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        s.setblocking(False)
        return s
    except OSError:
        return None


def _hold(mode: str, port: int, n: int, addrs: list[str], stop: threading.Event, out: dict) -> None:
    sel = selectors.DefaultSelector()

    def open_(i: int) -> None:
        s = _open(mode, port, addrs[i % len(addrs)], i)
        if s is None:
            out["connect_errors"] += 1
            return
        out["opened"] += 1
        sel.register(s, selectors.EVENT_READ, i)

    for i in range(n):
        open_(i)
    missing: list[int] = []
    while not stop.is_set():
        for i in missing:
            open_(i)
        missing = []
        for key, _ in sel.select(timeout=0.1):
            s = key.fileobj
            try:
                gone = s.recv(65536) == b""  # type: ignore[union-attr]
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            if gone:  # the server closed it: reopen (the attacker keeps its sockets)
                sel.unregister(s)
                s.close()  # type: ignore[union-attr]
                out["closed_by_server"] += 1
                missing.append(key.data)
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def _rst(port: int, src: str, stop: threading.Event, out: dict) -> None:
    linger = struct.pack("ii", 1, 0)
    while not stop.is_set():
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            s.bind((src, 0))
            s.connect(("127.0.0.1", port))
            out["opened"] += 1
        except OSError:
            out["connect_errors"] += 1
        s.close()  # RST


def _worker(mode: str, port: int, n: int, addrs: list[str], ready, stop, results) -> None:  # noqa: ANN001
    """One attacking process: ``n`` held sockets over ``addrs`` (or, for ``rst``, a connect/reset loop)."""
    out = {"opened": 0, "closed_by_server": 0, "connect_errors": 0}
    halt = threading.Event()
    if mode == "rst":
        t = threading.Thread(target=_rst, args=(port, addrs[0], halt, out), daemon=True)
    else:
        t = threading.Thread(target=_hold, args=(mode, port, n, addrs, halt, out), daemon=True)
    t.start()
    while mode != "rst" and out["opened"] + out["connect_errors"] < n and t.is_alive():
        halt.wait(0.05)
    ready.put(1)
    stop.wait()
    halt.set()
    t.join(30)
    results.put(out)


def main() -> None:
    mode, port, n, n_addr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    procs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    addrs = [f"127.0.0.{k + 2}" for k in range(n_addr)]
    ctx = mp.get_context("spawn")
    stop, ready, results = ctx.Event(), ctx.Queue(), ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker,
            args=(mode, port, n, addrs[k % n_addr :] + addrs[: k % n_addr], ready, stop, results),
            daemon=True,
        )
        for k in range(procs)
    ]
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=120)
    print("started", flush=True)
    sys.stdin.readline()
    stop.set()
    total = {"opened": 0, "closed_by_server": 0, "connect_errors": 0}
    for _ in workers:
        for k, v in results.get(timeout=60).items():
            total[k] += v
    for w in workers:
        w.join(10)
    print(json.dumps(total), flush=True)


if __name__ == "__main__":
    main()
