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

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from service_servers import PG_URL, Server, select_body, write_config, write_reward_model  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--served", type=int, default=8_000)
    ap.add_argument("--epsilon", type=float, default=0.001)
    args = ap.parse_args(argv)

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
