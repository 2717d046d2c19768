"""Per-key fairness: a concurrency limit and a work-weighted token bucket per API key, checked at the start
of :func:`privalign.service.pipeline.run`, after authentication and **before** the reservation, so a
refusal (429, ``Retry-After``, ``x-should-retry: true``) is never charged.

Work units (the per-request cost floor): a request costs

    1 + ceil(Σ over its candidates of (prompt characters + candidate characters) / 1000)

units, where a generated candidate counts as ``4 × max_tokens`` characters (its worst case). A request
with 16 short candidates costs 2 units; one with 64 candidates of 8,000 characters costs 513. The bucket
of a key holds at most ``limits.key_burst_units`` and refills at ``limits.key_units_per_s``; a request
that does not find its units in the bucket is refused, with ``Retry-After`` the whole seconds until it
would. A budget of ε therefore buys at most ``key_units_per_s`` units of work per second, however small
the ε per request. ``limits.key_concurrency`` bounds the key's requests in flight in this process.
0 disables a limit. The limits are per process: replicas each apply them.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from starlette.responses import JSONResponse

from privalign.service.errors import ApiError
from privalign.service.job import Job
from privalign.service.plan import pool_size

__all__ = ["KeyLimiter", "KeyPrecheck", "work_units", "CHARS_PER_TOKEN", "SELECTING_PATHS"]

#: Characters a generated token is assumed to take (the upper end for English text).
CHARS_PER_TOKEN = 4


def work_units(job: Job) -> int:
    """The work units of ``job`` (see the module docstring)."""
    p = len(job.score_prompt)
    if job.candidates is not None:
        chars = sum(p + len(c) for c in job.candidates)
    else:
        mt = int(job.gen_kwargs.get("max_tokens", 256))
        chars = pool_size(job.plan) * (p + CHARS_PER_TOKEN * mt)
    return 1 + math.ceil(chars / 1000)


class KeyLimiter:
    """The per-key limits of one process (thread-safe)."""

    def __init__(self, concurrency: int, units_per_s: float, burst_units: float) -> None:
        self.concurrency, self.rate, self.burst = int(concurrency), float(units_per_s), float(burst_units)
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._bucket: dict[str, tuple[float, float]] = {}  # key id -> (tokens, at)
        self._need: dict[str, int] = {}  # key id -> units of its last request refused for its rate

    def _refused(self, message: str, code: str, retry_after: float) -> ApiError:
        return ApiError(
            429,
            "rate_limit_error",
            message + " Nothing was charged.",
            retry=True,
            headers={"Retry-After": str(max(1, math.ceil(retry_after))), "x-should-retry": "true"},
            code=code,
            param=None,
        )

    def _take(self, key_id: str, units: int) -> None:
        """Take ``units`` from the key's bucket or raise the 429 (lock held)."""
        now = time.monotonic()
        tokens, at = self._bucket.get(key_id, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if units > self.burst:
            raise self._refused(
                f"This request costs {units} work units, more than this key's burst of {self.burst:g} "
                "(limits.key_burst_units): send fewer or shorter candidates.",
                "request_too_costly",
                0,
            )
        if tokens < units:
            self._bucket[key_id] = (tokens, now)
            self._need[key_id] = units  # the precheck refuses the key's requests until this much is back
            raise self._refused(
                f"This key's rate limit ({self.rate:g} work units/s, burst {self.burst:g}) is reached; "
                f"this request costs {units} units.",
                "key_rate_limit_exceeded",
                (units - tokens) / self.rate,
            )
        self._bucket[key_id] = (tokens - units, now)
        self._need.pop(key_id, None)
        if len(self._bucket) > 100_000:  # forget full buckets (idle keys)
            full = [k for k, (t, a) in self._bucket.items() if t + (now - a) * self.rate >= self.burst]
            for k in full:
                del self._bucket[k]
                self._need.pop(k, None)

    def precheck(self, key_id: str) -> ApiError | None:
        """The 429 for a request of ``key_id`` whose body is not read yet: all its slots are taken, or its
        bucket holds fewer units than its last request refused for its rate (1 if none), else ``None``.
        A key refused for a heavy request is thus refused unread until that request would fit (at most
        ``burst / rate`` seconds, the ``Retry-After`` it was told). Changes nothing."""
        with self._lock:
            if self.concurrency and self._running.get(key_id, 0) >= self.concurrency:
                return self._refused(
                    f"This key already has {self.concurrency} requests in flight (limits.key_concurrency).",
                    "key_concurrency_exceeded",
                    1,
                )
            if self.rate > 0 and self.burst > 0 and key_id in self._bucket:
                tokens, at = self._bucket[key_id]
                tokens = min(self.burst, tokens + (time.monotonic() - at) * self.rate)
                need = self._need.get(key_id, 1)
                if tokens < need:
                    return self._refused(
                        f"This key's rate limit ({self.rate:g} work units/s, burst {self.burst:g}) is "
                        f"reached; its last refused request cost {need} units.",
                        "key_rate_limit_exceeded",
                        (need - tokens) / self.rate,
                    )
        return None

    def acquire(self, key_id: str, job: Job) -> None:
        """Take one of the key's slots and the job's units, or raise the 429 (the bucket is not charged
        for a request refused for lack of a slot). Every successful call needs one :meth:`release`."""
        with self._lock:
            if self.concurrency and self._running.get(key_id, 0) >= self.concurrency:
                raise self._refused(
                    f"This key already has {self.concurrency} requests in flight (limits.key_concurrency).",
                    "key_concurrency_exceeded",
                    1,
                )
            if self.rate > 0 and self.burst > 0:
                self._take(key_id, work_units(job))
            self._running[key_id] = self._running.get(key_id, 0) + 1

    def release(self, key_id: str) -> None:
        with self._lock:
            left = self._running[key_id] - 1
            if left:
                self._running[key_id] = left
            else:
                del self._running[key_id]


#: The selecting endpoints (the only ones the per-key limits apply to).
SELECTING_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/select"})


class KeyPrecheck:
    """Pure ASGI middleware: a selecting request whose bearer token matches a key of the key cache (a key
    this process has authenticated, checked against its remembered hash) is refused with the key's 429
    **before its body is read or parsed** when :meth:`KeyLimiter.precheck` says it would be. A flooding key
    therefore costs the server little more than its bytes. Unknown tokens pass (they are checked after
    validation, as always)."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):  # noqa: ANN001
        if scope["type"] == "http" and scope.get("path") in SELECTING_PATHS and self.state.private:
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            token = auth[7:].strip().decode("latin-1") if auth[:7].lower() == b"bearer " else None
            key = self.state.key_cache.verify(token) if token else None
            refusal = self.state.limiter.precheck(key.key_id) if key is not None else None
            if refusal is not None:
                self.state.metrics.overload.labels(str(refusal.extra.get("code"))).inc()
                body = {"error": {"message": refusal.message, "type": refusal.type, **refusal.extra}}
                # close the connection: its unread body is dropped, not parsed by the server
                resp = JSONResponse(body, status_code=429, headers={**refusal.headers, "connection": "close"})
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)
