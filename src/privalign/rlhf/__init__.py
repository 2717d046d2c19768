"""Private RLHF: policy optimisation (TRL GRPO + LoRA) of SmolLM2-135M-Instruct against a privalign reward
model.

* :mod:`privalign.rlhf.rewards`: reward models as TRL reward functions (:func:`load_reward`).
* :mod:`privalign.rlhf.prompts`: public RL prompts (held-out IMDb openings) and the disjointness check against
  the reward model's private preference data.
* :mod:`privalign.rlhf.train`: :func:`align_policy` (checkpoints, manifest, resume).
* :mod:`privalign.rlhf.workflow`: ``privalign align`` as library calls: :func:`load_align_inputs` (reward,
  prompts, overlap check; no policy model) and :func:`align` (those, then :func:`align_policy`).
* :mod:`privalign.rlhf.evaluate`: gold reward, KL(policy ‖ reference), win rates with paired bootstrap
  intervals, best-of-N at equal KL.

Privacy: the trained policy is post-processing of the reward model, so it inherits the reward model's (ε, δ)
and privacy unit (docs/privacy/rlhf_policy.md). Imports of torch/TRL happen inside the functions.
"""

from privalign.rlhf.prompts import (
    check_prompts_disjoint,
    find_overlap,
    heldout_imdb_pairs,
    imdb_rl_prompts,
    load_prompt_file,
)
from privalign.rlhf.rewards import PrivateReward, ScorerReward, load_reward
from privalign.rlhf.train import AlignConfig, align_policy, load_base_model, privacy_statement
from privalign.rlhf.workflow import AlignInputs, align, load_align_inputs

__all__ = [
    "AlignConfig",
    "AlignInputs",
    "align",
    "align_policy",
    "load_align_inputs",
    "load_base_model",
    "privacy_statement",
    "PrivateReward",
    "ScorerReward",
    "load_reward",
    "check_prompts_disjoint",
    "find_overlap",
    "heldout_imdb_pairs",
    "imdb_rl_prompts",
    "load_prompt_file",
]
