"""Idempotent answers: a request's Idempotency-Key, its stored answer and its expiry. Shares only the
engine with the ledger."""

from __future__ import annotations

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from privalign.service import db


class IdempotencyConflict(Exception):
    """An attempt with this Idempotency-Key is in progress or was interrupted.

    ``charged``: whether that attempt holds a reservation (``True``: a retry with this key is never run
    again; ``False``: it holds nothing yet, a later retry may run; ``None``: unknown, treated as charged).
    ``final``: no retry with this key will ever be run or replayed (the attempt holds a charge and is
    over without a stored answer); ``False``: the attempt may still be running, a later retry gets its
    stored answer (or, if it holds nothing, runs)."""

    def __init__(self, message: str, *, charged: bool | None = None, final: bool = False) -> None:
        super().__init__(message)
        self.charged = charged
        self.final = final


class IdempotencyMismatch(Exception):
    """This Idempotency-Key was used with a different request."""


_IN_PROGRESS = (
    "A request with this Idempotency-Key is in progress and holds no charge yet; retry in a few seconds. "
    "Nothing was charged for this one."
)
_IN_PROGRESS_CHARGED = (
    "A request with this Idempotency-Key is in progress: it holds a charge (at most its reserved cost) and "
    "its answer is not stored yet. Retry in a second with the same key and body: the stored answer is "
    "replayed, never charged again. Nothing was charged for this one."
)
_ANSWER_LOST = (
    "A request with this Idempotency-Key holds a charge (at most its reserved cost) and is over without a "
    "stored answer (it was interrupted, or its answer could not be stored while the database failed). It is "
    "neither run again nor replayed: send a new request with a new Idempotency-Key. Nothing was charged for "
    "this one."
)


class IdempotentAnswers:
    """The idempotency operations of :class:`~privalign.service.store.SQLBudgetStore`."""

    engine: Engine

    def idempotency_begin(
        self,
        principal: str,
        idem_key: str,
        request_hash: str,
        *,
        ttl_s: float,
        reservation_id: str | None = None,
        stale_after_s: float | None = None,
        in_progress_s: float | None = None,
    ) -> tuple[int, str] | None:
        """Start an attempt of a request carrying an ``Idempotency-Key``.

        Args:
          reservation_id: the id the attempt will reserve under (recorded on the pending row, so that a
            later retry can tell from the ledger whether the attempt holds a charge).
          stale_after_s: a pending attempt older than this that holds no reservation (never reserved, or
            cancelled) is dead (the service passes ``privacy.reconcile_after_s``, after which it also
            charges open reservations as abandoned): this attempt takes its key over. ``None``: never.
          in_progress_s: a pending attempt that holds a reservation (or may: none recorded) and is younger
            than this may still be running (or storing its answer): the conflict is not ``final``. Older,
            or ``None``: it is over without a stored answer, the conflict is ``final``. The service
            passes ``privacy.reconcile_after_s``, the age after which it treats a request as dead.

        Returns:
          ``(status_code, response JSON text)`` of a completed, unexpired attempt with the same key and
          request; ``None`` when a pending attempt was recorded (the caller runs the request). An expired
          row is replaced.

        Raises:
          IdempotencyConflict: an attempt with this key is in progress or was interrupted; its
            ``charged`` says whether it holds a reservation (read from the ledger), its ``final``
            whether it is over without a stored answer (see ``in_progress_s``).
          IdempotencyMismatch: this key was used with a different request.
        """
        t = db.now()
        tbl = db.idempotency
        cond = (tbl.c.principal == principal) & (tbl.c.idem_key == idem_key)
        pending = {
            "status": "pending",
            "reservation_id": reservation_id,
            "created_at": t,
            "expires_at": t + ttl_s,
        }
        with self.engine.begin() as conn:
            row = conn.execute(select(tbl).where(cond)).mappings().first()
            if (
                row is not None
                and row["expires_at"] is not None
                and row["expires_at"] <= t
                and row["status"] == "done"
            ):
                conn.execute(delete(tbl).where(cond))
                row = None
            if row is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            tbl.insert().values(
                                principal=principal, idem_key=idem_key, request_hash=request_hash, **pending
                            )
                        )
                    return None
                except IntegrityError:
                    raise IdempotencyConflict(_IN_PROGRESS, charged=False) from None
        if row["request_hash"] != request_hash:
            raise IdempotencyMismatch("This Idempotency-Key was used with a different request body.")
        if row["status"] == "done":
            return int(row["status_code"]), row["response"]
        charged = self._attempt_charged(row["reservation_id"])
        if charged is False and stale_after_s is not None and row["created_at"] <= t - stale_after_s:
            with self.engine.begin() as conn:  # take the dead attempt's key over (once, whatever the race)
                res = conn.execute(
                    update(tbl)
                    .where(cond, tbl.c.status == "pending", tbl.c.created_at == row["created_at"])
                    .values(**pending)
                )
            if res.rowcount == 1:
                return None
        if charged is False:
            raise IdempotencyConflict(_IN_PROGRESS, charged=False)
        may = (lambda m: m) if charged else (lambda m: m.replace("holds a charge", "may hold a charge"))
        if in_progress_s is not None and row["created_at"] > t - in_progress_s:
            raise IdempotencyConflict(may(_IN_PROGRESS_CHARGED), charged=charged)
        raise IdempotencyConflict(may(_ANSWER_LOST), charged=charged, final=True)

    def _attempt_charged(self, reservation_id: str | None) -> bool | None:
        """Whether the attempt that reserves under ``reservation_id`` holds a charge: its reservation is
        written and not cancelled. ``None`` when no id was recorded (unknown)."""
        if reservation_id is None:
            return None
        led = db.ledger
        with self.engine.connect() as conn:
            actions = set(
                conn.execute(select(led.c.action).where(led.c.reservation_id == reservation_id)).scalars()
            )
        return "reserve" in actions and "cancel" not in actions

    def idempotency_finish(
        self,
        principal: str,
        idem_key: str,
        *,
        status_code: int | None,
        response: str | None,
        reservation_id: str | None,
        ttl_s: float,
        attempt: str | None = None,
    ) -> None:
        """Store the answer of an attempt (``response``: the answer's text, or the body of a charged error
        with its ``status_code``; replayed as is), or, with ``response=None``, drop its
        pending row (a refusal that charged nothing: the client may retry with the same key).
        ``attempt``: the reservation id the attempt began with; only its own row is changed (not one a
        later attempt took over)."""
        tbl = db.idempotency
        cond = (tbl.c.principal == principal) & (tbl.c.idem_key == idem_key)
        if attempt is not None:
            cond = cond & (tbl.c.reservation_id == attempt)
        with self.engine.begin() as conn:
            if response is None:
                conn.execute(delete(tbl).where(cond & (tbl.c.status == "pending")))
            else:
                conn.execute(
                    update(tbl)
                    .where(cond)
                    .values(
                        status="done",
                        status_code=status_code,
                        response=response,
                        reservation_id=reservation_id,
                        expires_at=db.now() + float(ttl_s),
                    )
                )

    def purge_expired_answers(self) -> int:
        """Delete idempotency rows whose ``expires_at`` has passed: stored answers, and pending rows of
        interrupted attempts (answered 409 until then). Returns the number of rows deleted."""
        tbl = db.idempotency
        with self.engine.begin() as conn:
            res = conn.execute(delete(tbl).where(tbl.c.expires_at.is_not(None), tbl.c.expires_at <= db.now()))
        return int(res.rowcount or 0)
