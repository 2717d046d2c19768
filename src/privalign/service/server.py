"""Run the service with uvicorn (``privalign serve --config FILE``).

One process serves one app; run several processes (or hosts) against one PostgreSQL URL for replicas:
the ledger's row locks make them safe. A daemon thread reconciles stale reservations and deletes expired
stored answers every ``privacy.reconcile_after_s / 2`` seconds (start-up reconciliation happens in
:func:`create_app`). The generator is loaded in the background at start-up (``/readyz`` is 503 until it is
warm; ``/healthz`` is liveness only). The connection defences (header and body deadlines, a minimum body
rate, bodies before the app, caps on body-waiting requests and connections, a per-address connection
rate, a bounded accept batch) are in :mod:`privalign.service.connections`; :func:`uvicorn_config` and
:class:`~privalign.service.connections.GuardedServer` apply them.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from privalign.service.config import ServiceConfig
from privalign.service.connections import (
    ACCEPT_BATCH,
    BodyFirst,
    ConnectionGuard,
    GuardedServer,
    GuardSettings,
    guarded_protocol,
)

__all__ = [
    "check_listen",
    "check_service",
    "ensure_ledger_folder",
    "guard_settings",
    "open_app",
    "preload_generator",
    "run",
    "uvicorn_config",
]

log = logging.getLogger("privalign.service")


def _reconciler(state, stop: threading.Event) -> None:  # noqa: ANN001
    period = max(1.0, state.cfg.privacy.reconcile_after_s / 2.0)
    while not stop.wait(period):
        try:
            state.reconcile()
        except Exception as exc:  # database down: try again next period
            log.warning("reconciliation failed: %s", type(exc).__name__)


def _file_limit() -> int | None:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def guard_settings(cfg: ServiceConfig) -> GuardSettings:
    """The connection limits of ``cfg``; ``max_connections`` is lowered to the process's open-file limit
    less 128 (database connections, files), with a log line, so that accepting never fails with EMFILE."""
    srv = cfg.server
    total = srv.max_connections
    fl = _file_limit()
    if fl is not None and (total == 0 or total > fl - 128):
        lowered = max(64, fl - 128)
        log.warning(
            "server.max_connections %s lowered to %d (open-file limit %d; raise it with ulimit -n)",
            total or "unlimited",
            lowered,
            fl,
        )
        total = lowered
    return GuardSettings(
        header_timeout_s=srv.header_timeout_s,
        body_timeout_s=srv.body_timeout_s,
        max_connections=total,
        max_connections_per_ip=srv.max_connections_per_ip,
        max_body_waiting=srv.max_body_waiting,
        max_body_waiting_per_ip=srv.max_body_waiting_per_ip,
        min_body_bytes_per_s=srv.min_body_bytes_per_s,
        connection_rate_per_ip=srv.connection_rate_per_ip,
    )


def uvicorn_config(cfg: ServiceConfig, app: Any, *, host: str | None = None, port: int | None = None) -> Any:
    """The ``uvicorn.Config`` that ``privalign serve`` runs (with
    :class:`~privalign.service.connections.GuardedServer`): uvicorn's h11 protocol with the connection
    defences of :mod:`privalign.service.connections`, the app wrapped in
    :class:`~privalign.service.connections.BodyFirst`, and no ``limit_concurrency`` (it counts idle
    connections; requests in flight are limited by the app's
    :class:`~privalign.service.connections.InFlightLimit`)."""
    import uvicorn

    state = getattr(app.state, "service", None)

    def count(reason: str) -> None:
        if state is not None:
            state.metrics.overload.labels(reason).inc()

    guard = ConnectionGuard(guard_settings(cfg), count)
    load = getattr(app.state, "load", None)
    if load is not None:
        load.guard = guard  # /readyz reports its connections and body-waiting requests
    return uvicorn.Config(
        BodyFirst(app),  # a body arrives before the app sees its request
        host=host or cfg.server.host,
        port=cfg.server.port if port is None else port,
        log_level=cfg.server.log_level,
        http=guarded_protocol(guard),
        timeout_keep_alive=cfg.server.keep_alive_s,  # type: ignore[arg-type]  # call_later takes a float
        server_header=False,
        limit_concurrency=None,
        backlog=ACCEPT_BATCH,  # accepted per loop tick; GuardedServer sets the kernel queue to 2048
    )


def run(cfg: ServiceConfig, *, host: str | None = None, port: int | None = None, app: Any = None) -> None:
    """Serve ``cfg`` until interrupted.

    Args:
      cfg: validated config.
      host, port: override ``[server]``.
      app: an app already built from ``cfg`` by ``create_app`` (default: build it here).
    """
    from privalign.service.app import create_app

    if app is None:
        app = create_app(cfg)
    # /readyz answers 503 (and a log line says so) until the generator is warm
    app.state.service.start_warm_up()
    stop = threading.Event()
    t = threading.Thread(
        target=_reconciler, args=(app.state.service, stop), daemon=True, name="privalign-reconciler"
    )
    t.start()
    try:
        GuardedServer(uvicorn_config(cfg, app, host=host, port=port)).run()
    finally:
        stop.set()


def check_listen(host: str, port: int) -> None:
    """Bind the listening address once, as uvicorn will (``SO_REUSEADDR``, IPv6 when the host has a
    colon), so that a busy or forbidden port is one line before anything is printed or loaded.

    Raises:
      ValueError: ``argument --host: cannot listen on HOST:PORT ...`` when the host is at fault (not an
        address, a name that does not resolve, an address that is not this machine's), else
        ``argument --port: ...`` (a busy port, one the user may not bind).
    """
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        host_fault = isinstance(exc, socket.gaierror) or getattr(exc, "errno", None) in (
            errno.EADDRNOTAVAIL,
            errno.EAFNOSUPPORT,
        )
        what = "host" if host_fault else "port"
        raise ValueError(
            f"argument --{what}: cannot listen on {host}:{port} (--{what}, else [server].{what}): {reason}"
        ) from None


def ensure_ledger_folder(cfg: ServiceConfig) -> None:
    """Create the SQLite ledger's folder (not the file's other parents beyond it) before the app opens it.

    Raises:
      OSError: ``cannot create the folder ... of the SQLite ledger ... (--db / [database].url)``.
    """
    from pathlib import Path

    url = cfg.database.url
    if url.startswith("sqlite:///") and ":memory:" not in url:
        folder = Path(url[len("sqlite:///") :]).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(
                f"cannot create the folder {str(folder)!r} of the SQLite ledger {url!r} (--db / "
                f"[database].url): {exc.strerror or exc}"
            ) from None


def open_app(cfg: ServiceConfig) -> Any:
    """Build the app for ``cfg``; a database that cannot be opened is one ``OSError`` naming the config key.

    Raises:
      OSError: ``cannot open the database ... (--db / [database].url): ...``.
    """
    from privalign.service.app import create_app

    try:
        return create_app(cfg)
    except Exception as exc:
        if (type(exc).__module__ or "").startswith("sqlalchemy"):
            orig = getattr(exc, "orig", None)
            detail = " ".join(str(orig if orig is not None else exc).split("\n")[0].split())
            raise OSError(
                f"cannot open the database {cfg.database.url!r} (--db / [database].url): "
                f"{type(exc).__name__}: {detail[:300]}"
            ) from None
        raise


def check_service(cfg: ServiceConfig) -> dict[str, Any]:
    """What ``privalign serve --check`` prints, found without writing anything anywhere: the database is
    opened read-only (a SQLite file that does not exist yet is not created, only its folder's permission is
    checked), and no folder, table or row is made. The config's source, the database and what start-up will
    do with it, the address, the methods, the reward model (with its privacy event) and the generator
    (built, not loaded).

    Raises:
      OSError: ``cannot open the database ... (--db / [database].url): ...``; the errors of the components.
    """
    from sqlalchemy.engine import make_url

    from privalign.service.components import build_generator, build_scorer

    status = _database_status(cfg)
    scorer = build_scorer(cfg.reward_model)
    build_generator(cfg.generator)
    rm = getattr(scorer, "model", scorer)
    return {
        "config": cfg.source,
        "database": make_url(cfg.database.url).get_backend_name(),
        "database_url": cfg.database.url,
        "database_status": status,
        "host": cfg.server.host,
        "port": cfg.server.port,
        "methods": list(cfg.privacy.allowed_methods),
        "reward_model": cfg.reward_model.kind,
        "reward_model_path": cfg.reward_model.options.get("path"),
        "reward_model_privacy_event": getattr(rm, "privacy_event", None),
        "generator": cfg.generator.kind,
    }


def _database_status(cfg: ServiceConfig) -> str:
    """Open the ledger's database read-only and say what start-up will do with it (create, upgrade, use)."""
    import os
    import sqlite3
    from pathlib import Path
    from urllib.parse import quote

    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from privalign.service import db, migrations

    url, schema = cfg.database.url, cfg.database.schema or None

    def fail(why: str) -> OSError:
        return OSError(f"cannot open the database {url!r} (--db / [database].url): {why}")

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            return "in memory: a new, empty ledger at each start"
        path = Path(parsed.database).expanduser().absolute()
        if not path.exists():
            where = path.parent
            while not where.exists():
                where = where.parent
            if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
                raise fail(f"the file cannot be created: {where} is not a writable directory")
            return "absent: the SQLite file is created at start-up"
        if not path.is_file() or not os.access(path, os.R_OK | os.W_OK):
            raise fail("not a readable and writable file")
        if not os.access(path.parent, os.W_OK | os.X_OK):  # SQLite makes its -wal and -shm files there
            raise fail(f"its folder {path.parent} is not writable")
        # read-only; with a live write-ahead log (its -wal and -shm files exist) SQLite reads it without
        # writing, else 'immutable' keeps SQLite from making those files
        live = all(os.path.exists(f"{path}-{x}") for x in ("wal", "shm"))
        uri = f"file:{quote(str(path))}?mode=ro" + ("" if live else "&immutable=1")
        engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True))
    else:
        engine = db.make_engine(url, schema=schema, pool_size=1)
    try:
        with engine.connect() as conn:
            if migrations.is_empty(conn, schema=schema):
                return "empty: the ledger's tables are created at start-up"
            rev = migrations.current_revision(conn)
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        raise fail(f"{type(exc).__name__}: {' '.join(str(orig or exc).split())[:300]}") from None
    finally:
        engine.dispose()
    if rev == migrations.HEAD:
        return f"ledger at revision {rev} (current)"
    return f"ledger at revision {rev or 'before 0001'}: upgraded to {migrations.HEAD} at start-up"


def preload_generator(app: Any, cfg: ServiceConfig) -> None:
    """Load the generator before serving (the warm-up ``/readyz`` reports, joined), so the first generating
    request does not spend its deadline on loading the model.

    Raises:
      OSError: the generator failed to load (named).
    """
    st = app.state.service
    warm = st.start_warm_up()
    if warm is not None:
        warm.join()
    if st.warm_error:
        raise OSError(f"the generator ({cfg.generator.kind}) failed to load: {st.warm_error} (--preload)")
