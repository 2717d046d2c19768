"""Test components for the service tests (importable by server subprocesses via PYTHONPATH).

* A deterministic linear reward model over hashed n-grams (the real :class:`LinearHashedScorer`),
  with weights written by :func:`write_reward_model`.
* :func:`sleepy_scorer`: the same model, sleeping first (crash test: kill -9 while scoring).
* :func:`make_upstream_app`: a minimal OpenAI-compatible upstream (stands in for vLLM) whose candidates
  are deterministic; ``fail=True`` answers 500. Its tokens are whitespace-separated words: a candidate
  longer than ``max_tokens`` words is cut (``finish_reason: "length"``), and ``usage`` counts the prompt's
  words once and the words of all ``n`` choices together, as vLLM counts tokens.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from privalign.service.components import LinearHashedScorer

GOOD = ("helpful", "kind", "clear", "correct", "polite")
BAD = ("rude", "wrong", "insult")


def write_reward_model(path: str | Path, *, n_features: int = 1024) -> Path:
    """Weights: +1 on GOOD words, −1 on BAD words (unigram buckets), 0 elsewhere; bias 0.5."""
    probe = LinearHashedScorer.__new__(LinearHashedScorer)
    probe.n_features, probe.ngram_range = n_features, (1, 1)
    w: dict[int, float] = {}
    for words, val in ((GOOD, 1.0), (BAD, -1.0)):
        for word in words:
            x = probe.features(word)
            j = int(np.flatnonzero(x)[0])
            w[j] = w.get(j, 0.0) + val * float(np.sign(x[j]))
    LinearHashedScorer.write(path, w, n_features=n_features, ngram_range=(1, 1), bias=0.5)
    return Path(path)


def sleepy_scorer(path: str, sleep_s: float = 30.0, marker: str | None = None):
    """The linear model, sleeping ``sleep_s`` before scoring; touches ``marker`` when scoring starts."""
    inner = LinearHashedScorer(path)

    def score(prompt, texts):
        if marker:
            Path(marker).write_text("scoring")
        time.sleep(sleep_s)
        return inner(prompt, texts)

    return score


def candidates_for(prompt: str, n: int) -> list[str]:
    words = GOOD + BAD + ("plain", "neutral")
    return [f"answer {i}: a {words[i % len(words)]} reply to {prompt[:20]}" for i in range(n)]


def _cut(texts: list[str], max_tokens: int) -> list[tuple[str, str]]:
    """Each text cut to its first ``max_tokens`` words, with its finish reason."""
    out = []
    for t in texts:
        words = t.split()
        out.append((" ".join(words[:max_tokens]), "length") if len(words) > max_tokens else (t, "stop"))
    return out


def _usage(prompt: str, choices: list[tuple[str, str]]) -> dict[str, int]:
    p, c = len(prompt.split()), sum(len(t.split()) for t, _ in choices)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def make_upstream_app(*, fail: bool = False):
    app = FastAPI()

    @app.post("/v1/completions")
    async def comp(req: Request):
        body = await req.json()
        if fail:
            return JSONResponse({"error": "boom"}, status_code=500)
        choices = _cut(candidates_for(body["prompt"], int(body.get("n", 1))), int(body.get("max_tokens", 16)))
        return {
            "choices": [{"index": i, "text": t, "finish_reason": f} for i, (t, f) in enumerate(choices)],
            "usage": _usage(body["prompt"], choices),
        }

    @app.post("/v1/chat/completions")
    async def chat(req: Request):
        body = await req.json()
        if fail:
            return JSONResponse({"error": "boom"}, status_code=500)
        last = body["messages"][-1]["content"]
        choices = _cut(candidates_for(last, int(body.get("n", 1))), int(body.get("max_tokens", 16)))
        return {
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": f}
                for i, (t, f) in enumerate(choices)
            ],
            "usage": _usage(" ".join(m["content"] for m in body["messages"]), choices),
        }

    return app
