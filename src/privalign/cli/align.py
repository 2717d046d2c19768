"""``privalign align``: train a policy (SmolLM2-135M-Instruct + LoRA, TRL GRPO) against a (private) reward
model.

The reward model is a file written by ``privalign fit-reward --out`` (RR-IHT, Sample-DP IHT, dense RR, DP-SGD,
or non-private MLE/IHT), or ``vader`` / ``linear:PATH`` as a non-private reference. The RL prompts are public:
by default held-out IMDb review openings (``--prompts imdb``), else a .txt/.jsonl file; prompts that overlap
the reward model's preference data are refused unless ``--allow-overlap``. The KL coefficient ``--beta`` to
the reference policy must be > 0.

The trained policy (``OUT/policy``, a plain HF model directory) is post-processing of the reward model: it
inherits the reward model's (ε, δ) and privacy unit, and adds no privacy cost. Re-running the same command
resumes from the newest checkpoint in ``OUT/checkpoints``. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "align",
        help="Train a policy with RL (TRL GRPO + LoRA) against a (private) reward model.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--reward-model",
        required=True,
        help="reward-model JSON (privalign fit-reward --out), 'vader' or 'linear:PATH'",
    )
    p.add_argument("--out", required=True, help="output directory (manifest, checkpoints, policy/)")
    p.add_argument(
        "--prompts", default="imdb", help="'imdb' (held-out IMDb openings, default) or a .txt/.jsonl file"
    )
    p.add_argument("--num-prompts", type=int, default=64, help="imdb: number of prompts (default 64)")
    p.add_argument(
        "--prompt-offset", type=int, default=0, help="imdb: start in the fixed prompt order (default 0)"
    )
    p.add_argument(
        "--base-model", default="smollm2", help="'smollm2' (default), a local HF directory or a .gguf file"
    )
    p.add_argument("--steps", type=int, default=20, help="optimiser steps (default 20)")
    p.add_argument(
        "--beta", type=float, default=0.05, help="KL coefficient to the reference policy, > 0 (default 0.05)"
    )
    p.add_argument("--learning-rate", type=float, default=2e-4, help="LoRA learning rate (default 2e-4)")
    p.add_argument(
        "--num-generations", type=int, default=4, help="samples per prompt in a GRPO group (default 4)"
    )
    p.add_argument("--prompts-per-step", type=int, default=1, help="prompts per optimiser step (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="completion length (default 16)")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA rank (default 16)")
    p.add_argument("--save-steps", type=int, default=5, help="checkpoint every this many steps (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--allow-overlap",
        action="store_true",
        help="train even if prompts overlap the private preference data",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (default: a bar with ETA on stderr)"
    )
    p.add_argument("--json", action="store_true", help="print the manifest as JSON on stdout")
    p.set_defaults(func=_run)


def _fail(msg: str) -> int:
    print(f"privalign align: error: {msg}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    import math

    from privalign.errors import DataFormatError, MissingDependencyError, PrivacyParameterError

    # cheap checks first (before any file or model is read)
    if not (isinstance(args.beta, float) and math.isfinite(args.beta) and args.beta > 0):
        return _fail(f"argument --beta: the KL coefficient must be a finite number > 0. Got {args.beta!r}.")
    from privalign.rlhf.train import AlignConfig

    try:
        cfg = AlignConfig(
            steps=args.steps,
            beta=args.beta,
            learning_rate=args.learning_rate,
            num_generations=args.num_generations,
            prompts_per_step=args.prompts_per_step,
            max_new_tokens=args.max_new_tokens,
            lora_rank=args.lora_rank,
            lora_alpha=2.0 * args.lora_rank,
            seed=args.seed,
            save_steps=args.save_steps,
        )
    except PrivacyParameterError as exc:
        return _fail(
            f"{exc} (flags: --steps --beta --learning-rate --num-generations --prompts-per-step "
            "--max-new-tokens --lora-rank --seed --save-steps)"
        )
    if args.num_threads is not None:
        if args.num_threads < 1:
            return _fail(f"argument --num-threads: must be an integer >= 1. Got {args.num_threads}.")
    from privalign.rlhf.prompts import check_prompts_disjoint, imdb_rl_prompts, load_prompt_file
    from privalign.rlhf.rewards import load_reward

    try:
        reward = load_reward(args.reward_model)
    except (FileNotFoundError, DataFormatError, PrivacyParameterError, MissingDependencyError) as exc:
        return _fail(f"argument --reward-model: {exc}")
    try:
        if args.prompts == "imdb":
            if not 1 <= args.num_prompts <= 1000 - max(args.prompt_offset, 0) or args.prompt_offset < 0:
                return _fail(
                    "argument --num-prompts/--prompt-offset: need 0 <= offset and 1 <= num-prompts <= 1000 "
                    f"- offset. Got --num-prompts {args.num_prompts}, --prompt-offset {args.prompt_offset}."
                )
            prompts, info = imdb_rl_prompts(args.num_prompts, offset=args.prompt_offset)
        else:
            prompts, info = load_prompt_file(args.prompts)
    except (FileNotFoundError, DataFormatError, PrivacyParameterError, MissingDependencyError) as exc:
        return _fail(f"argument --prompts: {exc}")
    try:
        overlap = check_prompts_disjoint(prompts, reward, allow_overlap=args.allow_overlap)
    except PrivacyParameterError as exc:
        return _fail(f"argument --prompts: {exc}")
    if overlap.get("overlapping_prompts"):
        print(
            f"privalign align: warning: {overlap['overlapping_prompts']} prompts overlap the reward model's "
            "preference data (--allow-overlap given); the policy's privacy statement does not cover those "
            "prompts.",
            file=sys.stderr,
        )
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)
    from privalign.rlhf.train import align_policy

    try:
        res = align_policy(
            reward,
            prompts,
            info,
            args.out,
            cfg,
            base_model=args.base_model,
            overlap_check=overlap,
            allow_overlap=args.allow_overlap,
            progress=not args.no_progress,
        )
    except PrivacyParameterError as exc:
        return _fail(f"argument --out: {exc}" if "'out'" in str(exc) else str(exc))
    except MissingDependencyError as exc:
        return _fail(str(exc))
    man = {k: v for k, v in res.items() if k not in ("model", "tokenizer")}
    if args.json:
        print(json.dumps(man, indent=2, default=str))
    else:
        log = man.get("training_log") or []
        first = log[0]["reward"] if log else float("nan")
        last = log[-1]["reward"] if log else float("nan")
        print(
            f"aligned {man['steps_done']} steps on {len(prompts)} prompts; training reward {first:.4g} -> "
            f"{last:.4g}; policy saved to {man['policy_dir']}"
        )
        print(man["privacy"]["statement"])
    return 0
