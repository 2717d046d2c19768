"""Where privalign looks for data.

The data directory is configurable: ``PRIVALIGN_DATA_DIR`` if set, else the first existing of
``./shared/data``, ``../shared/data`` (relative to the working directory) and ``../shared/data``
relative to the repository root. Loaders say what is missing and where they looked.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_dir", "candidate_data_dirs", "repo_root", "user_cache_dir"]


def repo_root() -> Path:
    """The source checkout's root (two levels above ``src/privalign``)."""
    return Path(__file__).resolve().parents[2]


def candidate_data_dirs() -> list[Path]:
    env = os.environ.get("PRIVALIGN_DATA_DIR")
    if env:
        return [Path(env).expanduser()]
    cwd = Path.cwd()
    return [cwd / "shared" / "data", cwd.parent / "shared" / "data", repo_root().parent / "shared" / "data"]


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


def user_cache_dir() -> Path:
    """privalign's cache directory: ``$PRIVALIGN_CACHE_DIR``, else ``$XDG_CACHE_HOME/privalign``, else
    ``~/.cache/privalign`` (created on demand by the callers)."""
    env = os.environ.get("PRIVALIGN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "privalign"
