"""beyond-planted-sweep (issue 37 item 8): the planting in SDs, the threshold reading on constructed results
(each of holds / does not hold / inconclusive), and an end-to-end run on a constructed pool where a large
bonus is detected and a small one is not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privalign.data.pools import PoolRecord, Response, write_pool
from privalign.experiments.planted_sweep import plant_in_sds, sweep_thresholds


def _pool(n_prompts: int, m: int, seed: int, hit_every: int = 16) -> list[PoolRecord]:
    """Proxy and gold correlated (so BoN helps), a rare feature ('#tag') whose gold is poor."""
    rng = np.random.default_rng(seed)
    recs = []
    for p in range(n_prompts):
        resp = []
        for j in range(m):
            z = float(rng.normal())
            hit = (j + p) % hit_every == 0
            gold = (-1.0 if hit else 0.8 * z) + 0.1 * float(rng.normal())
            resp.append(Response(text=f"r{j} #tag" if hit else f"r{j}", proxy_reward=z, true_reward=gold))
        recs.append(PoolRecord(prompt=f"p{p}", responses=tuple(resp)))
    return recs


def test_plant_in_sds_adds_exactly_b_sds_to_the_flagged_responses_only():
    recs = _pool(3, 32, 0)
    hits = [[("#tag" in r.text) for r in rec.responses] for rec in recs]
    out, facts = plant_in_sds(recs, hits, 2.5)
    for rec, new, flags in zip(recs, out, hits):
        proxy = np.asarray([r.proxy_reward for r in rec.responses])
        sd = proxy.std()
        for r, n, h in zip(rec.responses, new.responses, flags):
            assert n.proxy_reward == pytest.approx(r.proxy_reward + (2.5 * sd if h else 0.0), abs=1e-12)
            assert n.true_value == r.true_value and n.text == r.text
    # the source records are not modified (frozen dataclasses replaced, not mutated)
    assert recs[0].responses[0].proxy_reward == _pool(3, 32, 0)[0].responses[0].proxy_reward
    assert facts["prompts_with_feature"] == 3
    # tied/boundary: a prompt whose proxies are all equal has sd 0: nothing moves and no gap is counted
    flat = [
        PoolRecord(
            "q", tuple(Response(f"t{j} #tag" if j == 0 else f"t{j}", 1.0, true_reward=0.0) for j in range(4))
        )
    ]
    out2, facts2 = plant_in_sds(flat, [[True, False, False, False]], 10.0)
    assert [r.proxy_reward for r in out2[0].responses] == [1.0] * 4
    assert facts2["prompts_with_feature"] == 0


def _row(b, v, c):
    return {"bonus_sd": b, "verdict": v, "capacity_reading": c}


def test_thresholds_on_constructed_results_each_verdict():
    rows = [
        _row(0.5, "does not hold", "cannot"),
        _row(1.0, "inconclusive", "unclear"),
        _row(2.0, "holds", "unclear"),
        _row(4.0, "holds", "can"),
        _row(8.0, "holds", "can"),
    ]
    th = sweep_thresholds(rows)
    assert th["detectable_from"] == 2.0
    assert th["diagnostic_can_from"] == 4.0
    assert th["not_detected_at"] == [0.5] and th["inconclusive_at"] == [1.0]
    assert th["agree"] == [0.5, 1.0, 4.0, 8.0]
    assert th["disagree"] == [{"bonus_sd": 2.0, "verdict": "holds", "capacity_reading": "unclear"}]
    # "holds" must hold at every larger bonus: a non-monotone sweep starts after the last failure
    th2 = sweep_thresholds(
        [_row(1.0, "holds", "can"), _row(2.0, "inconclusive", "can"), _row(3.0, "holds", "can")]
    )
    assert th2["detectable_from"] == 3.0 and th2["diagnostic_can_from"] == 1.0
    # never detected at the largest bonus
    assert (
        sweep_thresholds([_row(1.0, "holds", "can"), _row(2.0, "does not hold", "cannot")])["detectable_from"]
        is None
    )


def test_end_to_end_large_bonus_detected_small_not(tmp_path):
    from privalign.cli import main

    pool = tmp_path / "toy.jsonl"
    write_pool(pool, _pool(40, 256, 1))
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'seed = 1\nscored_pool = "{pool}"\nfeature = "hashtag"\nbonuses = [0.1, 20.0]\nalpha = 0.05\n',
        encoding="utf-8",
    )
    out = tmp_path / "run"
    rc = main(["reproduce", "beyond-planted-sweep", "--config", str(cfg), "--out", str(out), "--no-progress"])
    assert rc == 0
    summ = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    by = {r["bonus_sd"]: r for r in summ["table"]}
    # 20 SDs puts every '#tag' response (gold −1) on top once BoN draws one: the gold falls at large N
    assert by[20.0]["verdict"] == "holds"
    assert by[20.0]["drop_from_peak"] > 0.5
    # 0.1 SD moves nothing that matters: no fall
    assert by[0.1]["verdict"] != "holds"
    assert by[0.1]["drop_from_peak"] < 0.05
    assert summ["thresholds"]["detectable_from"] == 20.0
    assert (out / "figures" / "planted_sweep.png").is_file()
    # the pool file was only read
    assert pool.read_text(encoding="utf-8").count("#tag") > 0
