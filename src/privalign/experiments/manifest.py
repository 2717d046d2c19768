"""Run manifests: what was run, on what, with which code and seeds.

``manifest.json`` in a run directory records the experiment name, the resolved configuration and its
hash, the git commit and dirty flag of the source checkout, package versions, the root
``SeedSequence`` entropy, the machine, start and end times (UTC, ISO 8601), the input files with their
SHA-256, and a status: ``"complete"`` or ``"incomplete"`` (a run that was interrupted or failed; rerun
the same command to resume it).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from privalign.paths import repo_root

__all__ = [
    "build_manifest",
    "git_info",
    "package_versions",
    "machine_info",
    "file_sha256",
    "utc_now",
    "read_manifest",
    "REQUIRED_KEYS",
]

REQUIRED_KEYS = (
    "experiment",
    "config",
    "config_hash",
    "git",
    "packages",
    "seed_entropy",
    "machine",
    "started_at",
    "ended_at",
    "status",
    "inputs",
    "quick",
)

_PACKAGES = (
    "privalign",
    "numpy",
    "scipy",
    "matplotlib",
    "opendp",
    "dp-accounting",
    "tqdm",
    "torch",
    "transformers",
    "scikit-learn",
    "opacus",
)


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def git_info() -> dict[str, Any]:
    """Commit and dirty flag of the source checkout (``None`` when not in a git checkout)."""
    root = repo_root()
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_info() -> dict[str, Any]:
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        pass
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "memory_bytes": mem,
        "hostname_hash": hashlib.sha256(platform.node().encode()).hexdigest()[:12],
    }


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_manifest(
    *, experiment: str, config: dict, config_hash: str, seed_entropy: int, quick: bool, inputs: dict[str, Any]
) -> dict[str, Any]:
    """A fresh manifest with status ``"incomplete"`` (set to ``"complete"`` by the runner at the end)."""
    return {
        "experiment": experiment,
        "config": config,
        "config_hash": config_hash,
        "quick": quick,
        "git": git_info(),
        "packages": package_versions(),
        "seed_entropy": int(seed_entropy),
        "machine": machine_info(),
        "started_at": utc_now(),
        "ended_at": None,
        "status": "incomplete",
        "inputs": inputs,
        "argv": list(sys.argv),
    }


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    p = Path(run_dir) / "manifest.json"
    if not p.is_file():
        return None
    from privalign.errors import DataFormatError

    try:
        with p.open(encoding="utf-8") as fh:
            man = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{p}: not valid JSON ({exc}); not a readable privalign run manifest") from None
    if not isinstance(man, dict) or not isinstance(man.get("experiment"), str):
        raise DataFormatError(
            f"{p}: field 'experiment' is missing (a privalign run manifest is a JSON object naming its "
            "experiment)"
        )
    return man
