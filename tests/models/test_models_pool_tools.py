"""rescore-pool, bon-curve (exact BoN curves + paired over-optimisation test) and the IMDb reward models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privalign.cli import main
from privalign.data.pools import read_pool, write_pool
from privalign.errors import PrivacyParameterError
from privalign.models.scorers import LinearRewardScorer, VaderScorer
from privalign.pipeline.analysis import _sign_test_p, bon_curve
from privalign.pipeline.rescore import rescore_pool

TEXTS = [
    "What a wonderful, brilliant film!",
    "Terrible. I hated every minute.",
    "It was a movie.",
    "Great great great!!!",
]


def _pool(tmp_path, name="p.jsonl.gz"):
    recs = [
        {
            "prompt": f"review {i}",
            "responses": [
                {"text": t, "proxy_reward": float(k), "true_reward": 0.0} for k, t in enumerate(TEXTS)
            ],
            "meta": {"prompt_index": i},
        }
        for i in range(3)
    ]
    path = tmp_path / name
    write_pool(path, recs)
    return path


def _linear(tmp_path):
    from privalign.estimation.features import HashedNgramFeatures

    sc = LinearRewardScorer(
        HashedNgramFeatures(n_features=32, ngram_range=(1, 1)), np.linspace(-1, 1, 32), link="sigmoid"
    )
    return sc.save(tmp_path / "lin.json"), sc


def test_rescore_replaces_only_the_named_rewards_and_records_the_source(tmp_path):
    src = _pool(tmp_path)
    before = src.read_bytes()
    lin_path, lin = _linear(tmp_path)
    out = tmp_path / "r.jsonl.gz"
    man = rescore_pool(src, out, proxy_reward="vader", true_reward=f"linear:{lin_path}", progress=False)
    assert src.read_bytes() == before  # the source is never modified
    recs = read_pool(out)
    np.testing.assert_allclose(recs[1].proxy, VaderScorer("unit").score(TEXTS))
    np.testing.assert_allclose(recs[1].true, lin.score(TEXTS), rtol=1e-6)
    assert [r.text for r in recs[2].responses] == TEXTS and recs[2].prompt == "review 2"
    assert man["rescored_from"]["pool"] == src.name and len(man["rescored_from"]["sha256"]) == 64
    assert man["rescored"] == ["proxy_reward", "true_reward"] and man["num_candidates"] == 12
    assert json.loads((tmp_path / "r.manifest.json").read_text())["pool"] == "r.jsonl.gz"
    # only the true reward: the proxy column is copied unchanged
    rescore_pool(src, tmp_path / "t.jsonl", true_reward="vader", progress=False)
    t = read_pool(tmp_path / "t.jsonl")
    np.testing.assert_array_equal(t[0].proxy, [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(t[0].true, VaderScorer("unit").score(TEXTS))


def test_rescore_refuses_bad_requests_before_writing(tmp_path):
    src = _pool(tmp_path)
    out = tmp_path / "o.jsonl"
    with pytest.raises(PrivacyParameterError, match="nothing to re-score"):
        rescore_pool(src, out)
    with pytest.raises(PrivacyParameterError, match="'out'.*differ"):
        rescore_pool(src, src, proxy_reward="vader")
    with pytest.raises(PrivacyParameterError, match="'out'.*.jsonl"):
        rescore_pool(src, tmp_path / "o.csv", proxy_reward="vader")
    with pytest.raises(PrivacyParameterError, match="'proxy_reward'"):
        rescore_pool(src, out, proxy_reward="vaderr")
    with pytest.raises(FileNotFoundError, match="linear reward file"):
        rescore_pool(src, out, true_reward="linear:/nope.json")
    assert not out.exists() and not (tmp_path / "o.manifest.json").exists()


def test_sign_test_is_exact():
    assert _sign_test_p(-np.ones(10)) == pytest.approx(2.0**-10)
    assert _sign_test_p(np.ones(10)) == pytest.approx(1.0)
    # 7 of 9 negative (a zero is dropped): P(Bin(9, 1/2) >= 7) = (36 + 9 + 1) / 512
    assert _sign_test_p(np.array([-1, -1, -1, -1, -1, -1, -1, 1, 1, 0.0])) == pytest.approx(46 / 512)


def _synthetic_records(n_prompts, m, overopt, rng):
    from privalign.data.pools import PoolRecord, Response

    recs = []
    for _ in range(n_prompts):
        proxy = rng.random(m)
        # gold rises with the proxy, but (overopt) the top 5% by proxy are reward hacks with low gold
        gold = proxy + 0.1 * rng.standard_normal(m)
        if overopt:
            gold[proxy > 0.95] = 0.0
        recs.append(
            PoolRecord(
                "p", tuple(Response(f"t{j}", float(proxy[j]), true_reward=float(gold[j])) for j in range(m))
            )
        )
    return recs


def test_bon_curve_detects_overoptimisation_and_not_its_absence():
    """Power and size of the paired test on pools whose answer is known by construction."""
    rng = np.random.default_rng(11)
    hacked = bon_curve(_synthetic_records(30, 256, True, rng))
    assert hacked["overoptimized"] and hacked["argmax_N_true"] < 256 and hacked["drop_from_peak"] > 0.3
    honest = bon_curve(_synthetic_records(30, 256, False, rng))
    assert not honest["overoptimized"] and honest["argmax_N_true"] == 256
    assert len(honest["paired_tests_vs_max_N"]) == 8 and honest["bonferroni_level"] == pytest.approx(0.05 / 8)


def test_bon_curve_verdict_is_three_way_on_constructed_pools():
    """Each outcome of the over-optimisation verdict on a pool whose answer is known by construction
    (family-wise α = 0.05 for "holds"; α = 0.05 per comparison of the intersection-union rule for "does not
    hold")."""
    from privalign.data.pools import PoolRecord, Response

    rng = np.random.default_rng(12)
    # holds: the top 5% by proxy are reward hacks (30 prompts)
    assert bon_curve(_synthetic_records(30, 256, True, rng))["verdict"] == "holds"
    # does not hold: the gold rises with the proxy on every prompt
    rising = bon_curve(_synthetic_records(30, 256, False, rng))
    assert rising["verdict"] == "does not hold"
    assert all(t["lower_bound"] > -rising["margin"] for t in rising["paired_tests_vs_max_N"])
    # inconclusive: 6 prompts whose gold is independent noise: the curve is flat up to noise, the sign test
    # cannot reach its critical count, and the t bounds are wider than the margin (a tenth of a lift ≈ 0)
    noise = [
        PoolRecord(
            "p",
            tuple(Response(f"t{j}", float(x), true_reward=float(g)) for j, (x, g) in enumerate(zip(px, gd))),
        )
        for px, gd in ((rng.random(64), rng.standard_normal(64)) for _ in range(6))
    ]
    flat = bon_curve(noise)
    assert flat["verdict"] == "inconclusive" and not flat["overoptimized"]


def test_sign_test_power_is_exact():
    from math import comb

    from privalign.pipeline.analysis import sign_test_power

    def upper_tail(n, k, q):  # P(Bin(n, q) >= k), summed exactly
        return sum(comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k, n + 1))

    pw = sign_test_power(24, 0.05 / 11, fractions=(0.75, 0.9))
    k = pw["k_crit"]
    assert upper_tail(24, k, 0.5) <= 0.05 / 11 < upper_tail(24, k - 1, 0.5) and k == 19
    assert pw["power_if_fraction_falls"]["0.9"] == pytest.approx(upper_tail(24, 19, 0.9), rel=1e-12)
    assert pw["power_if_fraction_falls"]["0.75"] == pytest.approx(upper_tail(24, 19, 0.75), rel=1e-12)
    # 3 prompts: even 3 of 3 lower has p = 1/8 > 0.05, so the test can never reject
    assert sign_test_power(3, 0.05)["k_crit"] is None
    assert sign_test_power(3, 0.05)["power_if_fraction_falls"]["0.9"] == 0.0


def test_bon_curve_cli_writes_json_and_png_for_several_pools(tmp_path, capsys):
    a = _pool(tmp_path, "a.jsonl.gz")
    b = tmp_path / "b.jsonl.gz"
    rescore_pool(a, b, true_reward="vader", progress=False)
    rc = main(
        [
            "bon-curve",
            "--pool",
            str(a),
            "--pool",
            str(b),
            "--label",
            "A",
            "--label",
            "B",
            "--out",
            str(tmp_path / "bon"),
        ]
    )
    assert rc == 0
    doc = json.loads((tmp_path / "bon.json").read_text())
    assert [s["label"] for s in doc["series"]] == ["A", "B"]
    assert (tmp_path / "bon.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "A: gold peaks" in out and "B: gold peaks" in out
    assert (
        main(["bon-curve", "--pool", str(a), "--label", "A", "--label", "B", "--out", str(tmp_path / "x")])
        == 2
    )
    assert main(["bon-curve", "--pool", str(a), "--alpha", "1.5", "--out", str(tmp_path / "x")]) != 0


def test_imdb_reward_split_is_disjoint_and_excludes_prompts():
    from privalign.data.datasets import imdb_split
    from privalign.pipeline.gold import imdb_reward_split, word_windows

    prompt_idx, fit_idx = imdb_split()
    proxy_idx, gold_idx = imdb_reward_split(200)
    assert len(proxy_idx) == 200 and len(gold_idx) == len(fit_idx) - 200
    assert not set(proxy_idx) & set(gold_idx)
    assert set(proxy_idx) | set(gold_idx) == set(fit_idx) and not set(fit_idx) & set(prompt_idx)
    w = word_windows(["a b c d e f", "x y"], 3, np.random.default_rng(0))
    assert len(w[0].split()) == 3 and " ".join(w[0].split()) in "a b c d e f" and w[1] == "x y"


@pytest.mark.parametrize("name", ["imdb-gold-minilm-logreg.json", "imdb-proxy-ngram-logreg.json"])
def test_shipped_imdb_reward_models_prefer_positive_text(name):
    from privalign.paths import repo_root

    sc = LinearRewardScorer.load(repo_root() / "pools" / name)
    s = sc.score(
        [
            "This was a wonderful movie with a brilliant cast, I loved it.",
            "This was the worst movie I have ever seen, a total waste of time.",
        ]
    )
    assert s[0] > 0.5 > s[1]
    acc = sc.metadata.get("heldout_accuracy", sc.metadata.get("heldout_window_accuracy"))
    assert acc > 0.6


def test_kl_bon_formula_and_curve_rows():
    import math

    from privalign.pipeline.analysis import kl_bon

    assert kl_bon(1) == 0.0
    assert math.isclose(kl_bon(2), math.log(2) - 0.5)
    assert math.isclose(kl_bon(512), math.log(512) - 511 / 512)
    assert all(kl_bon(2 * n) > kl_bon(n) for n in (1, 2, 8, 256))  # increasing in N
    with pytest.raises(ValueError, match="N must be >= 1"):
        kl_bon(0)
    rng = np.random.default_rng(0)
    res = bon_curve(_synthetic_records(4, 16, False, rng))
    assert [r["kl_bon"] for r in res["curve"]] == [kl_bon(r["N"]) for r in res["curve"]]


@pytest.mark.parametrize(
    ("bon", "index", "pool"),
    [
        ("hh-smollm2-2048.bon.json", 1, "hh-smollm2-2048.jsonl.gz"),  # the 24 x 2,048 pool
        ("hh-smollm2.bon.json", 2, "hh-smollm2.jsonl.gz"),  # the 24 x 512 pool
    ],
)
def test_shipped_bon_curves_are_recomputed_from_the_shipped_pools(bon, index, pool):
    """The numbers quoted in docs/models.md come from pools/*.bon.json: recompute one series from the
    shipped pool and its manifest's counts (to the last bits, which differ between CPUs' exp/log)."""
    from privalign.paths import repo_root

    root = repo_root() / "pools"
    shipped = json.loads((root / bon).read_text())["series"][index]
    assert shipped["pool"] == pool
    man = json.loads((root / pool.replace(".jsonl.gz", ".manifest.json")).read_text())
    recs = read_pool(root / pool)
    assert len(recs) == man["num_prompts"] == shipped["num_prompts"]
    assert sum(len(r.responses) for r in recs) == man["num_candidates"]
    assert man["pool"] == pool and man["rescored"] == ["proxy_reward", "true_reward"]
    again = bon_curve(recs, alpha=shipped["alpha"], margin_fraction=0.1)
    for a, b in zip(again["curve"], shipped["curve"], strict=True):
        assert a["N"] == b["N"] and a["true_mean"] == pytest.approx(b["true_mean"], rel=1e-9, abs=1e-12)
        assert a["proxy_mean"] == pytest.approx(b["proxy_mean"], rel=1e-9, abs=1e-12)
    assert again["verdict"] == shipped["verdict"]
    assert [t["prompts_lower"] for t in again["paired_tests_vs_max_N"]] == [
        t["prompts_lower"] for t in shipped["paired_tests_vs_max_N"]
    ]
