"""The selected answer as a server-sent-event stream, in OpenAI's chunk formats.

Nothing can be streamed while the candidates are generated and scored: the answer exists only once the
private selection has been made, and the whole stream is encoded before the charge is finalised (like
any answer; :func:`privalign.service.steps.respond`). The stream then carries the selected text in
word-sized pieces (:func:`pieces`: each word with the whitespace before it), one chunk each, all sent at
once: a client's streaming code works unchanged, but the first piece arrives when the whole answer does.

Chat (``chat.completion.chunk``): a role chunk, one chunk per piece, a finish chunk (empty delta,
``finish_reason``, and the ``privacy`` block); with ``stream_options.include_usage`` every chunk has
``"usage": null`` and a last chunk with no choices carries ``usage``; then ``data: [DONE]``. Text
completions (``text_completion``): one chunk per piece, the finish chunk, the usage chunk if asked for.
"""

from __future__ import annotations

import re
from typing import Any

from privalign.service.job import encode

__all__ = ["pieces", "chat_stream", "completion_stream"]

_PIECE = re.compile(r"\s*\S+|\s+")


def pieces(text: str) -> list[str]:
    """``text`` cut into word-sized pieces (each word with the whitespace before it; trailing whitespace
    last) whose concatenation is ``text``; ``[]`` for the empty string."""
    return _PIECE.findall(text)


def _base(body: dict, obj: str, include_usage: bool) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": body["id"],
        "object": obj,
        "created": body["created"],
        "model": body["model"],
    }
    if include_usage:
        base["usage"] = None
    return base


def _events(base: dict, body: dict, choices: list[dict], finish: dict, include_usage: bool) -> bytes:
    events = [{**base, "choices": [c]} for c in choices]
    events.append({**base, "choices": [finish], "privacy": body["privacy"]})
    if include_usage:
        events.append({**base, "choices": [], "usage": body["usage"]})
    return b"".join(b"data: " + encode(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chat_stream(body: dict, *, include_usage: bool = False) -> bytes:
    """A ``chat.completion`` answer ``body`` as a ``chat.completion.chunk`` stream (see the module
    docstring)."""
    first = body["choices"][0]

    def delta(d: dict) -> dict:
        return {"index": 0, "delta": d, "finish_reason": None, "logprobs": None}

    choices = [delta({"role": "assistant", "content": ""})]
    choices += [delta({"content": p}) for p in pieces(first["message"]["content"])]
    finish = {"index": 0, "delta": {}, "finish_reason": first["finish_reason"], "logprobs": None}
    return _events(_base(body, "chat.completion.chunk", include_usage), body, choices, finish, include_usage)


def completion_stream(body: dict, *, include_usage: bool = False) -> bytes:
    """A ``text_completion`` answer ``body`` as a stream of ``text_completion`` chunks (see the module
    docstring)."""
    first = body["choices"][0]
    choices = [
        {"index": 0, "text": p, "finish_reason": None, "logprobs": None} for p in pieces(first["text"])
    ]
    finish = {"index": 0, "text": "", "finish_reason": first["finish_reason"], "logprobs": None}
    return _events(_base(body, "text_completion", include_usage), body, choices, finish, include_usage)
