"""Set-up shared by the RLHF benchmarks (``bench_rlhf.py``, ``bench_grpo_step.py``): the reward model every
side optimises against. Imported as a sibling module (``benchmarks/`` is on ``sys.path`` when a benchmark
runs as a script)."""

from __future__ import annotations

from pathlib import Path


def fit_imdb_rriht_reward(tmp: Path, *, epsilon: float = 8.0, sparsity: int = 32, seed: int = 0) -> Path:
    """Fit RR-IHT (``epsilon``, ``sparsity``) on p2-rlhf's held-out IMDb pairs (unigram hashed features,
    4,096 columns) and save it to ``tmp/rm.json``; returns that path. Not timed by the callers."""
    import numpy as np

    from privalign.data.preferences_io import load_jsonl_pairs
    from privalign.estimation.features import HashedNgramFeatures
    from privalign.estimation.iht import RRIHT
    from privalign.estimation.persistence import save_model
    from privalign.estimation.preferences import PreferenceData
    from privalign.rlhf.prompts import heldout_imdb_pairs

    heldout_imdb_pairs(tmp / "pairs.jsonl", reserve=200)
    pairs = load_jsonl_pairs(tmp / "pairs.jsonl")
    fmap = HashedNgramFeatures(n_features=4096, ngram_range=(1, 1))
    d = PreferenceData.from_text_pairs(
        pairs.prompts,
        pairs.chosen,
        pairs.rejected,
        fmap,
        prompt_ids=pairs.prompt_ids,
        random_state=np.random.default_rng(seed),
    )
    est = RRIHT(epsilon=epsilon, sparsity=sparsity, random_state=seed).fit(d.X, d.y)
    return save_model(
        est, tmp / "rm.json", feature_config=fmap.get_config(), metadata={"data": str(tmp / "pairs.jsonl")}
    )
