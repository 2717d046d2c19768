"""Benchmark: ``POST /v1/select`` (16 short candidates, linear reward model) with the privacy layer and
ledger on SQLite and on PostgreSQL, against the same endpoint with privacy and ledger disabled (baseline,
same run); plus the ledger's own write rate.

Each server is a separate ``uvicorn`` process on 127.0.0.1 (one worker), all running at once; the load
generator is this process (threads with keep-alive ``httpx`` clients) on loopback only. The setups are
measured *interleaved* so that a shared, noisy machine slows them alike:

* sequential latency p50/p99: one request at a time, round-robin over the setups, with an idle gap of
  ``--gap-ms`` (default 5 ms) after each answer. The private setups write their settle after the answer
  has been sent; without the gap that work would run during the *next* setup's request (the baseline's,
  after the last setup) and flatter the overhead;
* concurrent (``--clients``): 5 rounds, each one burst per setup in turn (50 ms apart, for the same
  reason); throughput = requests / summed burst time (the deferred settles run inside the bursts, so
  throughput pays for them); p50/p99 over all bursts; server CPU time (user + system, from /proc) per
  request.

The durable setups (``sync=full``) make every reservation durable before the answer is released. With
group commit (``[database] group_commit = true``, the default) the reserve commits at once and its flush
runs in the background, shared by every reservation committed before it began, while the request scores
and selects; the answer waits for it. Without group commit (``group_commit = false``, measured in the same
run) the reserve waits for its own flush. The cost of a flush is probed at the start and at the end of the
run (``fdatasync`` of one page, and PostgreSQL's commit with ``synchronous_commit`` on and off) and printed
with the load average, because on a shared virtual disk it varies by an order of magnitude.

Usage::

    python benchmarks/bench_service_select.py [--requests 400] [--clients 8] [--gap-ms 5] [--no-postgres]
                                              [--json out.json]

Prints a markdown table (and JSON with ``--json``). Ratios are against the baseline of the same run.
"""

from __future__ import annotations

import argparse
import json
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

from service_servers import PG_URL, Server, chat_body, select_body, write_config, write_reward_model  # noqa: E402

_body = select_body


def _sequential(
    targets: list[tuple[str, str | None]],
    per_setup: int,
    gap_s: float = 0.005,
    path: str = "/v1/select",
    body=_body,
) -> list[np.ndarray]:
    """Round-robin one request at a time over all setups, so every setup sees the same load conditions,
    idle for ``gap_s`` after each answer (so that work a server does after answering is not timed in the
    next setup's request). Returns the latencies (ms) per setup."""
    import httpx

    clients = [httpx.Client(timeout=60) for _ in targets]
    lat: list[list[float]] = [[] for _ in targets]
    try:
        for k, (url, tok) in enumerate(targets):  # warm connections
            clients[k].post(
                url + path, json=body(-1), headers={"Authorization": f"Bearer {tok}"} if tok else {}
            )
        for i in range(per_setup):
            for k, (url, tok) in enumerate(targets):
                h = {"Authorization": f"Bearer {tok}"} if tok else {}
                t0 = time.perf_counter()
                r = clients[k].post(url + path, json=body(i), headers=h)
                lat[k].append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    raise RuntimeError(f"{url}: HTTP {r.status_code} {r.text[:200]}")
                if gap_s > 0:
                    time.sleep(gap_s)
    finally:
        for c in clients:
            c.close()
    return [np.asarray(x) for x in lat]


def _burst(url: str, token: str | None, n: int, clients: int) -> tuple[float, list[float]]:
    """``n`` requests from ``clients`` concurrent keep-alive clients; returns (wall seconds, latencies ms)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    lat: list[float] = []
    lock = threading.Lock()
    per = [n // clients + (1 if k < n % clients else 0) for k in range(clients)]
    conns = [httpx.Client(timeout=60) for _ in range(clients)]
    for c in conns:
        c.post(url + "/v1/select", json=_body(-1), headers=headers)
    start = threading.Barrier(clients + 1)

    def worker(k: int) -> None:
        start.wait()
        for i in range(per[k]):
            t0 = time.perf_counter()
            r = conns[k].post(url + "/v1/select", json=_body(i), headers=headers)
            with lock:
                lat.append((time.perf_counter() - t0) * 1000)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}")

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
    return wall, lat


def _ledger_rate(
    engine, seconds: float = 3.0, threads: int = 1, sync: str = "full", group_commit: bool = True
) -> float:
    """reserve+settle pairs per second → ledger rows (2 per pair) per second (each reserve returns once
    durable)."""
    from privalign.service.store import SQLBudgetStore

    store = SQLBudgetStore(engine, durable=sync == "full", group_commit=group_commit)
    principal = f"bench-{uuid.uuid4().hex[:8]}"
    count = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def w():
        k = 0
        while time.perf_counter() < stop:
            rid = store.try_reserve(principal, (1e-9, 0.0), (1.0, 0.0))
            store.settle(rid, (1e-9, 0.0))
            k += 1
        with lock:
            count[0] += k

    t0 = time.perf_counter()
    ts = [threading.Thread(target=w) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rate = 2 * count[0] / (time.perf_counter() - t0)
    store.close()
    return rate


def _flush_probe(tmp: Path, pg_url: str | None, reps: int = 50) -> dict:
    """Median cost of one disk flush now: ``fdatasync`` of a rewritten 8 KiB page in ``tmp`` (the SQLite
    files' file system), and PostgreSQL's one-row autocommit INSERT with ``synchronous_commit`` on minus
    off. The durable (``sync=full``) setups pay one such flush per request; on a virtual disk it varies."""
    out: dict[str, float] = {}
    p = tmp / "flush-probe.bin"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, b"\0" * 8192, 0)
        os.fsync(fd)
        ts = []
        for i in range(reps):
            os.pwrite(fd, bytes([i % 256]) * 8192, 0)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            ts.append(time.perf_counter() - t0)
        out["fdatasync_ms"] = float(np.median(ts) * 1000)
    finally:
        os.close(fd)
        p.unlink()
    if pg_url:
        import psycopg

        conninfo = pg_url.replace("postgresql+psycopg://", "postgresql://")
        table = f"privalign_flush_probe_{uuid.uuid4().hex[:8]}"  # not TEMP: temp tables write no WAL
        with psycopg.connect(conninfo, autocommit=True) as c:
            c.execute(f"CREATE TABLE {table} (x int)")
            try:
                for mode in ("on", "off"):
                    c.execute(f"SET synchronous_commit TO {mode}")
                    ts = []
                    for i in range(reps):
                        t0 = time.perf_counter()
                        c.execute(f"INSERT INTO {table} VALUES (%s)", (i,))
                        ts.append(time.perf_counter() - t0)
                    out[f"pg_commit_sync_{mode}_ms"] = float(np.median(ts) * 1000)
            finally:
                c.execute(f"DROP TABLE {table}")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--gap-ms", type=float, default=5.0, help="idle time after each sequential request")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument(
        "--generate-ms",
        type=float,
        default=20.0,
        help="also time /v1/chat/completions sequentially, with a stand-in generator that waits this long "
        "(0: skip)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from privalign.service import db
    from privalign.service.keys import create_key

    tmp = Path(tempfile.mkdtemp(prefix="privalign-bench-"))
    write_reward_model(tmp / "reward.json")
    load_start = os.getloadavg()
    flush_start = _flush_probe(tmp, None if args.no_postgres else PG_URL)
    # (name, database URL, schema, private, sync, group_commit)
    setups = [
        ("baseline (no privacy, no ledger)", f"sqlite:///{tmp / 'base.db'}", "", False, "normal", False),
        (
            "privbon + SQLite, sync=full, group commit (default)",
            f"sqlite:///{tmp / 'ledger.db'}",
            "",
            True,
            "full",
            True,
        ),
        (
            "privbon + SQLite, sync=full, flush per reserve",
            f"sqlite:///{tmp / 'ledger1.db'}",
            "",
            True,
            "full",
            False,
        ),
        ("privbon + SQLite, sync=normal", f"sqlite:///{tmp / 'ledger2.db'}", "", True, "normal", False),
    ]
    schema = f"privalign_bench_{uuid.uuid4().hex[:8]}"
    if not args.no_postgres:
        setups.append(
            ("privbon + PostgreSQL, sync=full, group commit (default)", PG_URL, schema, True, "full", True)
        )
        setups.append(
            ("privbon + PostgreSQL, sync=full, flush per reserve", PG_URL, schema + "f", True, "full", False)
        )
        setups.append(("privbon + PostgreSQL, sync=normal", PG_URL, schema + "n", True, "normal", False))
    rows = []
    engines = []
    servers: list[Server] = []
    targets: list[tuple[str, str | None]] = []
    try:
        for name, url, sch, private, sync, group in tqdm(setups, desc="start servers", file=sys.stderr):
            eng = db.make_engine(url, schema=sch or None)
            db.create_schema(eng, schema=sch or None)
            engines.append((name, eng, sch, sync, group))
            token = create_key(eng, budget_epsilon=1e6)[1] if private else None
            servers.append(Server(write_config(tmp, url, sch, sync, group, args.generate_ms), private))
            targets.append((servers[-1].url, token))
        # Sequential latency, interleaved request by request across setups.
        seq = _sequential(targets, max(50, args.requests // 4), args.gap_ms / 1000)
        chat = (
            _sequential(
                targets, max(50, args.requests // 8), args.gap_ms / 1000, "/v1/chat/completions", chat_body
            )
            if args.generate_ms > 0
            else None
        )
        # Throughput: `rounds` interleaved bursts per setup; CPU time of each server over its bursts.
        rounds = 5
        walls = [0.0] * len(targets)
        lats: list[list[float]] = [[] for _ in targets]
        cpu = [0.0] * len(targets)
        for _ in tqdm(range(rounds), desc="throughput rounds", file=sys.stderr):
            for k, (url, tok) in enumerate(targets):
                c0 = servers[k].cpu_s()
                w, lt = _burst(url, tok, args.requests // rounds, args.clients)
                time.sleep(0.05)  # let this setup's last settles finish before the next burst
                cpu[k] += servers[k].cpu_s() - c0
                walls[k] += w
                lats[k] += lt
        n_conc = rounds * (args.requests // rounds)
        for k, (name, *_rest) in enumerate(setups):
            conc = np.asarray(lats[k])
            rows.append(
                {
                    "setup": name,
                    "seq_p50_ms": float(np.percentile(seq[k], 50)),
                    "seq_p99_ms": float(np.percentile(seq[k], 99)),
                    "server_cpu_ms_per_req": cpu[k] * 1000 / (n_conc + rounds * args.clients),
                    "conc_rps": n_conc / walls[k],
                    "conc_p50_ms": float(np.percentile(conc, 50)),
                    "conc_p99_ms": float(np.percentile(conc, 99)),
                    "chat_seq_p50_ms": float(np.percentile(chat[k], 50)) if chat is not None else None,
                }
            )
        for s_ in servers:
            s_.stop()
        servers = []
        ledger = {}
        for name, eng, _, sync, group in engines[1:]:
            ledger[name] = {
                "rows_per_s_1_thread": _ledger_rate(eng, 3.0, 1, sync, group),
                "rows_per_s_4_threads": _ledger_rate(eng, 3.0, 4, sync, group),
            }
    finally:
        for s_ in servers:
            s_.stop()
        for _, eng, sch, _, _ in engines:
            if eng.dialect.name == "postgresql":
                with eng.begin() as conn:
                    conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{sch}" CASCADE')
            eng.dispose()
    base = rows[0]
    for r in rows:
        r["overhead_p50_ms"] = r["seq_p50_ms"] - base["seq_p50_ms"]
        r["conc_overhead_p50_ms"] = r["conc_p50_ms"] - base["conc_p50_ms"]
        if r["chat_seq_p50_ms"] is not None:
            r["chat_overhead_p50_ms"] = r["chat_seq_p50_ms"] - base["chat_seq_p50_ms"]
        r["overhead_cpu_ms"] = r["server_cpu_ms_per_req"] - base["server_cpu_ms_per_req"]
        r["throughput_ratio"] = r["conc_rps"] / base["conc_rps"]
    flush_end = _flush_probe(tmp, None if args.no_postgres else PG_URL)
    out = {
        "command": "python benchmarks/bench_service_select.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "gap_ms": args.gap_ms,
        "generate_ms": args.generate_ms,
        "cpus": os.cpu_count(),
        "loadavg_at_start": load_start,
        "loadavg_at_end": os.getloadavg(),
        "flush_probe_start": flush_start,
        "flush_probe_end": flush_end,
        "rows": rows,
        "ledger_writes": ledger,
    }
    print(
        f"cpus={out['cpus']} gap_ms={args.gap_ms:g} "
        f"loadavg at start={tuple(round(x, 1) for x in load_start)} "
        f"at end={tuple(round(x, 1) for x in out['loadavg_at_end'])}"
    )
    for when, fp in (("start", flush_start), ("end", flush_end)):
        print(f"disk flush at {when}: " + ", ".join(f"{k} {v:.2f}" for k, v in fp.items()))
    print(
        "| setup | seq p50 ms | seq p99 ms | seq overhead p50 ms | server CPU ms/req | overhead CPU ms/req "
        "| conc req/s | "
        "conc p50 ms | conc p99 ms | conc overhead p50 ms | throughput vs baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['setup']} | {r['seq_p50_ms']:.2f} | {r['seq_p99_ms']:.2f} | {r['overhead_p50_ms']:+.2f} | "
            f"{r['server_cpu_ms_per_req']:.2f} | {r['overhead_cpu_ms']:+.2f} | {r['conc_rps']:.0f} | "
            f"{r['conc_p50_ms']:.2f} | {r['conc_p99_ms']:.2f} | {r['conc_overhead_p50_ms']:+.2f} | "
            f"{r['throughput_ratio']:.2f} |"
        )
    if args.generate_ms > 0:
        print()
        print(
            "/v1/chat/completions, sequential, 16 candidates from a stand-in generator that waits "
            f"{args.generate_ms:g} ms:"
        )
        print("| setup | seq p50 ms | seq overhead p50 ms |")
        print("|---|---|---|")
        for r in rows:
            print(f"| {r['setup']} | {r['chat_seq_p50_ms']:.2f} | {r['chat_overhead_p50_ms']:+.2f} |")
    print()
    print("| ledger | rows/s (1 thread) | rows/s (4 threads) |")
    print("|---|---|---|")
    for name, v in ledger.items():
        print(f"| {name} | {v['rows_per_s_1_thread']:.0f} | {v['rows_per_s_4_threads']:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
