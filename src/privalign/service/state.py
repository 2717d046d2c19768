"""``ServiceState``: everything one app instance owns (config, engine, store, components, noise,
metrics, worker pools), the deferred settles, readiness and reconciliation."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from privalign.errors import ReservationError
from privalign.service import db
from privalign.service.components import build_generator, build_scorer
from privalign.service.config import ServiceConfig
from privalign.service.fairness import KeyLimiter
from privalign.service.keys import KeyCache
from privalign.service.metrics import ServiceMetrics
from privalign.service.store import SQLBudgetStore

__all__ = ["ServiceState"]

log = logging.getLogger("privalign.service")


class ServiceState:
    """Everything one app instance owns: config, engine, store, components, noise, metrics, workers."""

    def __init__(
        self, cfg: ServiceConfig, *, scorer: Any = None, generator: Any = None, private: bool = True
    ) -> None:
        from privalign.rng import SecureNoise

        self.cfg = cfg
        self.private = private
        self.engine = db.make_engine(cfg.database.url, schema=cfg.database.schema or None)
        db.create_schema(self.engine, schema=cfg.database.schema or None)
        self.store = SQLBudgetStore(
            self.engine, durable=cfg.database.sync == "full", group_commit=cfg.database.group_commit
        )
        self.key_cache = KeyCache()
        self.scorer: Any = (
            scorer if scorer is not None else build_scorer(cfg.reward_model)
        )  # duck-typed plug-ins
        self.generator: Any = generator if generator is not None else build_generator(cfg.generator)
        self.noise = SecureNoise()
        self.metrics = ServiceMetrics()
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="privalign-work")
        # /healthz and /readyz ping the database here, not in the request thread pool that a flood fills
        self.ops_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="privalign-ops")
        lim = cfg.limits
        self.limiter = KeyLimiter(lim.key_concurrency, lim.key_units_per_s, lim.key_burst_units)
        # Deferred settles: the worker threads are joined at interpreter exit, so the settles queued
        # before a graceful shutdown are written. Not yet written: {principal: {reservation id: give-up
        # time}}, by budget principal (the key id, or the user's shared budget).
        self.settler = ThreadPoolExecutor(max_workers=2, thread_name_prefix="privalign-settle")
        self._pending: dict[str, dict[str, float]] = {}
        self._pending_cv = threading.Condition()
        self.started = time.time()
        # Readiness: a generator with a warm() hook is loading until warm_up() has returned; one without
        # is ready at once.
        self._warm = threading.Event()
        self.warm_error: str | None = None
        self._warming = False
        if not callable(getattr(self.generator, "warm", None)):
            self._warm.set()

    # -- readiness ----------------------------------------------------------------------------
    def start_warm_up(self) -> threading.Thread | None:
        """Load the generator in a background thread (``privalign serve`` does this at start-up), with a
        log line while it loads; :attr:`ready` is false until it has loaded. Without this call a generator
        loads on its first request, as before."""
        if self._warm.is_set():
            return None
        self._warming = True

        def work() -> None:
            t0 = time.monotonic()
            log.warning(
                "loading the generator (%s); /readyz answers 503 until it is warm", self.cfg.generator.kind
            )
            try:
                self.generator.warm()
            except Exception as exc:  # noqa: BLE001 - reported by /readyz
                self.warm_error = type(exc).__name__
                log.error("the generator failed to load: %s", type(exc).__name__)
                return
            log.warning("generator warm after %.1f s", time.monotonic() - t0)
            self._warm.set()

        t = threading.Thread(target=work, daemon=True, name="privalign-warm-up")
        t.start()
        return t

    @property
    def ready(self) -> bool:
        return self._warm.is_set()

    @property
    def loading(self) -> bool:
        """A warm-up was started and has not finished: generating endpoints answer 503 meanwhile."""
        return self._warming and not self._warm.is_set()

    # -- deferred settles ---------------------------------------------------------------------
    def settle_later(
        self, principal: str, reservation_id: str, units: tuple[int, int], event: dict
    ) -> Callable[[], Awaitable[None]]:
        """Register the settle of an answer that is about to be sent. Returns a coroutine function that the
        endpoint runs once the response has been sent (a Starlette background task, on the event loop); it
        hands the settle to a worker thread without waiting for it.

        Until it commits, the reservation stays charged at its reserved cost (≥ the charge), so every
        reservation decided meanwhile is at least as conservative. If it fails, never runs, or the process
        dies first, the reservation stays open and reconciliation charges its reserved cost (fail closed).
        """
        with self._pending_cv:
            self._pending.setdefault(principal, {})[reservation_id] = (
                time.monotonic() + self.cfg.limits.request_timeout_s
            )

        async def after_response() -> None:
            self.settler.submit(self._settle, principal, reservation_id, units, event)

        return after_response

    def _settle(self, principal: str, reservation_id: str, units: tuple[int, int], event: dict) -> None:
        try:
            self.store.settle(reservation_id, units=units, event=event)
        except ReservationError as exc:  # e.g. reconciled first: charged at the reserved cost
            self.metrics.settle_failures.inc()
            log.warning("deferred settle not written: %s", exc)
        except Exception as exc:  # noqa: BLE001 - database error: the reservation stays charged, reconciled later
            self.metrics.settle_failures.inc()
            log.error(
                "deferred settle failed: %s; the reservation stays charged at its reserved cost",
                type(exc).__name__,
            )
        finally:
            with self._pending_cv:
                mine = self._pending.get(principal, {})
                mine.pop(reservation_id, None)
                if not mine:
                    self._pending.pop(principal, None)
                self._pending_cv.notify_all()

    def pending_settles(self, principal: str) -> int:
        """How many deferred settles of budget ``principal`` (a key id, or a user's ``"u:" + name``) this
        process has not written yet (never blocks)."""
        with self._pending_cv:
            return len(self._pending.get(principal, {}))

    def wait_settled(self, principal: str | None = None, timeout: float | None = None) -> bool:
        """Wait until this process has written the deferred settles of budget ``principal`` (of every
        principal if ``None``) registered so far (tests, graceful shutdown). A settle that has not run within
        ``limits.request_timeout_s`` of its registration is given up. Returns ``False`` on ``timeout``."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._pending_cv:
            while True:
                now = time.monotonic()
                left = 0.0
                for k in [principal] if principal is not None else list(self._pending):
                    mine = self._pending.get(k, {})
                    for rid, give_up in list(mine.items()):
                        if give_up <= now:
                            del mine[rid]  # never ran: reconciliation charges it
                        else:
                            left = max(left, give_up - now)
                    if not mine:
                        self._pending.pop(k, None)
                if left == 0.0:
                    return True
                if end is not None:
                    if end <= now:
                        return False
                    left = min(left, end - now)
                self._pending_cv.wait(left)

    def reconcile(self) -> list[str]:
        """Charge stale open reservations at their reserved cost and delete expired stored answers."""
        done = self.store.reconcile_stale(older_than_s=self.cfg.privacy.reconcile_after_s)
        if done:
            self.metrics.reconciled.inc(len(done))
            log.warning("reconciled %d stale reservation(s) at their reserved cost", len(done))
        purged = self.store.purge_expired_answers()
        if purged:
            log.info("deleted %d expired stored answer(s)", purged)
        return done
