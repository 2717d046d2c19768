"""The steps of a pool build that a worker runs: build a generator or a scorer from its JSON-able spec,
clean the generated text, and score one prompt's completions into a scored-pool record.

A small module below :mod:`privalign.pipeline.build_pool` and :mod:`privalign.pipeline.ray_backend`: both
use it, so the Ray actors no longer import the builder that starts them (no import cycle).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privalign._validation import check_choice
from privalign.data.datasets import Example
from privalign.errors import DataFormatError

__all__ = [
    "GENERATOR_KINDS",
    "SCORER_NAMES",
    "generator_spec",
    "make_generator",
    "check_reward_name",
    "make_scorer",
    "sanitize_text",
    "score_texts",
    "reward_fields",
    "score_prompt",
]

GENERATOR_KINDS = ("transformers", "ctranslate2", "openai", "vllm")
SCORER_NAMES = ("vader", "vader-compound", "profanity", "clean", "gsm8k", "mmlu", "math", "none")


# ----------------------------------------------------------------------------------------------
# factories (specs → objects), used by the CLI and by Ray actors
# ----------------------------------------------------------------------------------------------
def generator_spec(
    kind: str,
    *,
    model: str | None = None,
    sampling: dict[str, Any] | None = None,
    stop: Sequence[str] = (),
    batch_size: int | None = None,
    chat_template: bool = True,
    assistant_prefix: str = "",
    num_threads: int | None = None,
    compute_type: str | None = None,
    reseed_block: int | None = None,
    base_url: str | None = None,
) -> dict[str, Any]:
    """The JSON spec of a generator: what :func:`make_generator` builds and a pool manifest records.

    Only the fields of ``kind`` are written (a pool's resume fingerprint is computed from the spec, so a field
    a backend ignores must not change it). ``reseed_block`` (CTranslate2 only): reseed once per block of
    that many candidates instead of once per prompt; ``None`` keeps the backend's default and leaves the field
    out.
    """
    kind = check_choice(kind, "generator", GENERATOR_KINDS)
    sampling = dict(sampling or {})
    if kind == "openai":
        return {"kind": kind, "base_url": base_url, "model": model, "sampling": sampling, "stop": list(stop)}
    if kind == "vllm":
        return {"kind": kind, "model": model, "sampling": sampling, "stop": list(stop)}
    spec: dict[str, Any] = {
        "kind": kind,
        "model": model or "smollm2",
        "batch_size": batch_size,
        "chat_template": chat_template,
        "assistant_prefix": assistant_prefix,
        "sampling": sampling,
        "stop": list(stop),
        "num_threads": num_threads,
    }
    if kind == "ctranslate2":
        spec["compute_type"] = compute_type
        if reseed_block is not None:
            spec["reseed"] = "block"
            spec["reseed_block"] = reseed_block
    return spec


def make_generator(spec: dict[str, Any]):
    """Build a generator from a JSON spec: ``{"kind": "transformers"|"ctranslate2"|"openai"|"vllm", ...}``."""
    from privalign.models.generators import (
        CTranslate2Generator,
        OpenAICompatibleGenerator,
        SamplingParams,
        TransformersGenerator,
        VLLMGenerator,
    )

    spec = dict(spec)
    kind = check_choice(spec.pop("kind", "transformers"), "generator", GENERATOR_KINDS)
    params = SamplingParams(**{**spec.pop("sampling", {}), "stop": tuple(spec.pop("stop", ()))})
    if kind == "transformers":
        return TransformersGenerator(spec.pop("model", None), params=params, **spec)
    if kind == "ctranslate2":
        return CTranslate2Generator(spec.pop("model", None), params=params, **spec)
    if kind == "openai":
        return OpenAICompatibleGenerator(spec.pop("base_url"), spec.pop("model"), params=params, **spec)
    return VLLMGenerator(spec.pop("model"), params=params, **spec)


def check_reward_name(name: str, param: str = "reward") -> str:
    """Validate a reward name without building it (so bad input is refused before any file is written)."""
    if not isinstance(name, str):
        raise TypeError(f"The '{param}' parameter must be a string. Got {name!r} instead.")
    if name.startswith("linear:"):
        if not Path(name[len("linear:") :]).expanduser().is_file():
            raise FileNotFoundError(
                f"The '{param}' parameter names a linear reward file that does not exist: {name[7:]!r}"
            )
        return name
    if name.startswith("hf:"):
        if not (Path(name[len("hf:") :]).expanduser() / "config.json").is_file():
            raise FileNotFoundError(
                f"The '{param}' parameter names an HF reward-model directory without config.json: "
                f"{name[3:]!r}"
            )
        return name
    return check_choice(name, param, SCORER_NAMES + ("linear:PATH", "hf:DIR"))


def make_scorer(name: str):
    """``vader`` (VADER compound → [0, 1]), ``vader-compound``, ``profanity``, ``clean`` (1 − profanity),
    ``gsm8k``/``mmlu``/``math`` (verifiers), ``linear:PATH`` (a saved linear reward), ``hf:DIR``
    (a local sequence-classification reward model), ``none``."""
    from privalign.models import scorers as S

    if name.startswith("linear:"):
        return S.LinearRewardScorer.load(name[len("linear:") :])
    if name.startswith("hf:"):
        return S.HFRewardModelScorer(name[len("hf:") :])
    check_choice(name, "reward", SCORER_NAMES + ("linear:PATH", "hf:DIR"))
    return {
        "vader": lambda: S.VaderScorer("unit"),
        "vader-compound": lambda: S.VaderScorer("compound"),
        "profanity": lambda: S.ProfanityScorer(),
        "clean": lambda: S.ProfanityScorer(invert=True),
        "gsm8k": S.GSM8KVerifier,
        "mmlu": S.MMLUVerifier,
        "math": S.MATHVerifier,
        "none": lambda: None,
    }[name]()


# ----------------------------------------------------------------------------------------------
# text hygiene and per-prompt scoring
# ----------------------------------------------------------------------------------------------
_SURROGATES = re.compile("[\ud800-\udfff]")


def sanitize_text(text: str, max_chars: int) -> tuple[str, dict[str, int]]:
    """Return ``(clean_text, flags)``: lone surrogates / invalid code points are replaced by U+FFFD
    (``non_utf8``; also set when the decoder already produced U+FFFD from a token cut inside a UTF-8
    character), texts longer than ``max_chars`` are cut (``over_long``), blank texts flagged ``empty``."""
    flags = {"empty": 0, "non_utf8": 0, "over_long": 0}
    try:
        text.encode("utf-8", "strict")
    except UnicodeEncodeError:
        flags["non_utf8"] = 1
        text = _SURROGATES.sub("\ufffd", text)
    if "\ufffd" in text:
        flags["non_utf8"] = 1
    if len(text) > max_chars:
        flags["over_long"] = 1
        text = text[:max_chars]
    if not text.strip():
        flags["empty"] = 1
    return text, flags


def score_texts(
    texts: Sequence[str], prompt: str, gt_answer: Any, proxy, true, prompt_index: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Proxy and true rewards of one prompt's texts (``None`` for an absent scorer); non-finite → error."""
    ctx = [{"prompt": prompt, "gt_answer": gt_answer}] * len(texts)
    pr = None if proxy is None else np.asarray(proxy.score(texts, contexts=ctx), dtype=float)
    tr = None if true is None else np.asarray(true.score(texts, contexts=ctx), dtype=float)
    for name, arr in (("proxy", pr), ("true", tr)):
        if arr is not None and not np.all(np.isfinite(arr)):
            raise DataFormatError(f"prompt {prompt_index}: the {name} scorer returned a non-finite reward")
    return pr, tr


def reward_fields(text: str, proxy_reward: float | None, true_reward: float | None, true) -> dict[str, Any]:
    """The reward fields of one scored response (verifiers also give ``predicted_answer``/``is_correct``)."""
    r: dict[str, Any] = {}
    if proxy_reward is not None:
        r["proxy_reward"] = float(proxy_reward)
    if true_reward is not None:
        r["true_reward"] = float(true_reward)
        if hasattr(true, "predict"):
            r["predicted_answer"] = true.predict(text)
            r["is_correct"] = bool(true_reward >= 0.5)
    return r


def score_prompt(
    example: Example, prompt_index: int, completions: Sequence[Any], proxy, true, max_chars: int
) -> tuple[dict[str, Any], dict[str, int]]:
    """Turn one prompt's completions into a scored-pool record (spec §5.3 + ``true_reward`` + ``meta``)."""
    counts = {"empty": 0, "non_utf8": 0, "over_long": 0, "hit_max_new_tokens": 0}
    texts = []
    for c in completions:
        t, f = sanitize_text(c.text, max_chars)
        for k, v in f.items():
            counts[k] += v
        counts["hit_max_new_tokens"] += int(c.finish_reason == "length")
        texts.append(t)
    pr, tr = score_texts(texts, example.prompt, example.gt_answer, proxy, true, prompt_index)
    if pr is None:
        pr = np.zeros(len(texts))
    responses = [
        {"text": t, **reward_fields(t, pr[j], None if tr is None else tr[j], true)}
        for j, t in enumerate(texts)
    ]
    rec: dict[str, Any] = {"prompt": example.prompt, "responses": responses}
    if example.choices:
        rec["choices"] = list(example.choices)
    if example.subject:
        rec["subject"] = example.subject
    if example.gt_answer is not None:
        rec["gt_answer"] = str(example.gt_answer)
    meta = {"prompt_index": int(prompt_index), "counts": counts}
    if example.label is not None:
        meta["label"] = int(example.label)
    if example.extra.get("review_index") is not None:
        meta["review_index"] = example.extra["review_index"]
    rec["meta"] = meta
    return rec, counts
