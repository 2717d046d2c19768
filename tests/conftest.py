"""Shared fixtures.

Seed contract (after scikit-learn's ``global_random_seed``): tests that take ``seed``/``rng`` run with
``PRIVALIGN_TEST_SEED`` (default 42); ``PRIVALIGN_TEST_SEED=all`` runs seeds 0..99 and any seed must pass
(statistical tests split their α accordingly). Nothing seeds global state.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest


def _seeds() -> list[int]:
    raw = os.environ.get("PRIVALIGN_TEST_SEED", "42")
    if raw == "all":
        return list(range(100))
    if raw == "any":
        return [int(np.random.SeedSequence().entropy % 100)]
    return [int(raw)]


@pytest.fixture(params=_seeds())
def seed(request) -> int:
    return request.param


@pytest.fixture
def rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    from privalign.paths import data_dir as _data_dir

    return _data_dir(required=True)
