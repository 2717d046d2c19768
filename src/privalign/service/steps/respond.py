"""Step 6: the privacy block and the answer, encoded to bytes before anything is settled."""

from __future__ import annotations

from typing import Any

from privalign.service import db
from privalign.service import plan as planning
from privalign.service.components import Generation
from privalign.service.job import Job, Outcome, Reserved, encode, remaining_dict, unit_name

__all__ = ["respond", "usage"]


def usage(gen: Generation, idx: int) -> dict[str, int] | None:
    """OpenAI's ``usage`` of an answer, ``None`` if the generator did not count its tokens.

    ``prompt_tokens``: the prompt as fed to the generator, counted once; ``completion_tokens``: every
    token generated for the request, **all candidates together** (as OpenAI counts ``n`` choices);
    ``total_tokens``: their sum; ``selected_completion_tokens`` (when the generator counted each
    candidate): the returned candidate's own tokens. All are functions of the public prompt, the
    generator's randomness and the released selection, never of a score.
    """
    if gen.prompt_tokens is None or gen.completion_tokens is None:
        return None
    p, c = int(gen.prompt_tokens), int(gen.completion_tokens)
    out = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    own = gen.candidates[idx].num_tokens
    if own >= 0:
        out["selected_completion_tokens"] = int(own)
    return out


def _eps_of(*, realized: bool, plan: planning.Plan, ev: Any) -> float:
    for attr in (("epsilon_realized",) if realized else ("epsilon_max",)) + ("epsilon",):
        v = getattr(ev, attr, None)
        if v is not None:
            return float(v)
    return float(plan.epsilon)


def respond(
    job: Job, r: Reserved, idx: int, gen: Generation, realized: Any, units: tuple[int, int] | None
) -> Outcome:
    """Step 6: the privacy block and the answer (candidate ``idx`` of ``gen``, its finish reason and the
    request's token counts), encoded to bytes (before anything is settled)."""
    key = r.key
    block: dict[str, Any] = {
        "method": job.plan.method,
        "n": len(gen.candidates),
        "accounting": key.accounting,
        "defaulted": list(job.plan.defaulted),  # the privacy fields the server filled in
    }
    settle = None
    if r.receipt is not None:
        rc = r.receipt
        assert units is not None  # a receipt exists only for a private method, which is always charged
        block.update(
            {
                "epsilon_requested": job.plan.epsilon,
                "epsilon_reserved": _eps_of(realized=False, plan=job.plan, ev=job.plan.worst),
                "epsilon_charged": _eps_of(realized=True, plan=job.plan, ev=realized),
                "delta": float(getattr(realized, "delta", 0.0) or 0.0),
                "charged": db.from_units(units[0], db.EPS_SCALE),
                "reserved": db.from_units(rc.cost[0], db.EPS_SCALE),
                "charge_unit": unit_name(key),
                "remaining": remaining_dict(key, rc.remaining_after(units)),
                "reservation_id": rc.reservation_id,
            }
        )
        settle = (key.principal, rc.reservation_id, units, realized.to_dict())
    else:
        # Non-private (bon, or the benchmark baseline): no guarantee, nothing charged; ε = ∞ is not JSON.
        block.update(
            {"epsilon_requested": None, "epsilon_charged": None, "private": False, "guarantee": "none"}
        )
    chosen = gen.candidates[idx]
    body = job.render(idx, chosen.text, block, chosen.finish_reason, usage(gen, idx))
    if job.stream is not None:
        return Outcome(body, job.stream(body), "text/event-stream", block.get("reservation_id"), settle)
    return Outcome(body, encode(body), "application/json", block.get("reservation_id"), settle)
