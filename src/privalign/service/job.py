"""The data that flows along the path: a validated request (:class:`Job`), its reservation
(:class:`Reserved`) and its encoded answer (:class:`Outcome`); the filters used as currency; JSON encoding."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from privalign.accounting import filters as F
from privalign.service import db
from privalign.service import plan as planning
from privalign.service.keys import KeyInfo
from privalign.service.store import Receipt

__all__ = ["FILTERS", "Job", "Reserved", "Outcome", "encode", "remaining_dict", "unit_name"]

#: The filter of each accounting mode, used for its currency only (cost of an event, charge of a realized
#: event); the limit is the key's granted budget in the ledger, so the filters' own budgets are unused.
FILTERS: dict[str, F.PrivacyFilter] = {
    "pure": F.PureDPFilter(1.0),
    "zcdp": F.ZCDPFilter(1.0),
    "ex-post": F.ExPostFilter(1.0, 0.5),
}


def encode(body: Any) -> bytes:
    """JSON bytes of an answer (UTF-8; NaN/Infinity refused)."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


@dataclass
class Job:
    """One validated selecting request.

    ``render(index, text, privacy_block, finish_reason, usage) -> dict`` builds the answer body from the
    selected candidate (its index, text and finish reason), the privacy block and the request's token
    counts (OpenAI's ``usage``, ``None`` if the generator did not count); ``stream`` (optional) turns that
    body into the bytes of a server-sent-event stream.
    """

    endpoint: str
    plan: planning.Plan
    prompt: Any
    score_prompt: str
    candidates: list[str] | None
    gen_kwargs: dict[str, Any]
    render: Callable[[int, str, dict, str, dict[str, int] | None], dict]
    stream: Callable[[dict], bytes] | None = None


@dataclass
class Reserved:
    """The outcome of :func:`reserve`: the key (re-authenticated if needed) and, for a private method,
    the filter, the filter's reservation and the store's receipt."""

    key: KeyInfo
    flt: F.PrivacyFilter | None = None
    reservation: F.Reservation | None = None
    receipt: Receipt | None = None


@dataclass
class Outcome:
    """An answer ready to send: its encoded body, and the settle to run (``None`` if nothing to charge)."""

    body: dict
    content: bytes
    media_type: str
    reservation_id: str | None = None
    settle: tuple[str, str, tuple[int, int], dict] | None = field(default=None)


def unit_name(key: KeyInfo) -> str:
    return "rho" if key.accounting == "zcdp" else "epsilon"


def remaining_dict(key: KeyInfo, units: tuple[int, int]) -> dict[str, float]:
    return {
        unit_name(key): db.from_units(units[0], db.EPS_SCALE),
        "delta": db.from_units(units[1], db.DELTA_SCALE),
    }
