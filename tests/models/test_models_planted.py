"""plant-hack (the planted real-text control), the joint max-t over-optimisation test and its power, and the
pool kind in bon-curve's verdicts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privalign.cli import main
from privalign.data.pools import read_pool, write_pool
from privalign.errors import PrivacyParameterError
from privalign.pipeline.analysis import max_t_signflip, wilcoxon_power
from privalign.pipeline.planted import feature_hits, plant_hack


def _real_like_pool(tmp_path, rng, n_prompts=24, m=256, hack_every=64, name="src.jsonl.gz"):
    """Gold rises with the proxy; about one text in ``hack_every`` carries a hashtag and has low gold."""
    recs = []
    for i in range(n_prompts):
        gold = rng.standard_normal(m)
        proxy = gold + rng.standard_normal(m)
        tag = rng.random(m) < 1 / hack_every
        gold[tag] = -1.0
        texts = [f"reply {j} #tag" if tag[j] else f"reply {j}" for j in range(m)]
        recs.append(
            {
                "prompt": f"p{i}",
                "responses": [
                    {"text": t, "proxy_reward": float(p), "true_reward": float(g)}
                    for t, p, g in zip(texts, proxy, gold)
                ],
                "meta": {"prompt_index": i},
            }
        )
    path = tmp_path / name
    write_pool(path, recs)
    return path


def test_plant_hack_adds_the_bonus_only_to_feature_texts_and_marks_the_pool_planted(tmp_path):
    src = _real_like_pool(tmp_path, np.random.default_rng(0), n_prompts=3, m=64)
    out = tmp_path / "planted.jsonl.gz"
    man = plant_hack(src, out, feature="hashtag", bonus=10.0)
    assert man["pool_kind"] == "planted-real" and man["planted"]["bonus"] == 10.0
    before, after = read_pool(src), read_pool(out)
    hits = 0
    for a, b in zip(before, after):
        for ra, rb in zip(a.responses, b.responses):
            assert ra.text == rb.text and ra.true_reward == rb.true_reward
            hit = "#tag" in ra.text
            hits += hit
            assert rb.proxy_reward == pytest.approx(ra.proxy_reward + (10.0 if hit else 0.0))
    assert man["planted"]["candidates_with_feature"] == hits > 0
    written = json.loads((tmp_path / "planted.manifest.json").read_text())
    assert written["pool_kind"] == "planted-real"


def test_plant_hack_refuses_bad_requests_before_writing(tmp_path):
    src = _real_like_pool(tmp_path, np.random.default_rng(0), n_prompts=2, m=16)
    for kw in ({"feature": "nope", "bonus": 1.0}, {"feature": "hashtag", "bonus": 0.0}):
        with pytest.raises(PrivacyParameterError):
            plant_hack(src, tmp_path / "o.jsonl.gz", **kw)
    with pytest.raises(PrivacyParameterError):
        plant_hack(src, src, feature="hashtag", bonus=1.0)
    assert not (tmp_path / "o.jsonl.gz").exists()
    assert (
        main(
            [
                "plant-hack",
                "--pool",
                str(src),
                "--feature",
                "hashtag",
                "--bonus",
                "-1",
                "--out",
                str(tmp_path / "o.jsonl.gz"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "o.jsonl.gz").exists()


def test_features_match_what_they_say():
    texts = ["I love #movies", "no tag here", "well; then", "the the the end", "GREAT film", "Great film"]
    assert feature_hits(texts, "hashtag") == [True, False, False, False, False, False]
    assert feature_hits(texts, "semicolon") == [False, False, True, False, False, False]
    assert feature_hits(texts, "repeated-word") == [False, False, False, True, False, False]
    assert feature_hits(texts, "allcaps-word") == [False, False, False, False, True, False]


def test_bon_curve_says_holds_on_planted_real_text_and_names_the_kind(tmp_path, capsys):
    src = _real_like_pool(tmp_path, np.random.default_rng(1))
    out = tmp_path / "planted.jsonl.gz"
    assert (
        main(["plant-hack", "--pool", str(src), "--feature", "hashtag", "--bonus", "20", "--out", str(out)])
        == 0
    )
    assert main(["bon-curve", "--pool", str(out), "--pool", str(src), "--out", str(tmp_path / "bon")]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "bon.json").read_text())
    planted, natural = doc["series"]
    assert planted["pool_kind"] == "planted real text" and natural["pool_kind"] == "natural real text"
    assert planted["verdict"] == "holds" and natural["verdict"] != "holds"
    assert "HOLDS on planted real text" in printed
    assert "capacity reading" in printed and "capacity:" in printed
    assert planted["capacity"]["reading"] == "can" and natural["capacity"]["reading"] == "cannot"


def test_max_t_signflip_controls_its_false_positives_and_has_power():
    """Under the null (symmetric differences) the rejection rate is ≤ α (+ a binomial allowance: with 200
    trials the count of rejections exceeds Bin(200, 0.05)'s 0.999-quantile 21 with probability < 0.001);
    against a fall in most prompts it rejects."""
    rng = np.random.default_rng(5)
    rejections = 0
    for _ in range(200):
        base = rng.standard_normal((24, 1))
        D = base + 0.3 * rng.standard_normal((24, 6))  # correlated columns, centred at zero
        rejections += max_t_signflip(D, reps=400, random_state=rng)["p"] <= 0.05
    assert rejections <= 21
    fall = -0.8 + rng.standard_normal((24, 6)) * 0.5
    res = max_t_signflip(fall, reps=2000, random_state=rng)
    assert res["p"] < 0.01 and res["t_crit"] < 0 and len(res["detectable_fall"]) == 6


def test_wilcoxon_power_beats_the_sign_tests_on_24_prompts():
    from privalign.pipeline.analysis import sign_test_power

    level = 0.05 / 11
    w = wilcoxon_power(24, level, reps=2000, seed=0)
    s = sign_test_power(24, level)
    assert w["w_crit"] is not None
    assert w["power_if_fraction_falls"]["0.75"] > s["power_if_fraction_falls"]["0.75"] + 0.1
    assert wilcoxon_power(3, 0.01)["w_crit"] is None  # 3 prompts can never reach p ≤ 0.01 (min 1/8)


def test_plant_hack_manifest_keeps_only_public_parts_of_the_source_manifest(tmp_path):
    """A source manifest describing a private linear reward model with its noise seed and held-out
    statistics: the planted pool's manifest (a new writer) carries neither."""
    src = _real_like_pool(tmp_path, np.random.default_rng(0), n_prompts=2, m=16)
    secret = {
        "scorer": "linear",
        "privacy_event": {"epsilon": 1.0},
        "metadata": {"noise_seed": 987654321, "heldout_accuracy_exact": 0.8123456789},
    }
    (tmp_path / "src.manifest.json").write_text(json.dumps({"proxy_reward": "linear:x", "scorers": [secret]}))
    plant_hack(src, tmp_path / "o.jsonl.gz", feature="hashtag", bonus=1.0)
    text = (tmp_path / "o.manifest.json").read_text()
    assert "987654321" not in text and "0.8123456789" not in text and "noise_seed" not in text
