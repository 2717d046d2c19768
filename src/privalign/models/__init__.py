"""Real models, offline: generators (prompts → n completions), scorers (texts → rewards), MiniLM embeddings
(and the ``EmbeddingFeatures`` feature map on them).

Heavy libraries (torch, transformers, onnxruntime, ...) are imported lazily by the classes that need them, so
``import privalign.models`` is cheap. See docs/models.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "SamplingParams",
    "Completion",
    "Generator",
    "TransformersGenerator",
    "OpenAICompatibleGenerator",
    "VLLMGenerator",
    "Scorer",
    "LinearRewardScorer",
    "HFRewardModelScorer",
    "VaderScorer",
    "ProfanityScorer",
    "GSM8KVerifier",
    "MATHVerifier",
    "MMLUVerifier",
    "MiniLMEmbedder",
    "EmbeddingFeatures",
]

_WHERE = {name: "generators" for name in __all__[:6]}
_WHERE.update({name: "scorers" for name in __all__[6:14]})
_WHERE["MiniLMEmbedder"] = "embeddings"
_WHERE["EmbeddingFeatures"] = "features"


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'privalign.models' has no attribute {name!r}")
    return getattr(import_module(f"privalign.models.{mod}"), name)
