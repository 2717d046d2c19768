"""A flooding client in its own process: ``python _flood.py URL TOKEN BODY_FILE THREADS``.

Threads POST the body to ``URL/v1/select`` as fast as they can, retrying at once and ignoring
``Retry-After``, until a line arrives on stdin; then one JSON object goes to stdout: the count of each
status code (``-1`` for a transport error: a refusal closes its connection, rarely mid-upload) and the
first 50 refusals (status, headers, body). Run apart from the test so that its threads do not compete for
the measuring process's interpreter lock: a victim's latency must be the server's, not the flooder's.
The flooder connects from ``127.0.0.2`` (loopback), another address than the victim's ``127.0.0.1``, as two
tenants would: its reconnects after refusals would otherwise count against the victim's own per-address
connection rate (64/s), and the server would rightly reset the victim's new connections.
"""

from __future__ import annotations

import json
import sys
import threading

import httpx


def main() -> None:
    url, token, body_file, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with open(body_file, "rb") as f:
        body = f.read()
    stop = threading.Event()
    lock = threading.Lock()
    codes: dict[int, int] = {}
    refusals: list[dict] = []

    def flood() -> None:
        headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(timeout=60.0, transport=transport) as c:
            while not stop.is_set():
                try:
                    r = c.post(url + "/v1/select", content=body, headers=headers)
                except httpx.TransportError:
                    with lock:
                        codes[-1] = codes.get(-1, 0) + 1
                    continue
                with lock:
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                    if r.status_code == 429 and len(refusals) < 50:
                        refusals.append({"headers": dict(r.headers), "body": r.json()})

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    print("started", flush=True)
    sys.stdin.readline()
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({"codes": codes, "refusals": refusals}), flush=True)


if __name__ == "__main__":
    main()
