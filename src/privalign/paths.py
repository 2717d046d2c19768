"""Where privalign looks for data.

The data directory is configurable: ``PRIVALIGN_DATA_DIR`` if set, else the first existing of
``./shared/data``, ``../shared/data`` (relative to the working directory) and ``../shared/data``
relative to the repository root. Loaders say what is missing and where they looked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, overload

__all__ = ["data_dir", "candidate_data_dirs", "repo_root"]


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
