"""Fixtures of the service tests: configs, in-thread and subprocess servers, PostgreSQL schemas."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from svc_components import make_upstream_app, write_reward_model  # noqa: E402

PG_URL = os.environ.get("PRIVALIGN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def write_config(path: Path, sections: dict[str, dict]) -> Path:
    lines = []
    for name, body in sections.items():
        lines.append(f"[{name}]")
        for k, v in body.items():
            lines.append(f"{k} = {toml_value(v)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def reward_model(tmp_path) -> Path:
    return write_reward_model(tmp_path / "reward.json")


@contextmanager
def serve_in_thread(app, port: int | None = None):
    """Run an ASGI app with uvicorn in a daemon thread on 127.0.0.1; yields the base URL."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    )
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("in-thread server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)


@pytest.fixture
def upstream():
    with serve_in_thread(make_upstream_app()) as url:
        yield url + "/v1"


@pytest.fixture
def failing_upstream():
    with serve_in_thread(make_upstream_app(fail=True)) as url:
        yield url + "/v1"


class ServerProcess:
    """``python -m privalign serve --config CFG --port P`` in a subprocess (own process group)."""

    def __init__(self, config: Path, port: int | None = None) -> None:
        self.config, self.port = config, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> ServerProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(HERE), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "privalign",
                "serve",
                "--config",
                str(self.config),
                "--port",
                str(self.port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not become healthy")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def server_process():
    procs: list[ServerProcess] = []

    def make(config: Path) -> ServerProcess:
        sp = ServerProcess(config)
        procs.append(sp)
        return sp

    yield make
    for p in procs:
        p.stop()


@pytest.fixture
def pg_schema():
    """A fresh PostgreSQL schema for this test (dropped afterwards); yields (url, schema)."""
    pytest.importorskip("psycopg")
    from sqlalchemy import create_engine

    schema = f"privalign_test_{uuid.uuid4().hex[:12]}"
    eng = create_engine(PG_URL)
    try:
        with eng.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    except Exception as exc:  # the marker says this test needs PostgreSQL: fail, do not skip
        pytest.fail(f"PostgreSQL at {PG_URL} is not reachable: {exc}")
    try:
        yield PG_URL, schema
    finally:
        with eng.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        eng.dispose()
