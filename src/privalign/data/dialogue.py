"""HH-RLHF transcripts: the first ``Human:`` turn of a ``"\\n\\nHuman: … \\n\\nAssistant: …"`` dialogue.

Used by the win-rate experiment and by the RLHF prompt set (:mod:`privalign.rlhf.prompts`), so it sits in
the data layer below both. (:func:`privalign.pipeline.hh.first_human_turn` is a different, older rule
kept for the pools it built.)
"""

from __future__ import annotations

__all__ = ["first_human_turn"]

_HUMAN = "\n\nHuman:"
_ASSISTANT = "\n\nAssistant:"


def first_human_turn(dialogue: str) -> str:
    """The text of the first ``Human:`` turn of an HH-RLHF transcript or prefix (stripped)."""
    i = dialogue.find(_HUMAN)
    body = dialogue[i + len(_HUMAN) :] if i >= 0 else dialogue
    j = body.find(_ASSISTANT)
    return (body[:j] if j >= 0 else body).strip()
