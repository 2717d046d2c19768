"""PROPS (privalign.rlhf.props): the MAP relabelling, the public stage split, and a tiny two-stage run whose
privacy statement is the label-DP event of its one randomized response per label."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privalign.rlhf.props import props_relabel, props_stages


def test_relabel_is_the_posterior_argmax():
    rho = 1 / (1 + math.e**1)  # ε = 1
    rr = np.array([1, 1, 0, 0, 1])
    prior = np.array([0.5, 0.1, 0.9, 0.5, 0.2])
    # ỹ = 1 is kept unless the prior against it beats the likelihood ratio (1 − ρ)/ρ = e
    got = props_relabel(rr, prior, rho)
    want = [int(p * (1 - rho if y else rho) >= (1 - p) * (rho if y else 1 - rho)) for y, p in zip(rr, prior)]
    assert got.tolist() == want == [1, 0, 1, 0, 0]
    assert props_relabel(rr, prior, 0.0).tolist() == rr.tolist()  # no noise: the labels stand
    with pytest.raises(ValueError):
        props_relabel(rr, prior, 0.5)


def test_stages_are_a_disjoint_public_split():
    parts = props_stages(10, 3, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(10)) and [len(p) for p in parts] == [4, 3, 3]
    with pytest.raises(ValueError):
        props_stages(3, 1, np.random.default_rng(0))


torch = pytest.importorskip("torch")
pytest.importorskip("peft")


def test_two_stage_props_runs_and_states_one_label_dp_event():
    from _util import tiny_char_llama
    from privalign.data.preferences_io import TextPairs
    from privalign.rlhf.dpo import DPOConfig
    from privalign.rlhf.props import train_props

    model, tok = tiny_char_llama(layers=1, seed=0)
    n = 16
    pairs = TextPairs([f"p{i} " for i in range(n)], ["good"] * n, ["bad"] * n, list(range(n)), "toy")
    cfg = DPOConfig(privacy="label", epsilon=2.0, batch_size=4, epochs=1, max_length=12, lora_rank=2)
    seen: list[int] = []
    out = train_props(
        pairs, cfg, stages=2, model=model, tokenizer=tok, rng=np.random.default_rng(0),
        on_step=lambda t, pol: seen.append(t),
    )  # fmt: skip
    assert [s["pairs"] for s in out["stages"]] == [8, 8] and seen == list(range(1, out["steps"] + 1))
    ev = out["privacy"]["privacy_event"]
    assert ev["kind"] == "randomized_response" and ev["epsilon"] == 2.0 and ev["unit"] == "label"
    assert "PROPS, 2 stages" in out["privacy"]["statement"]
