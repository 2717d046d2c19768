"""Benchmark: policy optimisation throughput (TRL GRPO + LoRA on SmolLM2-135M-Instruct, CPU) against the named
baseline plain ``model.generate`` on the same prompts, same number of sequences and tokens, in the same run.

Usage:
  python benchmarks/bench_rlhf.py [--steps 4] [--prompts-per-step 1] [--num-generations 4]
                                  [--max-new-tokens 16] [--threads 1] [--base smollm2]

Reports RL steps per minute, generated tokens per second during RL (completion tokens of every GRPO step /
wall time of the steps, which includes scoring, the reference forward pass, the policy backward pass and the
optimiser step), the same for plain sampling with ``model.generate``, their ratio, and the peak resident
memory of the process after the baseline and after RL (``ru_maxrss``; monotone, so the second is the run's
peak).
The reward is a RR-IHT model (ε = 8) fitted on held-out IMDb pairs (not timed).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts-per-step", type=int, default=1)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--base", default="smollm2")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from _rlhf_common import fit_imdb_rriht_reward
    from privalign.rlhf.prompts import imdb_rl_prompts
    from privalign.rlhf.rewards import PrivateReward
    from privalign.rlhf.train import AlignConfig, align_policy, load_base_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_rlhf_"))
    reward = PrivateReward(fit_imdb_rriht_reward(tmp))
    n_prompts = args.steps * args.prompts_per_step
    prompts, info = imdb_rl_prompts(n_prompts)
    t0 = time.perf_counter()
    base = load_base_model(args.base)
    t_load = time.perf_counter() - t0
    rss_load = _rss_mib()

    # baseline: plain model.generate (ancestral sampling, as in RL), the same prompts, G samples each, same
    # token cap
    model, tok = base[0], base[1]
    model.eval()
    eos = model.generation_config.eos_token_id
    gen_tokens = 0
    t0 = time.perf_counter()
    for p in prompts:
        enc = tok([p] * args.num_generations, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=eos,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        gen_tokens += int(
            sum(
                min(len(r), (r == eos).nonzero()[0, 0].item() + 1 if (r == eos).any() else len(r))
                for r in new
            )
        )
    t_gen = time.perf_counter() - t0
    rss_gen = _rss_mib()

    cfg = AlignConfig(
        steps=args.steps,
        num_generations=args.num_generations,
        prompts_per_step=args.prompts_per_step,
        max_new_tokens=args.max_new_tokens,
        lora_rank=16,
        lora_alpha=32.0,
        save_steps=args.steps,
        seed=0,
    )
    res = align_policy(reward, prompts, info, tmp / "run", cfg, base=base, save_policy=False, progress=False)
    log = res["training_log"]
    t_rl = sum(h["step_time"] for h in log)
    rl_tokens = sum(h["completions/mean_length"] for h in log) * args.num_generations * args.prompts_per_step
    rss_rl = _rss_mib()
    rows = {
        "config": (
            f"{args.steps} GRPO steps × {args.prompts_per_step} prompt(s) × {args.num_generations} samples × "
            f"≤{args.max_new_tokens} tokens, LoRA r=16, {args.threads} thread(s)"
        ),
        "load_seconds": t_load,
        "rl_steps_per_min": 60.0 * len(log) / t_rl,
        "rl_seconds_per_step": t_rl / len(log),
        "rl_tokens_per_s": rl_tokens / t_rl,
        "generate_tokens_per_s": gen_tokens / t_gen,
        "generate_seconds": t_gen,
        "ratio_rl_over_generate_tokens_per_s": (rl_tokens / t_rl) / (gen_tokens / t_gen),
        "peak_rss_mib_after_load": rss_load,
        "peak_rss_mib_after_generate": rss_gen,
        "peak_rss_mib_after_rl": rss_rl,
        "note": (
            "baseline: model.generate(do_sample=True) on the same prompts; its token count stops at EOS "
            "(EOS included); RL tokens are TRL's completion lengths"
        ),
    }
    print(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
