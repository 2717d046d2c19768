"""``privalign build-pool``: generate candidates, score them with a proxy and a true/gold reward, and write
a scored pool (resumable; rerun the same command to resume)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

from privalign.cli._args import emit_json


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


def _check_reachable(base_url: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the flag, when nothing answers at ``--base-url`` (any HTTP answer counts as
    reachable)."""
    import urllib.error
    import urllib.request

    from privalign.errors import PrivacyParameterError

    if not base_url.startswith(("http://", "https://")):
        raise PrivacyParameterError(
            f"argument --base-url: must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}"
        )
    try:
        urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=timeout_s).close()  # noqa: S310
    except urllib.error.HTTPError:
        return  # the server answered
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrivacyParameterError(
            f"argument --base-url: nothing answers at {base_url} ({reason}); "
            "start the OpenAI-compatible server (e.g. vLLM) first or fix the URL"
        ) from None


#: The verifier rewards: each checks answers against the reference answers of its own dataset only.
_VERIFIERS = ("gsm8k", "mmlu", "math")


def _check_compatible(args: argparse.Namespace) -> None:
    """Options that cannot work together are refused before any dataset or model is loaded (a verifier on
    another dataset failed only while scoring, after the model had loaded and generated)."""
    from privalign.errors import PrivacyParameterError

    for flag, name in (("--proxy-reward", args.proxy_reward), ("--true-reward", args.true_reward)):
        if name in _VERIFIERS and name != args.dataset:
            raise PrivacyParameterError(
                f"argument {flag}: {name!r} is the {name} answer verifier: it scores only --dataset {name} "
                f"(it compares each answer with the dataset's reference answer, which --dataset "
                f"{args.dataset} does not have); use --dataset {name}, or a reward that reads any text "
                "(vader, clean, linear:PATH, hf:DIR, ...)"
            )
    if args.math_path is not None and args.dataset != "math":
        raise PrivacyParameterError(
            f"argument --math-path: used only with --dataset math, got --dataset {args.dataset}; drop "
            "--math-path"
        )


@contextlib.contextmanager
def out_lock(out: str) -> Iterator[None]:
    """Hold ``OUT.lock`` while a run writes ``--out`` (its work file, the pool and the manifest): a second
    run on the same ``--out`` is refused (exit 2) instead of failing mid-way on the first one's work file.

    The lock is an advisory ``flock`` on the lock file, which also holds the owner's pid for the message:
    the kernel releases it when its process ends, however it ends, so a lock file left by a killed run is
    stale and simply taken over. The file is removed on release.
    """
    import os

    from privalign.errors import PrivacyParameterError

    try:
        import fcntl
    except ImportError:  # no flock (Windows): no lock
        yield
        return
    path = f"{out}.lock"
    created = []  # the directories made for the lock file, removed again if the run left them empty
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        created.append(parent)
        parent = os.path.dirname(parent)
    for d in reversed(created):
        os.mkdir(d)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise PrivacyParameterError(
                f"argument --out: another build-pool run (pid {owner}) is writing {out} (it holds {path}); "
                "wait for it to finish, or give another --out"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:  # removed by the owner as we opened it: take a fresh one
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.unlink(path)
        os.close(fd)
        for d in created:
            with contextlib.suppress(OSError):  # not empty: the run wrote there
                os.rmdir(d)


def _run(args: argparse.Namespace) -> int:
    _check_compatible(args)
    with out_lock(args.out):
        return _build(args)


def _build(args: argparse.Namespace) -> int:
    from privalign.pipeline.build_pool import PoolConfig, build_pool, load_pool_prompts
    from privalign.pipeline.steps import generator_spec

    qa = args.dataset in ("gsm8k", "mmlu", "math")
    chat = args.chat_template if args.chat_template is not None else args.dataset != "imdb"
    prefix = (
        args.assistant_prefix
        if args.assistant_prefix is not None
        else ("Let me think step by step.\n" if qa else "")
    )
    sampling = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
    }
    if args.generator == "ctranslate2" and args.ct2_reseed == "block" and args.ct2_reseed_block < 1:
        print(
            (
                "privalign build-pool: error: argument --ct2-reseed-block: must be >= 1, "
                f"got {args.ct2_reseed_block}"
            ),
            file=sys.stderr,
        )
        return 2
    if args.generator == "openai":
        if not args.model:
            print(
                (
                    "privalign build-pool: error: argument --model: required with --generator openai "
                    "(the served model name)"
                ),
                file=sys.stderr,
            )
            return 2
        _check_reachable(args.base_url)
    gen = generator_spec(
        args.generator,
        model=args.model,
        sampling=sampling,
        stop=args.stop,
        batch_size=args.batch_size,
        chat_template=chat,
        assistant_prefix=prefix,
        num_threads=args.num_threads,
        compute_type=args.compute_type,
        # "prompt" is the generator's default: left out, so earlier pools keep their fingerprint
        reseed_block=args.ct2_reseed_block if args.ct2_reseed == "block" else None,
        base_url=args.base_url,
    )
    examples, ds_opts = load_pool_prompts(
        args.dataset,
        num_prompts=args.num_prompts,
        prompt_words=args.prompt_words,
        hh_prompt=args.hh_prompt,
        mmlu_subjects=args.mmlu_subjects.split(","),
        math_path=args.math_path,
    )
    if args.num_prompts > len(examples):
        print(
            (
                f"privalign build-pool: error: argument --num-prompts: {args.num_prompts} exceeds the "
                f"{len(examples)} prompts of {args.dataset}"
            ),
            file=sys.stderr,
        )
        return 2
    cfg = PoolConfig(
        dataset=args.dataset,
        n=args.n,
        seed=args.seed,
        generator=gen,
        proxy_reward=args.proxy_reward,
        true_reward=args.true_reward,
        num_prompts=args.num_prompts,
        max_chars=args.max_chars,
        dataset_options=ds_opts,
    )
    ray_opts = {
        "address": args.ray_address,
        "num_cpus": args.ray_num_cpus,
        "concurrency": args.ray_concurrency,
    }
    manifest = build_pool(
        cfg,
        examples,
        args.out,
        backend=args.backend,
        keep_work=args.keep_work,
        progress=not args.no_progress,
        ray_options=ray_opts if args.backend == "ray" else None,
    )
    if args.json:
        emit_json(manifest)
    else:
        print(
            f"wrote {args.out}: {manifest['num_prompts']} prompts x "
            f"{manifest['candidates_per_prompt']} candidates; counts {manifest['counts']}",
            file=sys.stderr,
        )
    _print_capacity(args)
    return 0


def _print_capacity(args: argparse.Namespace) -> None:
    """The pool's capacity diagnostic (can it show over-optimisation at the N it holds?) on the terminal,
    when it has both rewards. Printed only: a manifest holds configuration, not statistics of the scores."""
    import math
    import os

    if "none" in (args.proxy_reward, args.true_reward) or not os.path.isfile(args.out):
        return

    from privalign.alignment.capacity import capacity_diagnostic, capacity_lines
    from privalign.data.pools import read_pool

    recs = read_pool(args.out)
    proxies = [[r.proxy_reward for r in rec.responses] for rec in recs]
    golds = [[r.true_value for r in rec.responses] for rec in recs]
    if any(len(p) < 2 or not all(math.isfinite(v) for v in p + g) for p, g in zip(proxies, golds)):
        return
    for line in capacity_lines(capacity_diagnostic(proxies, golds)):
        print(line.strip(), file=sys.stderr)
