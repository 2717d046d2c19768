"""beyond-frontier at n beyond the 1,000 held-out IMDb openings (issue 37 item 3): the pair prompts keep the
held-out slice where it suffices (so the committed n = 400 records keep their prompts), continue with fit-part
openings otherwise, never repeat an eval/GRPO prompt or each other, and do not depend on n (prefix-stable)."""

from __future__ import annotations

from privalign.experiments.frontier import HELDOUT_OPENINGS, _more_pair_prompts, _prompts
from privalign.rlhf.prompts import imdb_rl_prompts


def test_small_n_uses_only_the_heldout_slice_as_before():
    cfg = {"eval_prompts": 80, "grpo_prompts": 64, "n_pairs": 400}
    p = _prompts(cfg)
    assert p["pairs"] == imdb_rl_prompts(400, offset=144)[0]
    assert "fit_part" not in p["pairs_info"]


def test_large_n_continues_with_fit_part_openings_disjoint_and_prefix_stable():
    small = _prompts({"eval_prompts": 80, "grpo_prompts": 64, "n_pairs": 1200})
    large = _prompts({"eval_prompts": 80, "grpo_prompts": 64, "n_pairs": 2000})
    held = HELDOUT_OPENINGS - 144
    assert large["pairs"][:held] == imdb_rl_prompts(held, offset=144)[0]
    assert large["pairs"][:1200] == small["pairs"]
    assert len(set(large["pairs"])) == 2000
    public = set(large["eval"]) | set(large["grpo"])
    assert not public & set(large["pairs"])
    assert large["pairs_info"]["fit_part"]["count"] == 2000 - held


def test_openings_equal_to_a_public_prompt_are_skipped():
    held = ["a b c"]
    first, _ = _more_pair_prompts(3, held, {}, [])
    # make the first fit-part opening a public prompt: it must be skipped, the count still met
    again, info = _more_pair_prompts(3, held, {}, [first[1]])
    assert first[1] not in again and len(again) == 4 and again[1:3] == first[2:4]
    assert info["fit_part"]["count"] == 3
