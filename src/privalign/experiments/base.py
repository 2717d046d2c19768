"""The types every experiment module shares: :class:`Experiment`, :class:`RunContext` and the errors.

A small module below :mod:`privalign.experiments.runner` and :mod:`privalign.experiments.registry`, so the
registry does not import the runner that looks experiments up in it (no import cycle). The runner
re-exports everything here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privalign.errors import PrivalignError
from privalign.experiments.config import Field
from privalign.experiments.record_store import RecordStore, repo_path

__all__ = ["Experiment", "RunContext", "ExperimentError", "RunDirectoryError"]


class ExperimentError(PrivalignError):
    """An experiment cannot be run as asked (unknown name, missing inputs)."""


class RunDirectoryError(ExperimentError):
    """The output directory holds something else (a different run, or files that are not a run)."""


@dataclass
class RunContext:
    """What an experiment sees while it runs.

    Attributes:
      run_dir: The run directory.
      quick: Whether the quick configuration was requested.
      inputs: Input files and their provenance (recorded in the manifest); filled by ``preflight``.
      cache: Objects shared between cells (a loaded pool, a trained model); never written anywhere.
      progress: Whether to show progress bars.

    Records that outlive a run (trained policies' evaluations, fitted curves) go through :meth:`records`.
    """

    run_dir: Path
    quick: bool = False
    inputs: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    progress: bool | None = None

    def records(self, folder: str = "records", *, prior: str | Path | None = None) -> RecordStore:
        """The run's identity-checked record store under ``RUN/folder``, backed by ``prior`` (an earlier
        run's copy of that folder, relative to the source checkout or absolute; ``None``/``""``: none)."""
        return RecordStore(self.run_dir / folder, repo_path(prior) if prior else None)


@dataclass(frozen=True)
class Experiment:
    """An experiment: a schema, a list of cells, a function per cell, a summary and figures.

    Attributes:
      name: Registry name (``privalign reproduce NAME``).
      title: One line for the report.
      paper: ``"paper1"``, ``"paper2"`` or ``"beyond"``.
      schema: Configuration schema, or a function returning it (read on each use: a schema that lists the
        registered estimators' parameters sees an estimator registered after this module was imported).
      preflight: ``(config, ctx) -> None``; checks inputs and raises before any work.
      cells: ``(config, ctx) -> list[dict]``; each cell dict has a unique ``"cell"`` string.
      run_cell: ``(cell, config, ctx, seed_sequence) -> list[dict]`` records (JSON-serialisable, finite).
      summarize: ``(records, config) -> dict``; reads only the records.
      plot: ``(run_dir) -> list[str]``; draws figures from the run directory only, returns the stems.
    """

    name: str
    title: str
    paper: str
    schema_source: dict[str, Field] | Callable[[], dict[str, Field]]
    preflight: Callable[[dict, RunContext], None]
    cells: Callable[[dict, RunContext], list[dict]]
    run_cell: Callable[[dict, dict, RunContext, np.random.SeedSequence], list[dict]]
    summarize: Callable[[list[dict], dict], dict]
    plot: Callable[[Path], list[str]]

    @property
    def schema(self) -> dict[str, Field]:
        """The configuration schema (see ``schema_source``)."""
        src = self.schema_source
        return src() if callable(src) else src

    @property
    def config_name(self) -> str:
        return self.name.replace("-", "_")
