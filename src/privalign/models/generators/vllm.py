"""``VLLMGenerator``: vLLM in-process (optional, GPU only; import-guarded)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from privalign.models._resources import package_version, require
from privalign.models.generators.base import (
    Completion,
    SamplingParams,
    candidate_seed,
)


class VLLMGenerator:
    """vLLM in-process (GPU only; optional ``vllm`` package). Not exercised by the CPU test suite.

    Uses ``SamplingParams(n=n, seed=...)`` per prompt with the per-prompt seed
    ``candidate_seed(seed, i, 0)``; results are reproducible for a fixed vLLM version and GPU.
    """

    def __init__(self, model: str, *, params: SamplingParams | None = None, **llm_kwargs: Any) -> None:
        self._vllm = require("vllm", purpose="VLLMGenerator (GPU)")
        self.params = params or SamplingParams()
        self.model_id = model
        self._llm = self._vllm.LLM(model=model, **llm_kwargs)

    def format_prompt(self, prompt: str) -> str:
        return prompt

    def generate(
        self, prompts: Sequence[str], n: int, *, seed: int, prompt_indices: Sequence[int] | None = None
    ) -> list[list[Completion]]:  # pragma: no cover - needs a GPU
        idxs = list(range(len(prompts))) if prompt_indices is None else list(prompt_indices)
        p = self.params
        sps = [
            self._vllm.SamplingParams(
                n=n,
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k or -1,
                max_tokens=p.max_new_tokens,
                stop=list(p.stop) or None,
                seed=candidate_seed(seed, i, 0) % (2**31),
            )
            for i in idxs
        ]
        outs = self._llm.generate(list(prompts), sps)
        return [
            [
                Completion(text=o.text, num_tokens=len(o.token_ids), finish_reason=o.finish_reason or "stop")
                for o in r.outputs
            ]
            for r in outs
        ]

    def describe(self) -> dict[str, Any]:  # pragma: no cover
        return {
            "backend": "vllm",
            "model": self.model_id,
            "sampling": self.params.to_dict(),
            "vllm": package_version("vllm"),
        }
