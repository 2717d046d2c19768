"""``privalign build-pool``: generate candidates, score them with a proxy and a true/gold reward, and write
a scored pool (resumable; rerun the same command to resume)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from privalign.cli._args import emit_json

if TYPE_CHECKING:
    from privalign.pipeline.workflow import PoolBuildOptions


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "build-pool",
        help="generate and score a candidate pool (scored-pool JSONL + manifest; resumable)",
        description="Generate n completions per prompt, score them with a proxy and a true/gold reward, and "
        "write the scored-pool format with a manifest. Interrupted runs resume when the same command is "
        "rerun. A verifier reward (gsm8k, mmlu, math) scores only its own --dataset: other pairings are "
        "refused before anything loads.",
    )
    p.add_argument(
        "--dataset",
        "--data",
        dest="dataset",
        required=True,
        choices=["imdb", "gsm8k", "mmlu", "hh-rlhf", "math"],
        help="prompt source (--data is an alias, as in fit-reward)",
    )
    p.add_argument("--math-path", default=None, help="MATH JSONL file (MATH is not redistributed)")
    p.add_argument(
        "--mmlu-subjects",
        default="college_mathematics,college_chemistry",
        help="mmlu: comma-separated subjects (default: the authors' two)",
    )
    p.add_argument(
        "--prompt-words", type=int, default=10, help="IMDb: words of the review opening used as prompt"
    )
    p.add_argument(
        "--hh-prompt",
        default="dialogue",
        choices=["dialogue", "first-turn"],
        help="hh-rlhf: the whole dialogue up to the last 'Assistant:' (default) or only its first human turn",
    )
    p.add_argument(
        "--generator",
        default="transformers",
        choices=["transformers", "ctranslate2", "openai", "vllm"],
        help="transformers (reference), ctranslate2 (fast CPU, int8; needs privalign[fast-cpu]), "
        "openai, vllm",
    )
    p.add_argument(
        "--model",
        default=None,
        help="transformers/ctranslate2: 'smollm2' (default), a local HF dir or .gguf; "
        "openai/vllm: model name",
    )
    p.add_argument(
        "--compute-type", default="int8", help="ctranslate2: compute type (int8 default, float32, ...)"
    )
    p.add_argument(
        "--ct2-reseed",
        default="block",
        choices=["block", "prompt"],
        help="ctranslate2 seeding: 'block' (default: one model reload per --ct2-reseed-block prompts, "
        "each prompt consumes a fixed number of random draws) or 'prompt' (one reload per prompt, as pools "
        "built before "
        "block mode); both make resumed builds equal uninterrupted ones",
    )
    p.add_argument(
        "--ct2-reseed-block",
        type=int,
        default=32,
        help="ctranslate2, --ct2-reseed block: prompts per reseed block (default 32)",
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="openai: server base URL")
    p.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap prompts in the chat template (default: off for imdb, on otherwise)",
    )
    p.add_argument(
        "--assistant-prefix",
        default=None,
        help="text after the generation prompt (default for QA: 'Let me think step by step.\\n')",
    )
    p.add_argument("--n", type=int, required=True, help="candidates per prompt")
    p.add_argument(
        "--num-prompts", type=int, required=True, help="number of prompts (the first ones of the dataset)"
    )
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per candidate (default 32)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    p.add_argument("--top-k", type=int, default=50, help="top-k sampling (default 50)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1: off)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--batch-size", type=int, default=64, help="candidates per generate() call")
    p.add_argument(
        "--num-threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    p.add_argument(
        "--proxy-reward",
        required=True,
        help="vader | vader-compound | profanity | clean | linear:PATH | hf:DIR | gsm8k | mmlu | math | none",
    )
    p.add_argument("--true-reward", required=True, help="same choices as --proxy-reward")
    p.add_argument(
        "--backend",
        default="local",
        choices=["local", "ray"],
        help="local (default) or Ray Data (privalign[ray])",
    )
    p.add_argument(
        "--ray-address",
        default="local",
        help="ray: 'local' (default) or an existing cluster address, e.g. 'auto'",
    )
    p.add_argument(
        "--ray-num-cpus", type=int, default=None, help="ray: CPUs for a local Ray instance (default: all)"
    )
    p.add_argument("--ray-concurrency", type=int, default=1, help="ray: generator actors")
    p.add_argument("--seed", type=int, default=0, help="sampling seed, a non-negative integer (default 0)")
    p.add_argument("--max-chars", type=int, default=2000, help="texts longer than this are cut (and counted)")
    p.add_argument("--keep-work", action="store_true", help="keep OUT.partial.jsonl after finishing")
    p.add_argument(
        "--out",
        required=True,
        help="POOL.jsonl or POOL.jsonl.gz (manifest: POOL.manifest.json); a run holds OUT.lock while it "
        "writes, and a second run on the same --out is refused",
    )
    p.add_argument("--json", action="store_true", help="print the manifest as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=_run)


def _options(args: argparse.Namespace) -> PoolBuildOptions:
    """The flags as the library's options (same names and defaults)."""
    from privalign.pipeline.workflow import PoolBuildOptions

    return PoolBuildOptions(
        dataset=args.dataset,
        n=args.n,
        num_prompts=args.num_prompts,
        proxy_reward=args.proxy_reward,
        true_reward=args.true_reward,
        math_path=args.math_path,
        mmlu_subjects=args.mmlu_subjects.split(","),
        prompt_words=args.prompt_words,
        hh_prompt=args.hh_prompt,
        generator=args.generator,
        model=args.model,
        compute_type=args.compute_type,
        ct2_reseed=args.ct2_reseed,
        ct2_reseed_block=args.ct2_reseed_block,
        base_url=args.base_url,
        chat_template=args.chat_template,
        assistant_prefix=args.assistant_prefix,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        stop=args.stop,
        batch_size=args.batch_size,
        num_threads=args.num_threads,
        backend=args.backend,
        ray_address=args.ray_address,
        ray_num_cpus=args.ray_num_cpus,
        ray_concurrency=args.ray_concurrency,
        seed=args.seed,
        max_chars=args.max_chars,
        keep_work=args.keep_work,
    )


def _run(args: argparse.Namespace) -> int:
    from privalign.paths import check_out_file
    from privalign.pipeline.workflow import build_pool_from_options, pool_capacity_lines

    check_out_file(args.out)  # before any dataset or model loads
    manifest = build_pool_from_options(_options(args), args.out, progress=not args.no_progress)
    if args.json:
        emit_json(manifest)
    else:
        print(
            f"wrote {args.out}: {manifest['num_prompts']} prompts x "
            f"{manifest['candidates_per_prompt']} candidates; counts {manifest['counts']}",
            file=sys.stderr,
        )
    for line in pool_capacity_lines(args.out, args.proxy_reward, args.true_reward):
        print(line, file=sys.stderr)
    return 0
