"""The CTranslate2 backend: conversion from local files into a cache, determinism, build-pool with
``--generator ctranslate2``, the missing-extra error, and (``model``) agreement of its output distribution
with the transformers reference on SmolLM2."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from _models_helpers import make_tiny_causal_lm

from privalign.errors import MissingDependencyError
from privalign.models.generators import SamplingParams


@pytest.fixture(scope="module")
def tiny_ct2(tmp_path_factory):
    pytest.importorskip("ctranslate2")
    from privalign.models.generators import CTranslate2Generator

    d = make_tiny_causal_lm(tmp_path_factory.mktemp("tinylm"))
    cache = tmp_path_factory.mktemp("ct2cache")
    g = CTranslate2Generator(
        str(d),
        params=SamplingParams(max_new_tokens=6, top_k=50),
        batch_size=4,
        cache_dir=str(cache),
        num_threads=1,
        progress=False,
    )
    return g, d, cache


def test_ct2_conversion_is_cached_and_generation_is_reproducible(tiny_ct2):
    from privalign.models.generators import CTranslate2Generator, ct2_model_dir

    g, d, cache = tiny_ct2
    assert g.model_dir.parent == cache and (g.model_dir / "model.bin").is_file()
    info = json.loads((g.model_dir / "privalign_ct2.json").read_text())
    assert info["quantization"] == "int8"
    mtime = (g.model_dir / "model.bin").stat().st_mtime_ns
    assert ct2_model_dir(str(d), cache_dir=str(cache)) == g.model_dir  # second call: no reconversion
    assert (g.model_dir / "model.bin").stat().st_mtime_ns == mtime
    a = g.generate(["the film", "a story"], 6, seed=11)
    b = g.generate(["the film", "a story"], 6, seed=11)
    assert [[c.text for c in r] for r in a] == [[c.text for c in r] for r in b]
    assert all(len(r) == 6 and all(0 <= c.num_tokens <= 6 for c in r) for r in a)
    assert all(c.finish_reason in ("stop", "length") for r in a for c in r)
    alone = g.generate(
        ["a story"], 6, seed=11, prompt_indices=[1]
    )  # seeds keyed by prompt index, not position
    assert [c.text for c in alone[0]] == [c.text for c in a[1]]
    other = g.generate(["the film"], 6, seed=12)
    assert [c.text for c in other[0]] != [c.text for c in a[0]]
    # a directory that already holds a CTranslate2 model is used as is
    g2 = CTranslate2Generator(str(g.model_dir), params=g.params, batch_size=4, num_threads=1, progress=False)
    assert [c.text for c in g2.generate(["the film"], 6, seed=11)[0]] == [c.text for c in a[0]]
    assert g.describe()["backend"] == "ctranslate2"


def test_build_pool_with_ct2_backend(tiny_ct2, tmp_path, monkeypatch):
    from privalign.cli import main as cli_main
    from privalign.data.pools import read_pool

    _, d, cache = tiny_ct2
    monkeypatch.setenv("PRIVALIGN_CACHE_DIR", str(cache.parent))
    out = tmp_path / "p.jsonl"
    args = [
        "build-pool",
        "--dataset",
        "imdb",
        "--generator",
        "ctranslate2",
        "--model",
        str(d),
        "--n",
        "4",
        "--num-prompts",
        "2",
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
        "--num-threads",
        "1",
        "--proxy-reward",
        "vader",
        "--true-reward",
        "clean",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert cli_main(args) == 0
    recs = read_pool(out)
    assert len(recs) == 2 and all(len(r.responses) == 4 for r in recs)
    man = json.loads((tmp_path / "p.manifest.json").read_text())
    assert man["generator"]["backend"] == "ctranslate2" and man["generator"]["compute_type"] == "int8"
    # build-pool's default seeding is block reseeding (recorded in the spec, hence in the resume fingerprint)
    assert man["generator"]["reseed"] == "block" and man["config"]["generator"]["reseed_block"] == 32
    out2 = tmp_path / "q.jsonl"
    assert cli_main([*args[:-1], str(out2), "--ct2-reseed", "prompt"]) == 0
    man2 = json.loads((tmp_path / "q.manifest.json").read_text())
    assert man2["generator"]["reseed"] == "prompt" and "reseed" not in man2["config"]["generator"]
    assert cli_main([*args[:-1], str(tmp_path / "r.jsonl"), "--ct2-reseed-block", "0"]) == 2


def test_missing_ctranslate2_names_the_extra(monkeypatch, tmp_path, capsys):
    from privalign.cli import main as cli_main
    from privalign.models.generators import CTranslate2Generator

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    with pytest.raises(MissingDependencyError, match=r"privalign\[fast-cpu\]"):
        CTranslate2Generator(progress=False)
    out = tmp_path / "p.jsonl"
    rc = cli_main(
        [
            "build-pool",
            "--dataset",
            "imdb",
            "--generator",
            "ctranslate2",
            "--n",
            "2",
            "--num-prompts",
            "1",
            "--proxy-reward",
            "vader",
            "--true-reward",
            "clean",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "privalign[fast-cpu]" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "p.jsonl.partial.jsonl").exists()


def _mean_logprob_per_token(ref, prompt: str, texts: list[str]) -> np.ndarray:
    """Mean log-probability per token of each completion under the transformers reference model."""
    import torch

    base = ref.tokenizer(ref.format_prompt(prompt), add_special_tokens=False)["input_ids"]
    out = []
    for t in texts:
        ids = ref.tokenizer(t, add_special_tokens=False)["input_ids"]
        if not ids:
            continue
        x = torch.tensor([base + ids])
        with torch.inference_mode():
            logits = ref.model(x).logits[0, len(base) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)
        out.append(float(lp.mean()))
    return np.asarray(out)


@pytest.mark.model
@pytest.mark.slow
def test_ct2_matches_transformers_distribution():
    """Statistic: the mean per-token log-probability (under the fp32 transformers model) of sampled
    completions.

    Rule: |mean_ct2 − mean_tr| ≤ z_{1−α/2}·SE + δ with α = 0.001 (two-sided, exact normal quantile) and an
    allowed systematic shift δ = 0.15 nats/token for int8 quantisation. Power check: ct2 samples at
    temperature 2 (a different law) must violate the same rule.
    """
    pytest.importorskip("ctranslate2")
    from scipy.stats import norm

    from privalign.models.generators import CTranslate2Generator, TransformersGenerator

    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=50)
    prompt = "How do I make my neighbour's dog stop barking?"
    n = 96
    ref = TransformersGenerator(params=params, batch_size=48, chat_template=True, progress=False)
    # the seeding build-pool uses (block reseeding): it changes the random stream, not the sampling law
    fast = CTranslate2Generator(
        params=params, batch_size=48, chat_template=True, reseed="block", progress=False
    )
    hot = CTranslate2Generator(
        params=SamplingParams(max_new_tokens=12, temperature=2.0, top_k=50),
        batch_size=48,
        chat_template=True,
        reseed="block",
        progress=False,
    )
    assert fast.format_prompt(prompt) == ref.format_prompt(prompt)
    lp_tr = _mean_logprob_per_token(ref, prompt, [c.text for c in ref.generate([prompt], n, seed=3)[0]])
    lp_ct = _mean_logprob_per_token(ref, prompt, [c.text for c in fast.generate([prompt], n, seed=3)[0]])
    lp_hot = _mean_logprob_per_token(ref, prompt, [c.text for c in hot.generate([prompt], n, seed=3)[0]])
    z, delta = float(norm.ppf(1 - 0.001 / 2)), 0.15

    def within(a, b):
        se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
        return abs(a.mean() - b.mean()) <= z * se + delta, a.mean() - b.mean(), z * se + delta

    ok, diff, tol = within(lp_ct, lp_tr)
    assert ok, f"ct2 vs transformers: mean log-prob differs by {diff:.3f} > tolerance {tol:.3f}"
    bad, diff_hot, tol_hot = within(lp_hot, lp_tr)
    assert not bad, (
        f"power check failed: temperature-2 samples differ by only {diff_hot:.3f} (tolerance {tol_hot:.3f})"
    )


def test_ct2_reseed_run_mode_is_reproducible_per_call_sequence(tiny_ct2):
    from privalign.errors import PrivacyParameterError
    from privalign.models.generators import CTranslate2Generator

    g, _, _ = tiny_ct2
    with pytest.raises(PrivacyParameterError, match="'reseed' parameter"):
        CTranslate2Generator(str(g.model_dir), reseed="never", progress=False)

    def run():
        r = CTranslate2Generator(
            str(g.model_dir), params=g.params, batch_size=4, num_threads=1, reseed="run", progress=False
        )
        out = [c.text for row in r.generate(["the film", "a story"], 6, seed=11) for c in row]
        return out + [c.text for c in r.generate(["the film"], 6, seed=11)[0]], r

    a, r = run()
    b, _ = run()
    assert a == b  # a fresh generator and the same calls: the same texts
    assert (
        a[:6] != a[12:]
    )  # the stream continues across calls (no reseed): the repeated prompt gets new texts
    assert r.describe()["reseed"] == "run"


def test_ct2_reseed_block_mode_per_prompt_reproducible_without_reload_per_prompt(tiny_ct2):
    """Block mode: one reload per block, every prompt consumes n * max_new_tokens draws, so a prompt's
    candidates do not depend on which prompts were generated before it (order, resume, other prompts'
    texts)."""
    from privalign.errors import PrivacyParameterError
    from privalign.models.generators import CTranslate2Generator

    g, _, _ = tiny_ct2
    with pytest.raises(PrivacyParameterError, match="'reseed_block' parameter"):
        CTranslate2Generator(str(g.model_dir), reseed="block", reseed_block=0, progress=False)

    # the random tiny model (near-uniform over its top 50) never samples its EOS; end instead on a quarter of
    # the vocabulary, so that many rows stop early and leave unused draws
    stop_ids = list(range(1000, 30522, 4))

    def fresh():
        r = CTranslate2Generator(
            str(g.model_dir),
            params=g.params,
            batch_size=4,
            num_threads=1,
            reseed="block",
            reseed_block=3,
            progress=False,
        )
        r.eos_ids = stop_ids
        return r

    prompts = ["the film", "a story", "it was", "my", "one of the", "why"]
    full = fresh()
    a = full.generate(prompts, 6, seed=11)
    assert full.reloads == 2  # indices 0-2 and 3-5: two blocks, not six reloads
    # rows stopping at EOS leave draws that must be consumed, else later prompts would shift: the check
    # has power
    assert any(c.finish_reason == "stop" and c.num_tokens < 6 for row in a[:5] for c in row)
    again = fresh().generate(prompts, 6, seed=11)
    assert [[c.text for c in r] for r in again] == [[c.text for c in r] for r in a]
    # out of order and one at a time (a resumed build): the same texts per prompt index
    odd = fresh()
    for i in (4, 1, 5, 2, 0, 3):
        row = odd.generate([prompts[i]], 6, seed=11, prompt_indices=[i])[0]
        assert [c.text for c in row] == [c.text for c in a[i]], i
    # other texts before prompt 2 in its block: prompt 2 unchanged
    other = fresh().generate(["zzz", "qq qq", prompts[2]], 6, seed=11)
    assert [c.text for c in other[2]] == [c.text for c in a[2]]
    assert [c.text for c in other[0]] != [c.text for c in a[0]]
    assert [c.text for c in fresh().generate(prompts[:1], 6, seed=12)[0]] != [c.text for c in a[0]]
    d = full.describe()
    assert d["reseed"] == "block" and d["reseed_block"] == 3 and "n * max_new_tokens" in d["seeding"]
