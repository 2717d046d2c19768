"""One JSON convention for everything privalign writes (CLI ``--json``, ``results.json``, manifests).

Non-finite policy (the only one): ``+∞ → "inf"``, ``−∞ → "-inf"`` (an ε of a non-private method is a real,
meaningful ∞), ``NaN → null`` (an undefined value, e.g. a mean over zero prompts). numpy scalars and arrays
become Python numbers and lists, tuples become lists. The output is always strict JSON (``allow_nan=False``:
no ``Infinity``/``NaN`` tokens). :func:`from_jsonable` reads ``"inf"``/``"-inf"`` back.

Experiment *records* (``results.jsonl``) follow a stricter, separate contract checked by the runner: they must
be finite and use ``null`` for "not applicable" (:func:`privalign.experiments.runner.check_finite_records`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["to_jsonable", "from_jsonable", "dumps", "write_json_atomic", "write_text_atomic"]


def to_jsonable(obj: Any) -> Any:
    """``obj`` with the non-finite policy applied, recursively (dict values, lists, tuples, numpy values).

    >>> to_jsonable({"eps": float("inf"), "mean": float("nan"), "n": np.int64(3), "xs": (1.5, -np.inf)})
    {'eps': 'inf', 'mean': None, 'n': 3, 'xs': [1.5, '-inf']}
    """
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    return obj


def from_jsonable(obj: Any) -> Any:
    """The inverse of the ∞ rule: ``"inf"``/``"-inf"`` → ``±math.inf``, recursively (``null`` stays ``None``).

    >>> from_jsonable({"eps": "inf", "xs": ["-inf", 2.0, "text"]})
    {'eps': inf, 'xs': [-inf, 2.0, 'text']}
    """
    if obj == "inf":
        return math.inf
    if obj == "-inf":
        return -math.inf
    if isinstance(obj, dict):
        return {k: from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_jsonable(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`to_jsonable` of ``obj`` (strict JSON; keyword arguments pass through).

    >>> dumps({"epsilon": float("inf"), "rho": np.float32(0.5)})
    '{"epsilon": "inf", "rho": 0.5}'
    """
    return json.dumps(to_jsonable(obj), allow_nan=False, **kwargs)


def write_json_atomic(path: Path, data: Any, *, sort_keys: bool = True) -> None:
    """Write JSON through a temporary file and ``os.replace`` (never a half-written file).

    ``data`` is written as given (strict JSON: a NaN or ∞ raises ``ValueError``; apply :func:`to_jsonable`
    first to use the convention above).
    """
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=sort_keys, allow_nan=False)
        fh.write("\n")
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str, *, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory (created owner-only by
    ``mkstemp``), set ``mode``, then ``os.replace``: never a half-written file, and a file meant to be
    owner-only (``mode=0o600``) is never readable by others, not even while it is written. Creates the
    parent directory; the temporary file is removed on any failure."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
