"""``dpo:none`` / ``dpo:label@EPS`` / ``dpo:sample@EPS``: DPO on the private pairs
(:func:`privalign.rlhf.dpo.train_dpo`), each checkpoint handed to the frontier to evaluate.

Privacy (relation replace-one):
  * ``none``: non-private.
  * ``label``: ε-label-DP, unit one pair's label (texts public): randomized response on each label, then the
    debiased (robust) DPO loss (docs/privacy/dpo-label.md).
  * ``sample``: (ε, δ)-DP, unit one pair: DP-SGD on the LoRA parameters (docs/privacy/dpo-sample.md).
  Evaluating a checkpoint is post-processing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from privalign.experiments.routes.base import Bench, PolicyRoute

__all__ = ["DPORoute", "dpo_config"]


def dpo_config(method: str, epsilon: float | None, cfg: dict[str, Any]) -> Any:
    """The :class:`~privalign.rlhf.dpo.DPOConfig` of a DPO route under the frontier's configuration."""
    from privalign.rlhf.dpo import DPOConfig

    return DPOConfig(
        privacy=method,
        epsilon=epsilon,
        delta=cfg["delta"] if method == "sample" else None,
        beta=cfg["dpo_beta"],
        learning_rate=cfg["dpo_lr"],
        batch_size=cfg["dpo_batch"],
        epochs=cfg["dpo_epochs"],
        max_length=cfg["dpo_max_length"],
        lora_rank=cfg["dpo_lora_rank"],
        clip_norm=cfg["dpo_clip"],
    )


def checkpoint_steps(total: int, every: int) -> list[int]:
    """Every ``every`` steps and the last."""
    return sorted({*range(every, total + 1, every), total})


class DPORoute(PolicyRoute):
    """DPO, non-private, label-DP or sample-DP (module docstring: guarantee, unit, relation)."""

    family = "dpo"
    methods: ClassVar[dict[str, str]] = {"none": "non-private", "label": "label-DP", "sample": "sample-DP"}
    order = 2
    line = "-"
    seeds_key = "dpo_seeds"
    keys = (
        "dpo_beta", "dpo_lr", "dpo_batch", "dpo_epochs", "dpo_max_length", "dpo_lora_rank", "dpo_clip",
        "dpo_eval_every", "eval_prompts", "eval_samples", "max_new_tokens", "gold",
    )  # fmt: skip
    _NAMES: ClassVar[dict[str, str]] = {
        "none": "DPO (non-private)",
        "label": "label-DP DPO",
        "sample": "sample-DP DPO",
    }

    @classmethod
    def label(cls, method: str) -> str:
        return cls._NAMES[method]

    @classmethod
    def backbone(cls, method: str) -> str | None:
        """DPO's implicit reward is the policy's own log-ratio: the SmolLM2-135M base, which no labeller or
        judge shares."""
        return "SmolLM2-135M-Instruct"

    def steps(self, bench: Bench) -> list[int]:
        from privalign.rlhf.dpo import check_schedule

        c = bench.cell
        total = check_schedule(
            dpo_config(c["method"], c["epsilon"], bench.cfg), len(bench.pairs()["pairs"].prompts)
        )
        return checkpoint_steps(total, bench.cfg["dpo_eval_every"])

    def train(self, bench: Bench, on_step: Callable[[int, Any], None]) -> dict[str, Any]:
        from privalign.rlhf.dpo import train_dpo

        c = bench.cell
        model, tok, _ = bench.base()
        rng = np.random.default_rng(bench.seed(c["route"]))
        res = train_dpo(
            bench.pairs()["pairs"],
            dpo_config(c["method"], c["epsilon"], bench.cfg),
            model=copy.deepcopy(model),
            tokenizer=tok,
            rng=rng,
            on_step=on_step,
        )
        return {"privacy": {k: v for k, v in res["privacy"].items() if k != "accounting"}}

    def guarantee(
        self, bench: Bench, payload: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        priv = (payload or {}).get("privacy", {})
        extra: dict[str, Any] = {}
        if payload is not None and bench.cell["method"] == "sample":
            extra = {"delta": priv["guarantee"]["delta"], "epsilon_accounted": priv["guarantee"]["epsilon"]}
        return priv.get("privacy_event"), extra
