"""The ``privalign build-pool`` workflow as library calls: options → checks → lock on ``out`` → generator
spec, prompts, :class:`~privalign.pipeline.build_pool.PoolConfig` →
:func:`~privalign.pipeline.build_pool.build_pool` (resumable), and the pool's capacity reading.

:class:`PoolBuildOptions` holds what the command's flags hold, with the same defaults;
:func:`check_pool_options` refuses options that cannot work together before any dataset or model loads;
:func:`build_pool_from_options` runs the whole build. Errors about an option name its ``build-pool`` flag
(``argument --ct2-reseed-block: ...``).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from privalign.errors import PrivacyParameterError

__all__ = [
    "PoolBuildOptions",
    "build_pool_from_options",
    "check_pool_options",
    "check_reachable",
    "out_lock",
    "pool_capacity_lines",
]

#: The verifier rewards: each checks answers against the reference answers of its own dataset only.
VERIFIERS = ("gsm8k", "mmlu", "math")


@dataclass(frozen=True)
class PoolBuildOptions:
    """The options of a pool build (``privalign build-pool``'s flags, same names and defaults).

    ``chat_template=None``: off for imdb, on otherwise; ``assistant_prefix=None``: ``'Let me think step by
    step.\\n'`` for the QA datasets (gsm8k, mmlu, math), else empty.
    """

    dataset: str
    n: int
    num_prompts: int
    proxy_reward: str
    true_reward: str
    math_path: str | None = None
    mmlu_subjects: Sequence[str] = ("college_mathematics", "college_chemistry")
    prompt_words: int = 10
    hh_prompt: str = "dialogue"
    generator: str = "transformers"
    model: str | None = None
    compute_type: str = "int8"
    ct2_reseed: str = "block"
    ct2_reseed_block: int = 32
    base_url: str = "http://127.0.0.1:8000/v1"
    chat_template: bool | None = None
    assistant_prefix: str | None = None
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    stop: Sequence[str] = ()
    batch_size: int = 64
    num_threads: int | None = None
    backend: str = "local"
    ray_address: str = "local"
    ray_num_cpus: int | None = None
    ray_concurrency: int = 1
    seed: int = 0
    max_chars: int = 2000
    keep_work: bool = False


def check_pool_options(opts: PoolBuildOptions) -> None:
    """Refuse options that cannot work together, before any dataset or model is loaded (a verifier on
    another dataset failed only while scoring, after the model had loaded and generated).

    Raises:
      PrivacyParameterError: the message names the flag.
    """
    for flag, name in (("--proxy-reward", opts.proxy_reward), ("--true-reward", opts.true_reward)):
        if name in VERIFIERS and name != opts.dataset:
            raise PrivacyParameterError(
                f"argument {flag}: {name!r} is the {name} answer verifier: it scores only --dataset {name} "
                f"(it compares each answer with the dataset's reference answer, which --dataset "
                f"{opts.dataset} does not have); use --dataset {name}, or a reward that reads any text "
                "(vader, clean, linear:PATH, hf:DIR, ...)"
            )
    if opts.math_path is not None and opts.dataset != "math":
        raise PrivacyParameterError(
            f"argument --math-path: used only with --dataset math, got --dataset {opts.dataset}; drop "
            "--math-path"
        )


def _check_generator_options(opts: PoolBuildOptions) -> None:
    if opts.generator == "ctranslate2" and opts.ct2_reseed == "block" and opts.ct2_reseed_block < 1:
        raise PrivacyParameterError(f"argument --ct2-reseed-block: must be >= 1, got {opts.ct2_reseed_block}")
    if opts.generator == "openai" and not opts.model:
        raise PrivacyParameterError(
            "argument --model: required with --generator openai (the served model name)"
        )


def check_reachable(base_url: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the flag, when nothing answers at ``--base-url`` (any HTTP answer counts as
    reachable)."""
    import urllib.error
    import urllib.request

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


@contextlib.contextmanager
def out_lock(out: str | os.PathLike) -> Iterator[None]:
    """Hold ``OUT.lock`` while a run writes ``--out`` (its work file, the pool and the manifest): a second
    run on the same ``--out`` is refused (exit 2) instead of failing mid-way on the first one's work file.

    The lock is an advisory ``flock`` on the lock file, which also holds the owner's pid for the message:
    the kernel releases it when its process ends, however it ends, so a lock file left by a killed run is
    stale and simply taken over. The file is removed on release.
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no lock
        yield
        return
    out = os.fspath(out)
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


def _generator_spec(opts: PoolBuildOptions) -> dict[str, Any]:
    from privalign.pipeline.steps import generator_spec

    qa = opts.dataset in VERIFIERS
    chat = opts.chat_template if opts.chat_template is not None else opts.dataset != "imdb"
    prefix = (
        opts.assistant_prefix
        if opts.assistant_prefix is not None
        else ("Let me think step by step.\n" if qa else "")
    )
    sampling = {
        "max_new_tokens": opts.max_new_tokens,
        "temperature": opts.temperature,
        "top_k": opts.top_k,
        "top_p": opts.top_p,
    }
    return generator_spec(
        opts.generator,
        model=opts.model,
        sampling=sampling,
        stop=opts.stop,
        batch_size=opts.batch_size,
        chat_template=chat,
        assistant_prefix=prefix,
        num_threads=opts.num_threads,
        compute_type=opts.compute_type,
        # "prompt" is the generator's default: left out, so earlier pools keep their fingerprint
        reseed_block=opts.ct2_reseed_block if opts.ct2_reseed == "block" else None,
        base_url=opts.base_url,
    )


def build_pool_from_options(
    opts: PoolBuildOptions,
    out: str | os.PathLike,
    *,
    progress: bool = True,
    generator: Any = None,
    proxy: Any = None,
    true: Any = None,
) -> dict[str, Any]:
    """``privalign build-pool`` as one call: check ``opts``, hold ``OUT.lock`` (:func:`out_lock`), build the
    generator spec and load the prompts, then build or resume the pool at ``out`` and return its manifest.

    ``generator``, ``proxy``, ``true``: pre-built objects for the local backend (default: built from the
    options), as in :func:`~privalign.pipeline.build_pool.build_pool`.

    Raises:
      PrivacyParameterError: bad or incompatible options (naming the flag), another run holds ``out``, or
        the errors of :func:`~privalign.pipeline.build_pool.build_pool`.
    """
    from privalign.pipeline.build_pool import PoolConfig, build_pool, load_pool_prompts

    check_pool_options(opts)
    _check_generator_options(opts)
    with out_lock(out):
        if opts.generator == "openai":
            check_reachable(opts.base_url)
        gen = _generator_spec(opts)
        examples, ds_opts = load_pool_prompts(
            opts.dataset,
            num_prompts=opts.num_prompts,
            prompt_words=opts.prompt_words,
            hh_prompt=opts.hh_prompt,
            mmlu_subjects=list(opts.mmlu_subjects),
            math_path=opts.math_path,
        )
        if opts.num_prompts > len(examples):
            raise PrivacyParameterError(
                f"argument --num-prompts: {opts.num_prompts} exceeds the {len(examples)} prompts of "
                f"{opts.dataset}"
            )
        cfg = PoolConfig(
            dataset=opts.dataset,
            n=opts.n,
            seed=opts.seed,
            generator=gen,
            proxy_reward=opts.proxy_reward,
            true_reward=opts.true_reward,
            num_prompts=opts.num_prompts,
            max_chars=opts.max_chars,
            dataset_options=ds_opts,
        )
        ray_opts = {
            "address": opts.ray_address,
            "num_cpus": opts.ray_num_cpus,
            "concurrency": opts.ray_concurrency,
        }
        return build_pool(
            cfg,
            examples,
            out,
            backend=opts.backend,
            keep_work=opts.keep_work,
            progress=progress,
            ray_options=ray_opts if opts.backend == "ray" else None,
            generator=generator,
            proxy=proxy,
            true=true,
        )


def pool_capacity_lines(out: str | os.PathLike, proxy_reward: str, true_reward: str) -> list[str]:
    """The pool's capacity diagnostic (can it show over-optimisation at the N it holds?) as text lines, when
    it has both rewards (else none). For the terminal only: a manifest holds configuration, not statistics
    of the scores."""
    if "none" in (proxy_reward, true_reward) or not os.path.isfile(out):
        return []

    from privalign.alignment.capacity import capacity_diagnostic, capacity_lines
    from privalign.data.pools import read_pool

    recs = read_pool(out)
    proxies = [[r.proxy_reward for r in rec.responses] for rec in recs]
    golds = [[r.true_value for r in rec.responses] for rec in recs]
    if any(len(p) < 2 or not all(math.isfinite(v) for v in p + g) for p, g in zip(proxies, golds)):
        return []
    return [line.strip() for line in capacity_lines(capacity_diagnostic(proxies, golds))]
