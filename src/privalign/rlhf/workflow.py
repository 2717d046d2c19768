"""The ``privalign align`` workflow as library calls: load the reward model, select the public RL prompts,
check them against the reward model's private preference data, then train (:func:`align`).

:func:`load_align_inputs` is the part before any policy model loads (cheap: it reads the reward-model file,
the prompts and, for a private reward, its preference data for the overlap check). Errors about a user's
input name the ``privalign align`` flag they come from (``argument --prompts: ...``) and keep their type.

Privacy: nothing here adds a mechanism; the policy that :func:`align` trains is post-processing of the
reward model (:mod:`privalign.rlhf.train`, ``docs/privacy/rlhf_policy.md``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privalign.errors import DataFormatError, MissingDependencyError, PrivacyParameterError, PrivacyWarning
from privalign.rlhf.train import AlignConfig

__all__ = ["AlignInputs", "align", "load_align_inputs"]

#: The errors that reading a reward model or a prompt source raises on bad input.
_INPUT_ERRORS = (FileNotFoundError, DataFormatError, PrivacyParameterError, MissingDependencyError)

#: Held-out IMDb RL prompts available (``imdb_rl_prompts``).
_IMDB_PROMPTS = 1000


def _flagged(flag: str, exc: Exception) -> Exception:
    """``exc`` again, of the same type, its message prefixed with the flag it is about."""
    return type(exc)(f"argument {flag}: {exc}")


@dataclass(frozen=True)
class AlignInputs:
    """What :func:`align` trains on: the reward, the public prompts, their provenance, and the record of the
    disjointness check against the reward model's preference data (see
    :func:`privalign.rlhf.prompts.check_prompts_disjoint`)."""

    reward: Any
    prompts: list[str]
    prompt_info: dict[str, Any]
    overlap_check: dict[str, Any]


def load_align_inputs(
    reward_model: str | os.PathLike,
    *,
    prompts: str | os.PathLike = "imdb",
    num_prompts: int = 64,
    prompt_offset: int = 0,
    allow_overlap: bool = False,
) -> AlignInputs:
    """Load the reward model and the RL prompts and check that the prompts are not private data.

    Args:
      reward_model: a reward-model JSON (``privalign fit-reward --out``), ``'vader'`` or ``'linear:PATH'``.
      prompts: ``'imdb'`` (held-out IMDb review openings) or a .txt/.jsonl prompt file.
      num_prompts, prompt_offset: ``'imdb'``: how many prompts, from where in the fixed order.
      allow_overlap: record prompts that occur in the private preference data (and warn with a
        :class:`~privalign.errors.PrivacyWarning`) instead of refusing them.

    Raises:
      FileNotFoundError, DataFormatError, PrivacyParameterError, MissingDependencyError: bad input; the
        message starts with the flag (``argument --reward-model: ...``, ``argument --prompts: ...``).
    """
    from privalign.rlhf.prompts import check_prompts_disjoint, imdb_rl_prompts, load_prompt_file
    from privalign.rlhf.rewards import load_reward

    try:
        reward = load_reward(reward_model)
    except _INPUT_ERRORS as exc:
        raise _flagged("--reward-model", exc) from exc
    imdb = prompts == "imdb"
    if imdb and (not 1 <= num_prompts <= _IMDB_PROMPTS - max(prompt_offset, 0) or prompt_offset < 0):
        raise PrivacyParameterError(
            "argument --num-prompts/--prompt-offset: need 0 <= offset and 1 <= num-prompts <= 1000 "
            f"- offset. Got --num-prompts {num_prompts}, --prompt-offset {prompt_offset}."
        )
    try:
        texts, info = (
            imdb_rl_prompts(num_prompts, offset=prompt_offset) if imdb else load_prompt_file(prompts)
        )
    except _INPUT_ERRORS as exc:
        raise _flagged("--prompts", exc) from exc
    try:
        overlap = check_prompts_disjoint(texts, reward, allow_overlap=allow_overlap)
    except PrivacyParameterError as exc:
        raise _flagged("--prompts", exc) from exc
    if overlap.get("overlapping_prompts"):
        warnings.warn(
            f"{overlap['overlapping_prompts']} prompts overlap the reward model's preference data "
            "(--allow-overlap given); the policy's privacy statement does not cover those prompts.",
            PrivacyWarning,
            stacklevel=2,
        )
    return AlignInputs(reward, texts, info, overlap)


def align(
    reward_model: str | os.PathLike,
    out_dir: str | Path,
    config: AlignConfig,
    *,
    prompts: str | os.PathLike = "imdb",
    num_prompts: int = 64,
    prompt_offset: int = 0,
    base_model: str | None = "smollm2",
    allow_overlap: bool = False,
    num_threads: int | None = None,
    progress: bool = True,
    on_resume: Callable[[Path, int], None] | None = None,
) -> dict[str, Any]:
    """``privalign align`` as one call: :func:`load_align_inputs`, then
    :func:`~privalign.rlhf.train.align_policy` into ``out_dir`` (resumed from its newest checkpoint when it
    holds an interrupted run of the same arguments).

    ``num_threads`` sets torch's (process-wide) CPU thread count before training; ``None`` leaves it.
    ``on_resume(checkpoint, step)`` is called before training resumes from a checkpoint.

    Returns:
      the manifest of :func:`~privalign.rlhf.train.align_policy` (``result["model"]`` and
      ``result["tokenizer"]`` hold the trained policy when this call trained it).

    Raises:
      the errors of :func:`load_align_inputs`; PrivacyParameterError: ``out_dir`` is not a directory or
        holds another run (message ``argument --out: ...``); MissingDependencyError: the ``rlhf`` extra is
        not installed.
    """
    from privalign.rlhf.train import align_policy

    if num_threads is not None and num_threads < 1:
        raise PrivacyParameterError(f"argument --num-threads: must be an integer >= 1. Got {num_threads}.")
    inputs = load_align_inputs(
        reward_model,
        prompts=prompts,
        num_prompts=num_prompts,
        prompt_offset=prompt_offset,
        allow_overlap=allow_overlap,
    )
    if num_threads is not None:
        import torch

        torch.set_num_threads(num_threads)
    try:
        return align_policy(
            inputs.reward,
            inputs.prompts,
            inputs.prompt_info,
            out_dir,
            config,
            base_model=base_model,
            overlap_check=inputs.overlap_check,
            allow_overlap=allow_overlap,
            progress=progress,
            on_resume=on_resume,
        )
    except PrivacyParameterError as exc:
        if "'out'" in str(exc):
            raise _flagged("--out", exc) from exc
        raise
