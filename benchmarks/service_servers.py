"""Shared by the service benchmarks (``bench_service_select.py``, ``bench_service_soak.py``): the reward
model, the server config, and one ``uvicorn`` server process per setup (one worker, 127.0.0.1).

A server is this file run as ``python service_servers.py --serve CONFIG PORT PRIVATE``:
``create_app(load_config(CONFIG), private=PRIVATE)`` (``private=False``: privacy layer and ledger
disabled, the benchmarks' baseline).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("PRIVALIGN_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

__all__ = [
    "PG_URL",
    "Server",
    "write_reward_model",
    "write_config",
    "select_body",
    "chat_body",
    "sleepy_generator",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_reward_model(path: Path) -> None:
    """A linear reward model over hashed 1–2-grams (4,096 features, 256 non-zero weights, seed 0)."""
    from privalign.service.components import LinearHashedScorer

    rng = np.random.default_rng(0)
    LinearHashedScorer.write(
        path,
        {int(j): float(rng.normal()) for j in rng.choice(4096, 256, replace=False)},
        n_features=4096,
        ngram_range=(1, 2),
        bias=0.5,
    )


def sleepy_generator(delay_ms: float = 20.0):
    """A stand-in for an upstream model server: waits ``delay_ms`` (as a network call would, without the
    GIL) and returns ``n`` fixed candidates."""

    def generate(prompt, n: int, **_kw) -> list[str]:
        time.sleep(delay_ms / 1000)
        return [f"candidate {j}: a good clear reply" for j in range(n)]

    return generate


def write_config(
    tmp: Path,
    db_url: str,
    schema: str = "",
    sync: str = "full",
    group_commit: bool = True,
    generate_ms: float = 0.0,
    key_limits: bool = False,
) -> Path:
    """A server config in ``tmp`` (the reward model must be at ``tmp / "reward.json"``); no generator, or
    with ``generate_ms > 0`` :func:`sleepy_generator`. ``key_limits=False`` turns the per-key concurrency
    and rate limits off (the throughput benchmarks drive one key from 64 clients); ``True`` keeps the
    defaults."""
    p = tmp / f"bench-{uuid.uuid4().hex[:6]}.toml"
    gen = (
        '[generator]\nkind = "python"\ntarget = "service_servers:sleepy_generator"\n'
        f"delay_ms = {float(generate_ms)!r}\n"
        if generate_ms > 0
        else '[generator]\nkind = "none"\n'
    )
    p.write_text(
        f'[database]\nurl = "{db_url}"\nschema = "{schema}"\nsync = "{sync}"\n'
        f"group_commit = {'true' if group_commit else 'false'}\n\n"
        "[limits]\nmax_n = 64\nmax_epsilon = 10.0\n"
        + ("\n" if key_limits else "key_concurrency = 0\nkey_units_per_s = 0.0\n\n")
        + '[privacy]\nallowed_methods = ["privbon"]\ndefault_epsilon = 1e-6\n\n'
        f'[reward_model]\nkind = "linear"\npath = "{tmp / "reward.json"}"\n\n' + gen
    )
    return p


def chat_body(i: int, epsilon: float = 1e-6) -> dict:
    """Request ``i`` of ``POST /v1/chat/completions``: PrivBoN over 16 generated candidates."""
    return {
        "model": "m",
        "messages": [{"role": "user", "content": f"question {i}"}],
        "privacy": {"method": "privbon", "epsilon": epsilon, "n": 16},
    }


def select_body(i: int, epsilon: float = 1e-6) -> dict:
    """Request ``i`` of ``POST /v1/select``: 16 short candidates, PrivBoN at ``epsilon``."""
    words = ["good", "clear", "short", "answer", "kind", "wrong", "helpful", "reply"]
    cands = [f"candidate {j}: a {words[(i + j) % 8]} {words[(i * j) % 8]} reply" for j in range(16)]
    return {
        "prompt": f"question {i}",
        "candidates": cands,
        "privacy": {"method": "privbon", "epsilon": epsilon},
    }


class Server:
    """One server process; :meth:`cpu_s` reads its CPU time from /proc."""

    def __init__(self, config: Path, private: bool) -> None:
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "src"), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
            ),
        }
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(config), str(self.port), "1" if private else "0"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stderr.read().decode()[-2000:])
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not start")

    def cpu_s(self) -> float:
        """CPU time (user + system) the server process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _serve(config: str, port: int, private: bool) -> None:
    from privalign.service.app import create_app
    from privalign.service.config import load_config
    from privalign.service.connections import GuardedServer
    from privalign.service.server import uvicorn_config

    cfg = load_config(config)
    app = create_app(cfg, private=private)
    conf = uvicorn_config(cfg, app, host="127.0.0.1", port=port)  # the connection defences of serve
    conf.log_level, conf.access_log = "error", False
    GuardedServer(conf).run()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
    else:
        sys.exit("usage: service_servers.py --serve CONFIG PORT 0|1 (started by the service benchmarks)")
