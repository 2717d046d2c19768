"""Soak and ledger audit: ``--requests`` (default 10,000) ``POST /v1/select`` requests from ``--clients``
(default 64) concurrent keep-alive clients, spread round-robin over ``--replicas`` (default 2) service
processes sharing one PostgreSQL ledger (``sync = "full"``), all on **one key** whose budget covers only
``--served`` (default 8,000) requests at ε = ``--epsilon`` (default 0.001). Baseline, same run: the same
clients against one replica with the privacy layer and ledger disabled (``create_app(private=False)``),
for ``--requests // 5`` requests.

Afterwards the ledger is audited:

* no response ≥ 500; every response is 200 or 429;
* exactly ``--served`` answers (the exact-unit ledger: budget / ε answers, not one fewer, none more);
* the cached totals equal the totals derived from the ledger rows (exact units);
* spent == limit exactly, nothing reserved, no open reservation, one ``settle`` row per answer and one
  ``reserve`` row per settle (no refused request wrote a row).

Usage::

    python benchmarks/bench_service_soak.py [--requests 10000] [--clients 64] [--replicas 2] [--served 8000]

Prints a markdown table and the audit; exits 1 if the audit fails.

``--attack``: the soak under attack, on **both ledgers** (SQLite, PostgreSQL), one server
each with the default limits (``privalign serve``'s connection defences and per-key limits). Well-behaved
tenants: ``--clients`` (default 8 in this mode) keep-alive clients over 4 keys on 127.0.0.1 send
``--requests`` (default 500) light ``/v1/select`` requests. Baseline, same run and server: the same load
alone. Then the same load under each attack in turn: (a) 900 sockets from 127.0.0.2 stay idle or
half-open (part of a header block, then one byte every 0.5 s: slowloris), reopened as the server closes
them, while one key floods from 12 threads with the heaviest request the limits allow (64 × 8,000
characters), ignoring ``Retry-After``; then the keyless attacks of issue 36 (``CONN_ATTACKS``, run by
``tests/service/_conn_attack.py`` from 127.0.0.2 …): ``slowbody`` (320 sockets from 5 addresses send
complete ``POST /v1/select`` headers, ``Content-Length: 4000``, and one body byte), ``halfopen`` (the
same, 100 body bytes, then a half-close), ``churn`` (2 processes keep 300 idle sockets each from one
address, reopening whatever the server closes) and ``rst`` (2 processes connect and reset in a loop).
Reported: the tenants' p50/p99 and their ratios to the baseline; exits 1 if a tenant request failed,
``/healthz`` did not answer 200, a flood refusal was charged, or a tenant key has a reservation without
an answer.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from service_servers import PG_URL, Server, select_body, write_config, write_reward_model  # noqa: E402

ROOT = HERE.parent
#: The idle-socket attacker's address (the tenants use 127.0.0.1: a separate client, which the per-address
#: connection rate tells apart).
ATTACKER = "127.0.0.2"
#: The keyless connection attacks of issue 36 (``tests/service/_conn_attack.py``, the same parameters as
#: ``tests/service/test_service_conn_attacks.py``): mode -> (sockets per process, addresses, processes).
CONN_ATTACKS = {"slowbody": (320, 5, 1), "halfopen": (320, 5, 1), "churn": (300, 1, 2), "rst": (0, 2, 2)}


class _ConnAttack:
    """One of :data:`CONN_ATTACKS`, in processes of its own (``_conn_attack.py``)."""

    def __init__(self, mode: str, port: int) -> None:
        self.mode, self.port = mode, port
        self.stats: dict = {}

    def __enter__(self) -> _ConnAttack:
        import subprocess

        script = ROOT / "tests" / "service" / "_conn_attack.py"
        args = [str(v) for v in CONN_ATTACKS[self.mode]]
        self.proc = subprocess.Popen(
            [sys.executable, str(script), self.mode, str(self.port), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "started"
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        import json

        out, _ = self.proc.communicate("stop\n", timeout=120)
        self.stats = json.loads(out.strip().splitlines()[-1])


def _load(urls: list[str], token: str | None, n: int, clients: int, epsilon: float) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    per = [n // clients + (1 if k < n % clients else 0) for k in range(clients)]
    codes: dict[int, int] = {}
    lat: list[float] = []
    lock = threading.Lock()
    conns = [httpx.Client(timeout=120) for _ in range(clients)]
    start = threading.Barrier(clients + 1)

    def worker(k: int) -> None:
        start.wait()
        for i in range(per[k]):
            url = urls[(k + i) % len(urls)]
            body = select_body(i, epsilon)
            t0 = time.perf_counter()
            try:
                code = conns[k].post(url + "/v1/select", json=body, headers=headers).status_code
            except httpx.HTTPError:
                code = -1
            with lock:
                lat.append((time.perf_counter() - t0) * 1000)
                codes[code] = codes.get(code, 0) + 1

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    for c in conns:
        c.close()
    a = np.asarray(lat)
    return {
        "requests": n,
        "wall_s": wall,
        "rps": n / wall,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "codes": dict(sorted(codes.items())),
    }


def _tenants(url: str, tokens: list[str], n: int, clients: int) -> dict:
    """``n`` light requests from ``clients`` keep-alive clients, client k on key k % len(tokens)."""
    import httpx

    per = [n // clients + (1 if k < n % clients else 0) for k in range(clients)]
    lat: list[float] = []
    codes: dict[int, int] = {}
    lock = threading.Lock()

    def worker(k: int) -> None:
        h = {"Authorization": f"Bearer {tokens[k % len(tokens)]}"}
        with httpx.Client(timeout=60) as c:
            for i in range(per[k]):
                t0 = time.perf_counter()
                try:
                    code = c.post(url + "/v1/select", json=select_body(i, 1e-6), headers=h).status_code
                except httpx.HTTPError:
                    code = -1
                with lock:
                    lat.append((time.perf_counter() - t0) * 1000)
                    codes[code] = codes.get(code, 0) + 1

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    a = np.asarray(lat)
    return {
        "requests": n,
        "wall_s": wall,
        "rps": n / wall,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "codes": dict(sorted(codes.items())),
    }


class _Attack:
    """900 idle/half-open (slowloris) sockets from one address, reopened when closed, and one key flooding
    heavy requests from 12 threads, ignoring Retry-After; in a process of its own."""

    def __init__(self, port: int, url: str, flood_token: str, sockets: int = 900, flooders: int = 12) -> None:
        import json

        self.port, self.url, self.token, self.n = port, url, flood_token, sockets
        self.stop = threading.Event()
        self.codes: dict[int, int] = {}
        self.reopened = 0
        self.heavy = json.dumps(
            {"prompt": "q", "candidates": [("kind word " * 800)[:8000]] * 64, "privacy": {"epsilon": 1e-6}}
        ).encode()
        self.threads = [threading.Thread(target=self._sockets)] + [
            threading.Thread(target=self._flood) for _ in range(flooders)
        ]

    def _open(self, i: int):
        import socket

        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(ATTACKER, 0))
            if i % 2:
                s.sendall(b"POST /v1/select HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            s.setblocking(False)
            return s
        except OSError:
            return None

    def _sockets(self) -> None:
        socks = [self._open(i) for i in range(self.n)]
        while not self.stop.wait(0.5):
            for i, s in enumerate(socks):
                alive = s is not None
                if alive and i % 2:
                    try:
                        s.send(b"x")  # slowloris: one byte every 0.5 s
                    except OSError:
                        alive = False
                if alive:
                    try:
                        alive = s.recv(4096) != b""
                    except BlockingIOError:
                        pass
                    except OSError:
                        alive = False
                if not alive:
                    if s is not None:
                        s.close()
                    socks[i] = self._open(i)
                    self.reopened += 1
        for s in socks:
            if s is not None:
                s.close()

    def _flood(self) -> None:
        import httpx

        h = {"Authorization": f"Bearer {self.token}", "content-type": "application/json"}
        with httpx.Client(timeout=60) as c:
            while not self.stop.is_set():
                try:
                    code = c.post(self.url + "/v1/select", content=self.heavy, headers=h).status_code
                except httpx.HTTPError:
                    code = -1
                self.codes[code] = self.codes.get(code, 0) + 1

    def run(self, stop: Any, out: Any) -> None:
        """In the attacker's own process (its GIL is not the tenants'): until ``stop`` is set."""
        for t in self.threads:
            t.start()
        stop.wait()
        self.stop.set()
        for t in self.threads:
            t.join()
        out.put((self.codes, self.reopened))

    def __enter__(self) -> _Attack:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self._stop, self._out = ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=self.run, args=(self._stop, self._out))
        self._proc.start()
        time.sleep(2.0)  # sockets open, flood running
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.codes, self.reopened = self._out.get(timeout=120)
        self._proc.join(30)


def _healthz(url: str) -> tuple[int, float]:
    import httpx

    t0 = time.perf_counter()
    try:
        hz = httpx.get(url + "/healthz", timeout=30).status_code
    except httpx.HTTPError:
        hz = -1
    return hz, (time.perf_counter() - t0) * 1000


def attack(args: argparse.Namespace) -> int:
    """The ``--attack`` mode (see the module docstring)."""
    from privalign.service import db
    from privalign.service.keys import create_key
    from privalign.service.store import SQLBudgetStore

    tmp = Path(tempfile.mkdtemp(prefix="privalign-soak-attack-"))
    write_reward_model(tmp / "reward.json")
    rows_out, audits, ok = [], [], True
    load0 = os.getloadavg()
    for ledger in ("sqlite", "postgresql"):
        schema = f"privalign_soak_{uuid.uuid4().hex[:8]}" if ledger == "postgresql" else ""
        url = PG_URL if ledger == "postgresql" else f"sqlite:///{tmp / 'attack.db'}"
        eng = db.make_engine(url, schema=schema or None)
        db.create_schema(eng, schema=schema or None)
        made = [create_key(eng, budget_epsilon=1.0) for _ in range(4)]
        tokens = [tok for _, tok in made]
        flood_id, flood_tok = create_key(eng, budget_epsilon=1.0)
        srv = Server(write_config(tmp, url, schema, "full", key_limits=True), True)
        answered = 0
        try:
            base = _tenants(srv.url, tokens, args.requests, args.clients)
            answered += base["codes"].get(200, 0)
            rows_out.append((ledger, "baseline (tenants alone)", base, None, "", base))
            with _Attack(srv.port, srv.url, flood_tok) as att:
                hz = _healthz(srv.url)
                hit = _tenants(srv.url, tokens, args.requests, args.clients)
            answered += hit["codes"].get(200, 0)
            fc = dict(sorted(att.codes.items()))
            rows_out.append(
                (
                    ledger,
                    "idle/slowloris sockets + flooding key",
                    hit,
                    hz,
                    f"flood {fc}; reopened {att.reopened}",
                    base,
                )
            )
            for mode in CONN_ATTACKS:
                with _ConnAttack(mode, srv.port) as ca:
                    hz_m = _healthz(srv.url)
                    got = _tenants(srv.url, tokens, args.requests, args.clients)
                answered += got["codes"].get(200, 0)
                n, addrs, procs = CONN_ATTACKS[mode]
                what = f"{procs} proc × {n} sockets, {addrs} addr" if n else f"{procs} proc, {addrs} addr"
                rows_out.append((ledger, mode, got, hz_m, f"{what}; {ca.stats}", base))
                ok &= set(got["codes"]) == {200} and hz_m[0] == 200
            time.sleep(2.0)  # deferred settles
            store = SQLBudgetStore(eng)
            reserves = sum(r["action"] == "reserve" for r in store.ledger_rows(flood_id, limit=10**6))
            tenant_reserves = sum(
                r["action"] == "reserve" for kid, _ in made for r in store.ledger_rows(kid, limit=10**6)
            )
        finally:
            srv.stop()
            if schema:
                with eng.begin() as conn:
                    conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            eng.dispose()
        served = fc.get(200, 0)
        ok &= set(base["codes"]) == set(hit["codes"]) == {200} and hz[0] == 200
        ok &= served <= reserves <= served + fc.get(-1, 0) and tenant_reserves == answered
        audits.append((ledger, served, reserves, answered, tenant_reserves))
    load1 = os.getloadavg()
    print(
        f"cpus={os.cpu_count()} loadavg start={tuple(round(x, 1) for x in load0)} "
        f"end={tuple(round(x, 1) for x in load1)}"
    )
    print(
        "| ledger | attack | tenant requests | wall s | p50 ms | p99 ms | p50 / p99 vs baseline "
        "| tenant codes | /healthz under attack | attacker |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ledger, name, r, hz, who, base in rows_out:
        health = "" if hz is None else f"{hz[0]} in {hz[1]:.0f} ms"
        print(
            f"| {ledger} | {name} | {r['requests']} | {r['wall_s']:.1f} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {r['p50_ms'] / base['p50_ms']:.2f} / {r['p99_ms'] / base['p99_ms']:.2f} | "
            f"{r['codes']} | {health} | {who} |"
        )
    for ledger, served, reserves, answered, tenant_reserves in audits:
        print(
            f"audit {ledger}: flood answers {served}, flood reserve rows {reserves}; tenant answers "
            f"{answered}, tenant reserve rows {tenant_reserves}"
        )
    print(
        f"audit: {'PASS' if ok else 'FAIL'}  every tenant request 200, /healthz 200, no refusal charged, "
        "one reservation per tenant answer"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--clients", type=int, default=None)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--served", type=int, default=8_000)
    ap.add_argument("--epsilon", type=float, default=0.001)
    ap.add_argument("--attack", action="store_true", help="the soak under attack, on SQLite and PostgreSQL")
    args = ap.parse_args(argv)
    if args.attack:
        args.requests = args.requests or 500
        args.clients = args.clients or 8
        return attack(args)
    args.requests = args.requests or 10_000
    args.clients = args.clients or 64

    from privalign.service import db
    from privalign.service.keys import create_key
    from privalign.service.store import SQLBudgetStore

    tmp = Path(tempfile.mkdtemp(prefix="privalign-soak-"))
    write_reward_model(tmp / "reward.json")
    schema = f"privalign_soak_{uuid.uuid4().hex[:8]}"
    eng = db.make_engine(PG_URL, schema=schema)
    db.create_schema(eng, schema=schema)
    budget = args.served * args.epsilon
    key_id, token = create_key(eng, budget_epsilon=budget)
    servers: list[Server] = []
    ok = False
    try:
        servers = [Server(write_config(tmp, PG_URL, schema, "full"), True) for _ in range(args.replicas)]
        base_srv = Server(write_config(tmp, f"sqlite:///{tmp / 'base.db'}", "", "normal"), False)
        servers.append(base_srv)
        load0 = os.getloadavg()
        base = _load([base_srv.url], None, args.requests // 5, args.clients, args.epsilon)
        soak = _load(
            [s.url for s in servers[: args.replicas]], token, args.requests, args.clients, args.epsilon
        )
        load1 = os.getloadavg()
        time.sleep(2.0)  # deferred settles of the last answers
        store = SQLBudgetStore(eng)
        with eng.connect() as conn:
            derived = db.derive_totals(conn, key_id, units=True)
        cached = store.snapshot(key_id, units=True)
        rows = store.ledger_rows(key_id, limit=10 * args.requests)
        actions = {
            a: sum(1 for r in rows if r["action"] == a) for a in ("reserve", "settle", "cancel", "reconcile")
        }
        open_res = store.open_reservations(principal=key_id)
        checks = {
            "no response >= 500 or transport error": all(c in (200, 429) for c in soak["codes"]),
            f"exactly {args.served} answers": soak["codes"].get(200, 0) == args.served,
            "cached totals == derived from rows": derived == cached,
            "spent == limit exactly": cached["spent_epsilon"]
            == cached["limit_epsilon"]
            == db.units_down(budget, db.EPS_SCALE),
            "nothing reserved, no open reservation": cached["reserved_epsilon"] == 0 and open_res == [],
            "one settle per answer, one reserve per settle": actions["settle"]
            == soak["codes"].get(200, 0)
            == actions["reserve"]
            and actions["cancel"] == actions["reconcile"] == 0,
        }
        ok = all(checks.values())
    finally:
        for s_ in servers:
            s_.stop()
        with eng.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        eng.dispose()
    print(
        f"cpus={os.cpu_count()} loadavg start={tuple(round(x, 1) for x in load0)} "
        f"end={tuple(round(x, 1) for x in load1)}"
    )
    print(
        "| run | requests | clients | servers | wall s | req/s | p50 ms | p99 ms | status codes "
        "| req/s vs baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| baseline (no privacy, no ledger) | {base['requests']} | {args.clients} | 1 | "
        f"{base['wall_s']:.1f} | {base['rps']:.0f} | "
        f"{base['p50_ms']:.1f} | {base['p99_ms']:.1f} | {base['codes']} | 1.00 |"
    )
    print(
        f"| soak: privbon, one key, PostgreSQL sync=full | {soak['requests']} | {args.clients} | "
        f"{args.replicas} | {soak['wall_s']:.1f} | "
        f"{soak['rps']:.0f} | {soak['p50_ms']:.1f} | {soak['p99_ms']:.1f} | {soak['codes']} | "
        f"{soak['rps'] / base['rps']:.2f} |"
    )
    print(f"ledger rows: {actions}; totals (units): {cached}")
    for name, v in checks.items():
        print(f"audit: {'PASS' if v else 'FAIL'}  {name}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
