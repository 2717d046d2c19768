"""Run the service with uvicorn (``privalign serve --config FILE``).

One process serves one app; run several processes (or hosts) against one PostgreSQL URL for replicas:
the ledger's row locks make them safe. A daemon thread reconciles stale reservations and deletes expired
stored answers every ``privacy.reconcile_after_s / 2`` seconds (start-up reconciliation happens in
:func:`create_app`). The generator is loaded in the background at start-up (``/readyz`` is 503 until it is
warm; ``/healthz`` is liveness only). The connection defences (header and body deadlines, connection
caps with idle eviction) are in :mod:`privalign.service.connections`; :func:`uvicorn_config` applies them.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from privalign.service.config import ServiceConfig
from privalign.service.connections import ConnectionGuard, GuardSettings, guarded_protocol

__all__ = [
    "check_listen",
    "check_summary",
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
    )


def uvicorn_config(cfg: ServiceConfig, app: Any, *, host: str | None = None, port: int | None = None) -> Any:
    """The ``uvicorn.Config`` that ``privalign serve`` runs: uvicorn's h11 protocol with the connection
    defences of :mod:`privalign.service.connections` (header and body deadlines, connection caps with idle
    eviction) and no ``limit_concurrency`` (it counts idle connections; requests in flight are limited by
    the app's :class:`~privalign.service.connections.InFlightLimit`)."""
    import uvicorn

    state = getattr(app.state, "service", None)

    def count(reason: str) -> None:
        if state is not None:
            state.metrics.overload.labels(reason).inc()

    guard = ConnectionGuard(guard_settings(cfg), count)
    return uvicorn.Config(
        app,
        host=host or cfg.server.host,
        port=cfg.server.port if port is None else port,
        log_level=cfg.server.log_level,
        http=guarded_protocol(guard),
        timeout_keep_alive=cfg.server.keep_alive_s,  # type: ignore[arg-type]  # call_later takes a float
        server_header=False,
        limit_concurrency=None,
        backlog=2048,
    )


def run(cfg: ServiceConfig, *, host: str | None = None, port: int | None = None, app: Any = None) -> None:
    """Serve ``cfg`` until interrupted.

    Args:
      cfg: validated config.
      host, port: override ``[server]``.
      app: an app already built from ``cfg`` by ``create_app`` (default: build it here).
    """
    import uvicorn

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
        uvicorn.Server(uvicorn_config(cfg, app, host=host, port=port)).run()
    finally:
        stop.set()


def check_listen(host: str, port: int) -> None:
    """Bind the listening address once, as uvicorn will (``SO_REUSEADDR``, IPv6 when the host has a
    colon), so that a busy or forbidden port is one line before anything is printed or loaded.

    Raises:
      ValueError: ``argument --port: cannot listen on HOST:PORT ...``.
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ValueError(
            f"argument --port: cannot listen on {host}:{port} (--host/--port, else [server].host/port): "
            f"{reason}"
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


def check_summary(cfg: ServiceConfig, app: Any) -> dict[str, Any]:
    """What ``privalign serve --check`` prints: the config's source, the database, the address, the
    methods, the reward model (with its privacy event) and the generator."""
    st = app.state.service
    rm = getattr(st.scorer, "model", st.scorer)
    return {
        "config": cfg.source,
        "database": st.engine.dialect.name,
        "database_url": cfg.database.url,
        "host": cfg.server.host,
        "port": cfg.server.port,
        "methods": list(cfg.privacy.allowed_methods),
        "reward_model": cfg.reward_model.kind,
        "reward_model_path": cfg.reward_model.options.get("path"),
        "reward_model_privacy_event": getattr(rm, "privacy_event", None),
        "generator": cfg.generator.kind,
    }


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
