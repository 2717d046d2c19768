"""Fixtures for the RLHF tests: a small reward model fitted on synthetic pairs written to a JSONL file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

POS = ["great", "wonderful", "superb", "moving", "brilliant", "lovely"]
NEG = ["awful", "boring", "terrible", "dull", "weak", "bad"]


def _pairs(rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for k in range(n):
        c = " ".join(rng.choice(POS, 4)) + f" film number {k}"
        r = " ".join(rng.choice(NEG, 4)) + f" film number {k}"
        out.append({"prompt": "", "chosen": c, "rejected": r, "prompt_id": k})
    return out


def make_reward_model(
    tmp: Path, *, method: str = "RRIHT", n_features: int = 256, data: str | None = "pairs", seed: int = 0
) -> Path:
    from privalign.estimation.baselines import MLE
    from privalign.estimation.features import HashedNgramFeatures
    from privalign.estimation.iht import RRIHT
    from privalign.estimation.persistence import save_model
    from privalign.estimation.preferences import PreferenceData

    rng = np.random.default_rng(seed)
    pairs = _pairs(rng, 120)
    pairs_path = tmp / "pairs.jsonl"
    pairs_path.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    fmap = HashedNgramFeatures(n_features=n_features, ngram_range=(1, 1))
    d = PreferenceData.from_text_pairs(
        [p["prompt"] for p in pairs],
        [p["chosen"] for p in pairs],
        [p["rejected"] for p in pairs],
        fmap,
        prompt_ids=[p["prompt_id"] for p in pairs],
        random_state=rng,
    )
    est = RRIHT(epsilon=8.0, sparsity=8, random_state=seed) if method == "RRIHT" else MLE()
    est.fit(d.X, d.y)
    meta = {"data": str(pairs_path) if data == "pairs" else data}
    return save_model(est, tmp / f"rm-{method}.json", feature_config=fmap.get_config(), metadata=meta)


@pytest.fixture
def reward_model(tmp_path) -> Path:
    return make_reward_model(tmp_path)


@pytest.fixture
def make_rm():
    """The factory :func:`make_reward_model` (tests call ``make_rm(tmp_path, ...)``)."""
    return make_reward_model
