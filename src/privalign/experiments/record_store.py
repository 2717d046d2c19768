"""Resumable, identity-checked JSON records of a run (one store; the runner's context hands it out).

An experiment that trains or samples for minutes keeps each expensive result as a small JSON file under a
folder of its run directory (``RUN/records/ROUTE/seed-K/step-000050.json``, ``RUN/evals/POLICY/…``). Each
file carries an ``identity``: the SHA-256 of the public configuration (and seeds) that produced it
(:func:`identity`). A record is reused only when its identity equals the one asked for, so a changed
configuration recomputes instead of reading a stale result. An earlier run's folder (the committed
``docs/results/*/records`` or ``…/evals``) can stand behind the store as its *prior*: a record found there
with the right identity is copied into this run and reused.

An identity hashes public configuration only, never the private data (the records are committed; a hash of
the data would let anyone confirm a guess of the whole data set).

Obtain a store from the run context: ``ctx.records("records", prior=cfg.get("prior_results"))``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["RecordStore", "identity", "repo_path"]


def identity(obj: object) -> str:
    """The identity of a record produced from ``obj`` (public configuration and seeds): the SHA-256 of its
    canonical JSON (keys sorted; a value JSON cannot hold is written as its ``str``).

    >>> identity({"seed": 1, "steps": 50}) == identity({"steps": 50, "seed": 1})
    True
    """
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def repo_path(spec: str | Path) -> Path:
    """``spec`` as a path: ``~`` expanded; a relative path is taken from the source checkout's root (so
    ``prior_results = "docs/results/…"`` works from any working directory)."""
    from privalign.paths import repo_root

    p = Path(spec).expanduser()
    return p if p.is_absolute() else repo_root() / p


def _read(path: Path, ident: str) -> dict[str, Any] | None:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("identity") == ident else None


class RecordStore:
    """Identity-checked JSON records under ``root`` (a folder of the run), backed by an optional ``prior``
    folder of the same layout.

    Keys are paths relative to ``root`` (``"reference.json"``, ``"bon_RRIHT_eps8/seed-0/curve.json"``).
    """

    def __init__(self, root: Path, prior: Path | None = None) -> None:
        self.root = Path(root)
        self.prior = None if prior is None else Path(prior)

    def path(self, key: str) -> Path:
        """Where the record ``key`` lives in this run."""
        return self.root / key

    def find(self, key: str, ident: str) -> dict[str, Any] | None:
        """The record ``key`` whose identity is ``ident`` (with its ``identity`` field), from this run or else
        the prior folder; writes nothing (for checks made before a run starts)."""
        rec = _read(self.path(key), ident)
        if rec is None and self.prior is not None:
            rec = _read(self.prior / key, ident)
        return rec

    def get(self, key: str, ident: str) -> dict[str, Any] | None:
        """The record ``key`` whose identity is ``ident`` (with its ``identity`` field): from this run, else
        from the prior folder, copied into this run; ``None`` when neither has it."""
        rec = _read(self.path(key), ident)
        if rec is None and self.prior is not None:
            rec = _read(self.prior / key, ident)
            if rec is not None:
                self._write(key, rec)
        return rec

    def put(self, key: str, record: dict[str, Any], ident: str) -> dict[str, Any]:
        """Write ``record`` as ``key`` with identity ``ident`` (atomically; folders created); returns the
        record as written."""
        rec = {**record, "identity": ident}
        self._write(key, rec)
        return rec

    def _write(self, key: str, rec: dict[str, Any]) -> None:
        from privalign._json import write_json_atomic

        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, rec)
