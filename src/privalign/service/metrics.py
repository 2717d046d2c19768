"""Prometheus metrics of one service process (``GET /metrics``, text exposition format).

Each app owns its own ``CollectorRegistry`` (no process-global state), so several apps can live in one
process (tests) and counters start at zero per process. Nothing here carries a score, a prompt or a key
secret; the ``key`` label is never used (per-key spending is in ``GET /v1/budget`` only, for its owner).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["ServiceMetrics", "CONTENT_TYPE_LATEST"]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServiceMetrics:
    """Counters and histograms: requests, refusals, ε charged, scorer calls, latency."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "privalign_requests",
            "HTTP requests by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.refusals = Counter(
            "privalign_refusals", "Requests refused for lack of budget (429)", ["endpoint"], registry=r
        )
        self.epsilon_charged = Counter(
            "privalign_epsilon_charged",
            "Realized privacy cost charged (store units: ε, or ρ for zCDP keys)",
            ["accounting"],
            registry=r,
        )
        self.epsilon_reserved = Counter(
            "privalign_epsilon_reserved", "Worst-case cost reserved", ["accounting"], registry=r
        )
        self.scorer_calls = Counter("privalign_scorer_calls", "Calls of the private reward model", registry=r)
        self.selections = Counter(
            "privalign_selections", "Private selections released", ["method"], registry=r
        )
        self.cancelled = Counter(
            "privalign_reservations_cancelled", "Reservations released before scoring", registry=r
        )
        self.reconciled = Counter(
            "privalign_reservations_reconciled", "Stale reservations charged at reserved cost", registry=r
        )
        self.settle_failures = Counter(
            "privalign_settle_failures",
            "Deferred settles not written (the reservation stays charged at its reserved cost)",
            registry=r,
        )
        self.db_errors = Counter(
            "privalign_database_errors", "Requests answered 503 because the database failed", registry=r
        )
        self.overload = Counter(
            "privalign_overload",
            "Connections closed or requests refused by the overload limits, by reason",
            ["reason"],
            registry=r,
        )
        self.latency = Histogram(
            "privalign_request_latency_seconds", "Request latency", ["endpoint"], buckets=_BUCKETS, registry=r
        )

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)
