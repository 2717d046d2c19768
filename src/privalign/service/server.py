"""Run the service with uvicorn (``privalign serve --config FILE``).

One process serves one app; run several processes (or hosts) against one PostgreSQL URL for replicas:
the ledger's row locks make them safe. A daemon thread reconciles stale reservations and deletes expired
stored answers every ``privacy.reconcile_after_s / 2`` seconds (start-up reconciliation happens in
:func:`create_app`). The generator is loaded in the background at start-up (``/readyz`` is 503 until it is
warm; ``/healthz`` is liveness only).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from privalign.service.config import ServiceConfig

__all__ = ["run"]

log = logging.getLogger("privalign.service")


def _reconciler(state, stop: threading.Event) -> None:  # noqa: ANN001
    period = max(1.0, state.cfg.privacy.reconcile_after_s / 2.0)
    while not stop.wait(period):
        try:
            state.reconcile()
        except Exception as exc:  # database down: try again next period
            log.warning("reconciliation failed: %s", type(exc).__name__)


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
        uvicorn.run(
            app,
            host=host or cfg.server.host,
            port=cfg.server.port if port is None else port,
            log_level=cfg.server.log_level,
            timeout_keep_alive=5,
            server_header=False,
            limit_concurrency=512,
        )
    finally:
        stop.set()
