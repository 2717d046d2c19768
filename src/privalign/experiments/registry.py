"""Experiment name → :class:`~privalign.experiments.base.Experiment` (a plain dict).

Modules whose building blocks are missing (an optional dependency not installed) are left out of
``EXPERIMENTS`` and listed, with the reason, in ``UNAVAILABLE``.
"""

from __future__ import annotations

import importlib

from privalign.experiments.base import Experiment, ExperimentError

__all__ = ["EXPERIMENTS", "UNAVAILABLE", "get_experiment", "experiment_names"]

_MODULES = (
    "privalign.experiments.paper1",
    "privalign.experiments.privacy_sweep",
    "privalign.experiments.budget",
    "privalign.experiments.paper2",
    "privalign.experiments.winrate",
    "privalign.experiments.beyond",
    "privalign.experiments.rlhf",
    "privalign.experiments.rlhf_bon",
    "privalign.experiments.frontier",
    "privalign.experiments.user_level",
    "privalign.experiments.planted_sweep",
)

EXPERIMENTS: dict[str, Experiment] = {}
UNAVAILABLE: dict[str, str] = {}

for _mod in _MODULES:
    try:
        EXPERIMENTS.update(importlib.import_module(_mod).EXPERIMENTS)
    except ModuleNotFoundError as _exc:
        if _exc.name == _mod:
            continue
        UNAVAILABLE[_mod] = f"{type(_exc).__name__}: {_exc}"


def experiment_names() -> list[str]:
    return list(EXPERIMENTS)


def get_experiment(name: str) -> Experiment:
    """Look up an experiment by name.

    Raises:
      ExperimentError: unknown name (the message lists the known ones).
    """
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise ExperimentError(
            f"Unknown experiment {name!r}. Known experiments: {', '.join(EXPERIMENTS)} (or 'all')."
        ) from None
