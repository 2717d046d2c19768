"""HH-RLHF testbed helpers: first-turn prompts, the Bradley-Terry fit, and gold-relabelled proxies that never
see the evaluation prompts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privalign.errors import MissingDependencyError, PrivacyParameterError
from privalign.pipeline.hh import _bt_fit, first_human_turn


def test_first_human_turn():
    d = "\n\nHuman: How do I bake bread?\n\nAssistant: Knead it.\n\nHuman: and then?\n\nAssistant:"
    assert first_human_turn(d) == "How do I bake bread?"
    assert first_human_turn("\n\nHuman: just one turn") == "just one turn"
    assert first_human_turn("no markers") == "no markers"


def test_bt_fit_recovers_the_direction(rng):
    w_true = np.array([2.0, -1.0, 0.5])
    D = rng.normal(size=(3000, 3))
    p = 1 / (1 + np.exp(-(D @ w_true)))
    s = np.where(rng.random(3000) < p, 1.0, -1.0)  # s = +1: the first item won
    w = _bt_fit(D * s[:, None], C=100.0, random_state=0)
    cos = w @ w_true / np.linalg.norm(w) / np.linalg.norm(w_true)
    assert cos > 0.99


def _hh_available() -> bool:
    from privalign.data.datasets import load_hh_rlhf

    try:
        load_hh_rlhf()
    except MissingDependencyError:
        return False
    return True


def test_proxies_fit_on_gold_labels_outside_the_eval_prompts(tmp_path):
    if not _hh_available():
        pytest.skip("HH-RLHF data not found (set PRIVALIGN_DATA_DIR)")
    from privalign.estimation.features import HashedNgramFeatures
    from privalign.models.scorers import LinearRewardScorer
    from privalign.pipeline.hh import fit_hh_proxy, hh_pairs, hh_prompts

    # a cheap stand-in gold: prefers responses mentioning "sorry" or "cannot"
    fm = HashedNgramFeatures(n_features=2**12, ngram_range=(1, 1))
    coef = np.asarray(fm.transform(["sorry cannot"]).toarray()).ravel()
    LinearRewardScorer(fm, coef, name="toy-gold").save(tmp_path / "gold.json")
    with pytest.raises(PrivacyParameterError, match=r"\{n\}"):
        fit_hh_proxy(tmp_path / "p.json", tmp_path / "gold.json", n_pairs=[50, 200])
    metas = fit_hh_proxy(
        str(tmp_path / "p-{n}.json"), tmp_path / "gold.json", n_pairs=[50, 1000], eval_prompts=64, seed=1
    )
    assert [m["fit_pairs"] for m in metas] == [50, 1000]
    chosen, _ = hh_pairs()
    assert all(
        m["eval_prompts_excluded"] == 64 and m["heldout_pairs"] == len(chosen) - 64 - m["fit_pairs"]
        for m in metas
    )
    assert metas[1]["heldout_gold_agreement"] > 0.55  # a learnable gold is learnt from 1,000 pairs
    doc = json.loads((tmp_path / "p-1000.json").read_text())
    assert doc["metadata"]["gold"].endswith("gold.json")
    assert hh_prompts(3)[1].extra["dialogue_index"] == 1
