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


def test_props_route_runs_through_the_frontier_and_resumes(tmp_path, monkeypatch):
    """``props:dpo@8`` as a frontier route on a tiny random Llama (fake gold): its checkpoints are records,
    its guarantee is ε-label-DP, and a rerun trains nothing."""
    import privalign.experiments.frontier as fr
    import privalign.rlhf.props as props_mod
    from _util import tiny_char_llama
    from privalign.experiments.base import RunContext

    def prompts(cfg):
        E, G, n = cfg["eval_prompts"], cfg["grpo_prompts"], cfg["n_pairs"]
        w = [f"prompt {k} " for k in range(E + G + n)]
        return {
            "eval": w[:E], "eval_info": {"offset": 0}, "grpo": w[E : E + G], "grpo_info": {"offset": E},
            "pairs": w[E + G :], "pairs_info": {"offset": E + G},
        }  # fmt: skip

    class Gold:
        def score(self, texts):
            return np.array([(sum(c in "aeiou" for c in t) + 1) / (len(t) + 2) for t in texts])

    monkeypatch.setattr(fr, "_prompts", prompts)
    model, tok = tiny_char_llama(layers=1, seed=0)
    model.eval()

    def ctx():
        c = RunContext(run_dir=tmp_path / "run")
        c.cache["base"], c.cache["gold"] = (model, tok, "tiny"), Gold()
        return c

    exp = fr.EXPERIMENTS["beyond-frontier"]
    cfg = {k: f.default for k, f in exp.schema.items()}
    cfg.update(
        routes=["props:dpo@8"], eval_prompts=3, grpo_prompts=1, n_pairs=16, max_new_tokens=4,
        reference_samples=4, eval_samples=2, bon_ns=[1, 2, 4], dpo_batch=4, dpo_epochs=1, dpo_max_length=16,
        dpo_lora_rank=2, dpo_eval_every=2, props_seeds=1, n_bootstrap=100, alt_gold="",
    )  # fmt: skip

    def run():
        out = []
        for i, cell in enumerate(exp.cells(cfg, ctx())):
            out += exp.run_cell(cell, cfg, ctx(), np.random.SeedSequence(0, spawn_key=(i,)))
        return out

    recs = [r for r in run() if r["kind"] == "frontier"]
    (r,) = recs
    assert [p["x"] for p in r["points"]] == [0, 2, 4]  # 2 stages × 8 pairs / batch 4 = 4 steps
    assert (
        r["guarantee"]["unit"].startswith("ε-label-DP") and r["guarantee"]["privacy_event"]["epsilon"] == 8.0
    )
    assert "PROPS, 2 stages" in r["guarantee"]["statement"]

    def boom(*a, **k):
        raise AssertionError("retrained a route that has records")

    monkeypatch.setattr(props_mod, "train_props", boom)
    again = [x for x in run() if x["kind"] == "frontier"]
    assert again == recs
