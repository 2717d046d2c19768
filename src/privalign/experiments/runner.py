"""Run an experiment into a run directory: checks first, then cells, then summary and figures.

Run directory layout::

    DIR/manifest.json     what was run (see :mod:`privalign.experiments.manifest`)
    DIR/results.jsonl     one JSON object per line; each carries the ``cell`` it belongs to
    DIR/summary.json      computed from results.jsonl only
    DIR/figures/*.png|pdf drawn from the run directory only

Order of work: the experiment name, the configuration, the run directory and the inputs (the
experiment's ``preflight``) are all checked **before** anything is written. A directory that holds a
*different* run (another experiment or another configuration hash) is refused. A directory that holds an
interrupted run of the same configuration is resumed: cells already in ``results.jsonl`` are skipped, and
the remaining cells get the same seeds they would have had. Each cell's records are appended in one write;
a torn last line is dropped on resume.

Seeds: one root seed (the config key ``seed``, logged in the manifest as ``seed_entropy``); cell ``i`` uses
``numpy.random.SeedSequence(seed, spawn_key=(i,))``, i.e. the ``i``-th child of the root.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privalign._json import write_json_atomic
from privalign.errors import DataFormatError
from privalign.experiments.base import Experiment, ExperimentError, RunContext, RunDirectoryError
from privalign.experiments.config import (
    config_hash,
    load_config,
    packaged_config_path,
    validate_config,
)
from privalign.experiments.manifest import build_manifest, read_manifest, utc_now

__all__ = [
    "run_experiment",
    "read_results",
    "read_summary",
    "cell_seed",
    "check_finite_records",
    "prepare",
]


def cell_seed(root_seed: int, index: int) -> np.random.SeedSequence:
    """The seed of cell ``index``: the ``index``-th child of ``SeedSequence(root_seed)``."""
    return np.random.SeedSequence(root_seed, spawn_key=(index,))


def check_finite_records(records: list[dict], where: str) -> None:
    """Refuse NaN/inf in records (use ``None`` for "not applicable")."""

    def walk(v, path):
        if isinstance(v, float) and not math.isfinite(v):
            raise ExperimentError(f"{where}: record field {path!r} is {v!r}; records must be finite.")
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else k)
        elif isinstance(v, list | tuple):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")

    for r in records:
        walk(r, "")


def read_results(run_dir: str | Path) -> list[dict]:
    """All complete records of ``results.jsonl`` (a torn last line is ignored)."""
    p = Path(run_dir) / "results.jsonl"
    if not p.is_file():
        return []
    out = []
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.endswith("\n"):
                break  # torn write
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataFormatError(
                        f"{p}:{lineno}: not valid JSON ({exc.msg}); a damaged run"
                    ) from None
    return out


def read_summary(run_dir: str | Path) -> dict:
    p = Path(run_dir) / "summary.json"
    if not p.is_file():
        return {}
    try:
        with p.open(encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{p}: not valid JSON ({exc}); a damaged run") from None


def _truncate_torn_line(path: Path) -> None:
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        path.write_bytes(data[:cut])


def resolve_config(
    exp: Experiment, config_path: str | Path | None, quick: bool, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Load the experiment's configuration: ``config_path`` or the packaged (quick) one, then overrides."""
    if config_path is None:
        config_path = packaged_config_path(exp.config_name + ("_quick" if quick else ""))
    cfg = load_config(config_path, exp.schema)
    if overrides:
        cfg = validate_config({**cfg, **overrides}, exp.schema, source=f"{config_path} + overrides")
    return cfg


def _config_diff(old: Any, new: dict) -> str:
    """`` (keys that differ: a, b)`` between a run's recorded configuration and this one ('' if unknown)."""
    if not isinstance(old, dict):
        return ""
    keys = sorted(k for k in set(old) | set(new) if old.get(k, "<absent>") != new.get(k, "<absent>"))
    if not keys:
        return ""
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return f" (keys that differ: {shown})"


def _check_run_dir(out: Path, name: str, chash: str, cfg: dict | None = None) -> dict | None:
    """Return the manifest of a resumable run in ``out``, ``None`` for a fresh directory; else raise."""
    if out.exists() and not out.is_dir():
        raise RunDirectoryError(f"Output path {out} exists and is not a directory.")
    if not out.exists():
        return None
    man = read_manifest(out)
    if man is None:
        if any(out.iterdir()):
            raise RunDirectoryError(
                f"Output directory {out} is not empty and holds no privalign run (no manifest.json). "
                "Choose an empty or new --out directory."
            )
        return None
    if man.get("experiment") != name or man.get("config_hash") != chash:
        diff = _config_diff(man.get("config"), cfg or {}) if man.get("experiment") == name else ""
        raise RunDirectoryError(
            f"Output directory {out} already holds a different run (experiment {man.get('experiment')!r}, "
            f"config hash {str(man.get('config_hash'))[:12]}…; this run: experiment {name!r}, config hash "
            f"{chash[:12]}…){diff}. "
            "Choose another --out directory or delete that one."
        )
    return man


@dataclass
class Prepared:
    exp: Experiment
    config: dict
    chash: str
    out: Path
    ctx: RunContext
    existing: dict | None


def prepare(
    name: str,
    *,
    out: str | Path,
    config_path: str | Path | None = None,
    quick: bool = False,
    overrides: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> Prepared:
    """Every check that must pass before work starts (name, config, run directory, inputs)."""
    from privalign.experiments.registry import get_experiment

    exp = get_experiment(name)
    cfg = resolve_config(exp, config_path, quick, overrides)
    chash = config_hash(exp.name, cfg)
    out = Path(out)
    existing = _check_run_dir(out, exp.name, chash, cfg)
    ctx = RunContext(run_dir=out, quick=quick, progress=progress)
    exp.preflight(cfg, ctx)
    return Prepared(exp, cfg, chash, out, ctx, existing)


def run_experiment(
    name: str,
    *,
    out: str | Path,
    config_path: str | Path | None = None,
    quick: bool = False,
    overrides: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> dict:
    """Run (or resume) experiment ``name`` into ``out``; return the summary.

    Raises:
      ExperimentError: unknown experiment or unusable inputs (before any work).
      RunDirectoryError: ``out`` holds a different run (before any work).
      ConfigError: unknown key or wrong type in the configuration (before any work).
    """
    from tqdm.auto import tqdm

    p = prepare(name, out=out, config_path=config_path, quick=quick, overrides=overrides, progress=progress)
    exp, cfg, ctx, out = p.exp, p.config, p.ctx, p.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(exist_ok=True)
    results_path = out / "results.jsonl"
    if p.existing is not None:
        manifest = p.existing
        manifest["resumed_at"] = [*manifest.get("resumed_at", []), utc_now()]
        manifest["status"] = "incomplete"
        _truncate_torn_line(results_path)
    else:
        manifest = build_manifest(
            experiment=exp.name,
            config=cfg,
            config_hash=p.chash,
            seed_entropy=cfg["seed"],
            quick=quick,
            inputs=ctx.inputs,
        )
    manifest["inputs"] = ctx.inputs
    write_json_atomic(out / "manifest.json", manifest)

    cells = exp.cells(cfg, ctx)
    keys = [c["cell"] for c in cells]
    if len(set(keys)) != len(keys):  # pragma: no cover - programming error
        raise ExperimentError(f"experiment {exp.name}: duplicate cell keys")
    done = {r.get("cell") for r in read_results(out)}
    todo = [(i, c) for i, c in enumerate(cells) if c["cell"] not in done]
    try:
        with results_path.open("a", encoding="utf-8") as fh:
            for i, cell in tqdm(
                todo,
                desc=exp.name,
                unit="cell",
                file=sys.stderr,
                disable=None if progress is None else not progress,
                leave=False,
            ):
                records = exp.run_cell(cell, cfg, ctx, cell_seed(cfg["seed"], i))
                for r in records:
                    r.setdefault("cell", cell["cell"])
                check_finite_records(records, f"{exp.name}/{cell['cell']}")
                fh.write("".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in records))
                fh.flush()
    except BaseException as exc:
        manifest["status"] = "incomplete"
        manifest["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        manifest["ended_at"] = utc_now()
        write_json_atomic(out / "manifest.json", manifest)
        raise
    records = read_results(out)
    summary = exp.summarize(records, cfg)
    summary = {"experiment": exp.name, "title": exp.title, "paper": exp.paper, "quick": quick, **summary}
    write_json_atomic(out / "summary.json", summary, sort_keys=False)
    figs = exp.plot(out)
    manifest["figures"] = sorted(figs)
    manifest["status"] = "complete"
    manifest.pop("error", None)
    manifest["ended_at"] = utc_now()
    write_json_atomic(out / "manifest.json", manifest)
    return summary


def remove_run(out: str | Path) -> None:  # pragma: no cover - convenience for users
    shutil.rmtree(out)
