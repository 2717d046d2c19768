"""Bad input to ``privalign align`` and the RLHF building blocks: one-line errors naming the flag, exit 2."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from privalign.cli import main
from privalign.errors import DataFormatError, PrivacyParameterError


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("privalign align: error: ")
    return err


def test_missing_reward_model_file(tmp_path, capsys):
    assert main(["align", "--reward-model", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "--reward-model" in err and "nope.json" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("beta", ["0", "-0.1", "nan", "inf"])
def test_kl_coefficient_must_be_positive(reward_model, tmp_path, capsys, beta):
    assert (
        main(["align", "--reward-model", str(reward_model), "--out", str(tmp_path / "o"), "--beta", beta])
        == 2
    )
    err = _err(capsys)
    assert "--beta" in err and "> 0" in err
    assert not (tmp_path / "o").exists()


def test_align_config_validates_beta():
    from privalign.rlhf.train import AlignConfig

    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(PrivacyParameterError, match="beta"):
            AlignConfig(beta=bad)
    with pytest.raises(PrivacyParameterError, match="num_generations"):
        AlignConfig(num_generations=1)
    assert AlignConfig(beta=0.1).beta == 0.1


def test_feature_map_mismatch(tmp_path, capsys, make_rm):
    p = make_rm(tmp_path, n_features=256)
    doc = json.loads(p.read_text())
    doc["feature_config"]["n_features"] = 512  # the stored map no longer matches the 256 coefficients
    p.write_text(json.dumps(doc))
    assert main(["align", "--reward-model", str(p), "--out", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "--reward-model" in err and "512" in err and "256" in err


def test_reward_model_without_feature_config(tmp_path, capsys, make_rm):
    p = make_rm(tmp_path)
    doc = json.loads(p.read_text())
    doc["feature_config"] = None
    p.write_text(json.dumps(doc))
    assert main(["align", "--reward-model", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "feature_config" in _err(capsys)


def test_not_a_reward_model(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"format": "something-else"}))
    assert main(["align", "--reward-model", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "format" in _err(capsys)


def test_prompts_overlapping_private_pairs_refused(tmp_path, capsys, make_rm):
    rm = make_rm(tmp_path)
    pairs = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    prompts = tmp_path / "prompts.txt"
    # a public prompt and the opening (first 3 words) of a private chosen review
    prompts.write_text("A film about the sea\n" + " ".join(pairs[5]["chosen"].split()[:3]) + "\n")
    assert (
        main(["align", "--reward-model", str(rm), "--out", str(tmp_path / "o"), "--prompts", str(prompts)])
        == 2
    )
    err = _err(capsys)
    assert "--prompts" in err and "--allow-overlap" in err and "1 of 2" in err
    assert not (tmp_path / "o").exists()


def test_allow_overlap_records_instead_of_refusing(tmp_path, make_rm):
    from privalign.rlhf.prompts import check_prompts_disjoint
    from privalign.rlhf.rewards import load_reward

    rm = load_reward(make_rm(tmp_path))
    pairs = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    prompts = ["A film about the sea", pairs[7]["rejected"]]
    with pytest.raises(PrivacyParameterError, match="allow-overlap"):
        check_prompts_disjoint(prompts, rm)
    rec = check_prompts_disjoint(prompts, rm, allow_overlap=True)
    assert rec["checked"] and rec["overlapping_prompts"] == 1 and rec["overlapping_indices"] == [1]
    assert check_prompts_disjoint(["A film about the sea"], rm)["overlapping_prompts"] == 0


def test_unverifiable_training_data_fails_closed(tmp_path, capsys, make_rm):
    rm = make_rm(tmp_path, data=str(tmp_path / "gone.jsonl"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("A film about the sea\n")
    assert (
        main(["align", "--reward-model", str(rm), "--out", str(tmp_path / "o"), "--prompts", str(prompts)])
        == 2
    )
    assert "--allow-overlap" in _err(capsys)


def test_bad_prompt_file_and_range(reward_model, tmp_path, capsys):
    assert (
        main(
            [
                "align",
                "--reward-model",
                str(reward_model),
                "--out",
                str(tmp_path / "o"),
                "--prompts",
                str(tmp_path / "none.txt"),
            ]
        )
        == 2
    )
    assert "--prompts" in _err(capsys)
    assert (
        main(
            ["align", "--reward-model", str(reward_model), "--out", str(tmp_path / "o"), "--num-prompts", "0"]
        )
        == 2
    )
    assert "--num-prompts" in _err(capsys)
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "x"}\n')
    assert (
        main(
            [
                "align",
                "--reward-model",
                str(reward_model),
                "--out",
                str(tmp_path / "o"),
                "--prompts",
                str(bad),
            ]
        )
        == 2
    )
    assert "prompt" in _err(capsys)


def test_find_overlap_rules():
    from privalign.data.preferences_io import TextPairs
    from privalign.rlhf.prompts import find_overlap

    pairs = TextPairs(
        ["\n\nHuman: How do I bake bread?\n\nAssistant:", ""],
        ["Knead the dough well", "This movie was a  joy to watch"],
        ["No idea", "Worst film ever made"],
        [0, 1],
        "t",
    )
    prompts = [
        "How do I bake bread?",
        "This movie was a",
        "This movie was not",
        "Worst film",
        "Knead",
        "unrelated",
    ]
    assert find_overlap(prompts, pairs) == [0, 1, 3, 4]


def test_private_reward_scores_like_the_estimator(tmp_path, make_rm):
    from privalign.estimation.persistence import load_model
    from privalign.rlhf.rewards import load_reward

    p = make_rm(tmp_path)
    r = load_reward(p)
    est, fcfg, _ = load_model(p)
    from privalign.estimation.features import feature_map_from_config

    texts = ["great superb film", "awful dull film", ""]
    want = est.predict_reward(feature_map_from_config(fcfg).transform(texts))
    got = r(["", "", ""], texts)
    assert all(isinstance(v, float) for v in got)
    np.testing.assert_allclose(got, want)
    assert got[0] > got[1]
    d = r.describe()
    assert d["privacy_unit"] == "label" and d["privacy_event"]["epsilon"] == 8.0 and len(d["sha256"]) == 64
    from privalign.rlhf.rewards import file_sha256

    # a hash of the private data is never part of a description that a manifest copies
    assert file_sha256(tmp_path / "pairs.jsonl") not in json.dumps(d)
    assert r.__name__ == "private_reward"


def test_privacy_statement_inherits_event(tmp_path, make_rm):
    from privalign.rlhf.rewards import load_reward
    from privalign.rlhf.train import privacy_statement

    s = privacy_statement(load_reward(make_rm(tmp_path)).describe(), {"source": "file"})
    assert "(ε=8, δ=0)-DP" in s["statement"] and "'label'" in s["statement"] and s["privacy_unit"] == "label"
    assert s["guarantee"]["epsilon"] == 8.0 and s["guarantee"]["delta"] == 0.0
    np_ = privacy_statement(load_reward(make_rm(tmp_path, method="MLE")).describe(), {"source": "file"})
    assert np_["privacy_unit"] == "none" and np_["statement"].startswith("No privacy guarantee")


def test_prompt_loader(tmp_path):
    from privalign.rlhf.prompts import load_prompt_file

    (tmp_path / "a.txt").write_text("one\n\ntwo\n")
    assert load_prompt_file(tmp_path / "a.txt")[0] == ["one", "two"]
    (tmp_path / "b.jsonl").write_text('{"prompt": "x"}\n{"prompt": "y"}\n')
    assert load_prompt_file(tmp_path / "b.jsonl")[0] == ["x", "y"]
    (tmp_path / "c.txt").write_text("\n")
    with pytest.raises(DataFormatError, match="prompts"):
        load_prompt_file(tmp_path / "c.txt")


def test_reference_rewards_are_not_private(tmp_path):
    from privalign.rlhf.prompts import check_prompts_disjoint
    from privalign.rlhf.rewards import load_reward

    v = load_reward("vader")
    assert v.privacy_unit == "none" and v.describe()["privacy_event"] is None
    s = v(["", ""], ["What a wonderful, brilliant film!", "Awful, boring, terrible."])
    assert s[0] > s[1]
    assert check_prompts_disjoint(["anything"], v) == {
        "checked": False,
        "why": "reference reward (no private preference data)",
    }
    with pytest.raises(FileNotFoundError, match="reward_model"):
        load_reward(f"linear:{tmp_path / 'missing.json'}")


@pytest.mark.parametrize("method", ["dp-iht", "dp-sgd", "rr-iht"])
def test_privacy_statement_totals_composed_events(tmp_path, make_rm, method, capsys):
    """A tuned model's event is parallel_composed(composed(candidates), selection): the statement gives its
    total (ε, δ) (it printed 'event parallel_composed ()' before it composed the parts), within the search's
    budget."""
    from privalign.rlhf.rewards import load_reward
    from privalign.rlhf.train import privacy_statement

    make_rm(tmp_path)  # writes pairs.jsonl
    out = tmp_path / f"{method}.json"
    argv = ["fit-reward", "--data", str(tmp_path / "pairs.jsonl"), "--method", method, "--epsilon", "2"]
    sparsity = ["--sparsity", "4"] if "iht" in method else []  # (refused by the methods that do not read it)
    assert main([*argv, *sparsity, "--n-features", "64", "--tune", "--out", str(out)]) == 0
    capsys.readouterr()
    s = privacy_statement(load_reward(out).describe(), {"source": "file"})
    g = s["guarantee"]
    assert s["privacy_event"]["kind"] == "parallel_composed" and "()" not in s["statement"]
    assert 0.0 < g["epsilon"] <= 2.0 * (1 + 1e-9) and math.isfinite(g["epsilon"])
    assert g["delta"] <= (1e-5 if method != "rr-iht" else 0.0) * (1 + 1e-9)
    assert f"ε={g['epsilon']:.6g}" in s["statement"]
