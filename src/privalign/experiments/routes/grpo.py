"""``grpo:RM[@EPS]``: GRPO (:func:`privalign.rlhf.train.align_policy`, TRL + LoRA) on the GRPO prompts with a
reward model fitted on the private pairs (the same fit as ``bon:RM@EPS`` of the same seed), each checkpoint
handed to the frontier to evaluate.

Privacy:
  The reward model's guarantee (see :mod:`privalign.experiments.routes.bon`), relation replace-one; GRPO
  reads only the released reward model and public prompts (post-processing; the GRPO prompts are checked
  disjoint from the reward model's private data).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any, ClassVar

from privalign.experiments.routes import _reward
from privalign.experiments.routes.base import Bench, PolicyRoute
from privalign.experiments.routes.dpo import checkpoint_steps

__all__ = ["GRPORoute"]


class GRPORoute(PolicyRoute):
    """Reward model → GRPO (module docstring: guarantee, unit, relation)."""

    family = "grpo"
    methods: ClassVar[dict[str, str]] = dict(_reward.RM_KINDS)
    order = 3
    line = "-"
    seeds_key = "grpo_seeds"
    keys = (
        "grpo_steps", "grpo_eval_every", "grpo_beta", "grpo_lr", "num_generations", "grpo_lora_rank",
        "grpo_prompts",
        "eval_prompts", "eval_samples", "max_new_tokens", "gold",
    )  # fmt: skip
    rm_methods = _reward.RMS

    @classmethod
    def label(cls, method: str) -> str:
        return f"{method} RM → GRPO"

    @classmethod
    def backbone(cls, method: str) -> str | None:
        return _reward.rm_backbone(method)

    @classmethod
    def reuses_rm(cls, cell: dict[str, Any]) -> str | None:
        return _reward.rm_key(cell["method"], cell["epsilon"], cell["seed_index"])

    def steps(self, bench: Bench) -> list[int]:
        return checkpoint_steps(bench.cfg["grpo_steps"], bench.cfg["grpo_eval_every"])

    def privacy_first(self) -> bool:
        return True

    def _rm(self, bench: Bench) -> dict[str, Any]:
        c = bench.cell
        return _reward.fit_rm(c["method"], c["epsilon"], c["seed_index"], bench)

    def privacy_without_training(self, bench: Bench) -> dict[str, Any] | None:
        rm = self._rm(bench)
        return {"privacy_event": rm["event"], "overlap_check": _reward.overlap_facts(rm)}

    def train(self, bench: Bench, on_step: Callable[[int, Any], None]) -> dict[str, Any]:
        from transformers import TrainerCallback

        from privalign.rlhf.train import AlignConfig, align_policy

        cfg = bench.cfg
        rm = self._rm(bench)
        d = bench.pairs()

        class _Eval(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
                on_step(int(state.global_step), model)
                model.train()

        seed = int(bench.seed(bench.cell["route"]).generate_state(1)[0] >> 33)
        acfg = AlignConfig(
            steps=cfg["grpo_steps"],
            beta=cfg["grpo_beta"],
            learning_rate=cfg["grpo_lr"],
            num_generations=cfg["num_generations"],
            prompts_per_step=1,
            max_new_tokens=cfg["max_new_tokens"],
            lora_rank=cfg["grpo_lora_rank"],
            lora_alpha=2.0 * cfg["grpo_lora_rank"],
            seed=seed,
            save_steps=cfg["grpo_eval_every"],
        )
        pol_dir = bench.run_dir / "policies" / bench.records_dir().relative_to(bench.run_dir / "records")
        align_policy(
            rm["reward"],
            d["grpo"],
            d["grpo_info"],
            pol_dir,
            acfg,
            base=bench.base(),
            overlap_check=rm["overlap"],
            save_policy=False,
            progress=False,
            callbacks=[_Eval()],
        )
        for ckpt in (pol_dir / "checkpoints").glob("checkpoint-*"):
            shutil.rmtree(ckpt, ignore_errors=True)
        return self.privacy_without_training(bench) or {}

    def guarantee(
        self, bench: Bench, payload: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        p = payload or {}
        return p.get("privacy_event"), {"overlap_check": p.get("overlap_check")}
