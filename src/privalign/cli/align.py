"""``privalign align``: train a policy (SmolLM2-135M-Instruct + LoRA, TRL GRPO) against a (private) reward
model.

The reward model is a file written by ``privalign fit-reward --out`` (RR-IHT, Sample-DP IHT, dense RR, DP-SGD,
or non-private MLE/IHT), or ``vader`` / ``linear:PATH`` as a non-private reference. The RL prompts are public:
by default held-out IMDb review openings (``--prompts imdb``), else a .txt/.jsonl file; prompts that overlap
the reward model's preference data are refused unless ``--allow-overlap``. The KL coefficient ``--beta`` to
the reference policy must be > 0.

The trained policy (``OUT/policy``, a plain HF model directory) is post-processing of the reward model: it
inherits the reward model's (ε, δ) and privacy unit, and adds no privacy cost. Re-running the same command
resumes from the newest checkpoint in ``OUT/checkpoints`` (a line on stderr says from which step); other
options on the same ``OUT`` are refused, naming what differs. Exit status 2 on bad input.
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
    from privalign.paths import check_out_dir

    try:  # before torch is imported or the reward model, the prompts or the base model load
        check_out_dir(args.out)
    except ValueError as exc:
        return _fail(str(exc))
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
    if args.num_threads is not None and args.num_threads < 1:
        return _fail(f"argument --num-threads: must be an integer >= 1. Got {args.num_threads}.")
    from privalign.rlhf.workflow import align

    try:
        res = align(
            args.reward_model,
            args.out,
            cfg,
            prompts=args.prompts,
            num_prompts=args.num_prompts,
            prompt_offset=args.prompt_offset,
            base_model=args.base_model,
            allow_overlap=args.allow_overlap,
            num_threads=args.num_threads,
            progress=not args.no_progress,
            on_resume=lambda ckpt, step: print(
                f"privalign align: resuming the interrupted run in {args.out} from step {step} of "
                f"{cfg.steps} (checkpoint {ckpt})",
                file=sys.stderr,
                flush=True,
            ),
        )
    except (DataFormatError, PrivacyParameterError, MissingDependencyError) as exc:
        return _fail(str(exc))
    except FileNotFoundError as exc:
        if not str(exc).startswith("argument "):  # not a flag's file: the error boundary words it
            raise
        return _fail(str(exc))
    man = {k: v for k, v in res.items() if k not in ("model", "tokenizer")}
    if args.json:
        print(json.dumps(man, indent=2, default=str))
    else:
        log = man.get("training_log") or []
        first = log[0]["reward"] if log else float("nan")
        last = log[-1]["reward"] if log else float("nan")
        print(
            f"aligned {man['steps_done']} steps on {man['prompts']['n']} prompts; training reward "
            f"{first:.4g} -> {last:.4g}; policy saved to {man['policy_dir']}"
        )
        print(man["privacy"]["statement"])
    return 0
