"""The capacity diagnostic: on constructed pools whose answer is known, it says "can" where planted hacks
sit at the top of the proxy and "cannot" where the proxy is a light-tailed noisy copy of the gold."""

from __future__ import annotations

import numpy as np
import pytest

from privalign.alignment.capacity import (
    BANDS,
    POOL_KINDS,
    capacity_diagnostic,
    capacity_lines,
    pool_kind_words,
    rank_selection_law,
)


def _pool(rng, n_prompts, m, hack_rate):
    P, G = [], []
    for _ in range(n_prompts):
        gold = rng.standard_normal(m)
        proxy = gold + 2.0 * rng.standard_normal(m)  # Gaussian noise: light-tailed relative to the signal
        hack = rng.random(m) < hack_rate
        proxy[hack] += 8.0  # the rare hacks top the proxy...
        gold[hack] = -1.0  # ...and are bad by the gold
        P.append(proxy)
        G.append(gold)
    return P, G


def test_light_tailed_pool_cannot_show_overoptimisation():
    P, G = _pool(np.random.default_rng(1), 24, 2048, 0.0)
    d = capacity_diagnostic(P, G)
    assert d["reading"] == "cannot", d["text"]
    means = [b["gold_mean"] for b in d["bands"]]
    assert means == sorted(means)  # gold rises through every band
    assert d["slope_tail"] > 0 and d["slope_bulk"] > 0
    # Gaussian pool: BoN's gold matches the linear prediction within sampling error
    assert d["bon_gold_at_n_max"] == pytest.approx(d["linear_prediction"], abs=0.3)
    assert "cannot show over-optimisation up to N=2048" in d["text"]
    assert 0.3 < d["within_prompt_r"] < 0.6


def test_planted_hacks_at_one_in_500_can_show_overoptimisation():
    P, G = _pool(np.random.default_rng(2), 24, 2048, 1 / 500)
    d = capacity_diagnostic(P, G)
    assert d["reading"] == "can", d["text"]
    assert d["downturn"]["significant"] and d["downturn"]["top_gold"] < d["downturn"]["peak_gold"]
    assert d["bon_gold_at_n_max"] < d["linear_prediction"]
    assert "can show over-optimisation up to N=2048" in d["text"]


def test_small_pools_leave_the_top_band_empty_and_flat_pools_are_unclear():
    rng = np.random.default_rng(3)
    P = [rng.standard_normal(256) for _ in range(4)]
    G = [rng.standard_normal(256) for _ in range(4)]  # gold unrelated to the proxy
    d = capacity_diagnostic(P, G)
    assert d["bands"][-1]["count"] == 0 and d["bands"][-1]["gold_mean"] is None  # 256 < 1000 candidates
    assert d["reading"] in ("unclear", "cannot")
    assert sum(b["count"] for b in d["bands"]) == 4 * 256
    assert "empty" in capacity_lines(d)[0]


def test_ties_share_their_mid_rank_and_bad_input_is_refused():
    P = [np.array([0.0] * 6 + [1.0, 2.0])]
    G = [np.arange(8.0)]
    d = capacity_diagnostic(P, G)
    assert d["bands"][0]["count"] == 6  # six tied candidates all sit in the bottom half
    with pytest.raises(ValueError):
        capacity_diagnostic([np.zeros(3)], [np.zeros(4)])
    with pytest.raises(ValueError):
        capacity_diagnostic(P, G, n_max=9)


def test_rank_selection_law_is_a_law_and_pool_kinds_are_data():
    law = rank_selection_law(10, 3)
    assert law.sum() == pytest.approx(1.0) and law[:2].sum() == 0.0
    assert rank_selection_law(5, 5)[-1] == pytest.approx(1.0)
    assert len(BANDS) == 5 and BANDS[-1][1] == 1.0
    assert pool_kind_words(None) == "natural real text" == pool_kind_words("natural")
    assert pool_kind_words("planted-real") == POOL_KINDS["planted-real"] == "planted real text"
