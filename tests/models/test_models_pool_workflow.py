"""The ``privalign build-pool`` workflow as library calls (:mod:`privalign.pipeline.workflow`): a whole build
with a fake generator (no model), the checks that refuse options before anything loads or is written, the
lock on ``out`` and the capacity reading."""

from __future__ import annotations

import pytest

import privalign.data.datasets as datasets
from privalign.data.datasets import Example
from privalign.data.pools import read_pool
from privalign.errors import PrivacyParameterError
from privalign.models.generators import Completion
from privalign.pipeline.build_pool import manifest_path, work_path
from privalign.pipeline.workflow import (
    PoolBuildOptions,
    build_pool_from_options,
    check_pool_options,
    out_lock,
    pool_capacity_lines,
)

TEXTS = ["a wonderful, brilliant film", "an awful, boring film", "a film", "good fun", "dull and bad"]


class _FakeGenerator:
    """Candidate j of prompt i is TEXTS[(i + j) % 5]: no model, varied sentiment."""

    model_id, params = "fake", None

    def generate(self, prompts, n, *, seed, prompt_indices=None):
        return [
            [
                Completion(text=TEXTS[(i + j) % len(TEXTS)], num_tokens=3, finish_reason="stop")
                for j in range(n)
            ]
            for i in prompt_indices
        ]

    def describe(self):
        return {"backend": "fake"}


def _opts(**kw) -> PoolBuildOptions:
    base = dict(
        dataset="imdb", n=4, num_prompts=3, proxy_reward="vader", true_reward="vader-compound", seed=5
    )
    base.update(kw)
    return PoolBuildOptions(**base)


def test_a_whole_build_with_a_fake_generator(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [Example(prompt=f"p{i}") for i in range(5)])
    out = tmp_path / "pool.jsonl"
    m = build_pool_from_options(_opts(), out, progress=False, generator=_FakeGenerator())
    recs = read_pool(out)
    assert [len(r.responses) for r in recs] == [4, 4, 4] and m["num_prompts"] == 3
    assert [x.text for x in recs[1].responses] == TEXTS[1:5]
    # the command's defaults: imdb has no chat template and no assistant prefix; ct2 reseeding is not recorded
    gen = m["config"]["generator"]
    assert gen["kind"] == "transformers" and gen["chat_template"] is False and gen["assistant_prefix"] == ""
    assert gen["sampling"] == {"max_new_tokens": 32, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
    assert "reseed" not in gen and m["config"]["dataset_options"] == {"num_words": 10}
    assert manifest_path(out).is_file() and not work_path(out).exists()
    assert not (tmp_path / "pool.jsonl.lock").exists()
    lines = pool_capacity_lines(out, "vader", "vader-compound")
    assert lines and any("capacity reading:" in line for line in lines)
    assert pool_capacity_lines(out, "vader", "none") == []
    assert pool_capacity_lines(tmp_path / "missing.jsonl", "vader", "clean") == []


def test_qa_defaults_chat_template_and_prefix(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [Example(prompt="q", gt_answer="1")])
    m = build_pool_from_options(
        _opts(dataset="gsm8k", num_prompts=1, n=2, proxy_reward="gsm8k", true_reward="none"),
        tmp_path / "qa.jsonl",
        progress=False,
        generator=_FakeGenerator(),
    )
    gen = m["config"]["generator"]
    assert gen["chat_template"] is True and gen["assistant_prefix"] == "Let me think step by step.\n"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(true_reward="gsm8k"), "argument --true-reward: 'gsm8k' is the gsm8k answer verifier"),
        (dict(dataset="gsm8k", proxy_reward="math"), "argument --proxy-reward: 'math' is the math answer"),
        (
            dict(math_path="m.jsonl"),
            "argument --math-path: used only with --dataset math, got --dataset imdb",
        ),
        (
            dict(generator="ctranslate2", ct2_reseed_block=0),
            "argument --ct2-reseed-block: must be >= 1, got 0",
        ),
        (dict(generator="openai"), "argument --model: required with --generator openai"),
        (dict(num_prompts=6), "argument --num-prompts: 6 exceeds the 5 prompts of imdb"),
    ],
)
def test_bad_options_are_refused_naming_the_flag_and_nothing_is_written(tmp_path, monkeypatch, kw, message):
    loaded = []

    def load(*a, **k):
        loaded.append(a)
        return [Example(prompt=f"p{i}") for i in range(5)]

    monkeypatch.setattr(datasets, "load_dataset", load)
    with pytest.raises(PrivacyParameterError, match="^" + message.replace("(", r"\(")):
        build_pool_from_options(
            _opts(**kw), tmp_path / "pool.jsonl", progress=False, generator=_FakeGenerator()
        )
    assert list(tmp_path.iterdir()) == []
    assert loaded == ([] if "num-prompts" not in message else [("imdb",)])  # refused before loading


def test_check_pool_options_accepts_a_verifier_on_its_own_dataset():
    check_pool_options(_opts(dataset="math", proxy_reward="math", true_reward="none", math_path="m.jsonl"))


def test_the_lock_refuses_a_second_holder(tmp_path):
    out = tmp_path / "new" / "pool.jsonl"
    with out_lock(out):
        assert (tmp_path / "new" / "pool.jsonl.lock").is_file()
        with pytest.raises(PrivacyParameterError, match=r"^argument --out: another build-pool run \(pid "):
            with out_lock(out):
                pass
    assert not (tmp_path / "new").exists()  # the directory made for the lock only is removed
