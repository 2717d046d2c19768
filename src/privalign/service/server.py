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

__all__ = ["run", "uvicorn_config", "guard_settings"]

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
