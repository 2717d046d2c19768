"""``props:dpo@EPS``: PROPS (:func:`privalign.rlhf.props.train_props`; Teku et al., arXiv:2508.06783v2) on the
private pairs, ``props_stages`` stages, each checkpoint (global step across stages) handed to the frontier.

Privacy:
  ε-label-DP under replace-one, unit one pair's label (texts public): each label is randomized once at ε;
  the stages and the relabelling are post-processing (docs/privacy/props.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from privalign.experiments.config import Field
from privalign.experiments.routes.base import Bench, PolicyRoute
from privalign.experiments.routes.dpo import DPORoute, checkpoint_steps, dpo_config

__all__ = ["PROPSRoute"]


class PROPSRoute(PolicyRoute):
    """PROPS, label-DP DPO in stages (module docstring: guarantee, unit, relation)."""

    family = "props"
    methods: ClassVar[dict[str, str]] = {"dpo": "label-DP"}
    order = 2
    seeds_key = "props_seeds"
    keys = (*DPORoute.keys, "props_stages")
    fields: ClassVar[dict[str, Any]] = {
        "props_seeds": Field("int", 2, "seeds per PROPS route", low=1),
        "props_stages": Field("int", 2, "PROPS stages (disjoint public split of the pairs)", low=2),
    }

    @classmethod
    def label(cls, method: str) -> str:
        return "PROPS (staged label-DP DPO)"

    @classmethod
    def backbone(cls, method: str) -> str | None:
        return DPORoute.backbone("label")

    def _stage_steps(self, bench: Bench) -> list[int]:
        from privalign.rlhf.dpo import check_schedule

        cfg, c = bench.cfg, bench.cell
        n, S = len(bench.pairs()["pairs"].prompts), int(cfg["props_stages"])
        sizes = [len(a) for a in np.array_split(np.arange(n), S)]  # the split's sizes are public
        first = dpo_config("label", c["epsilon"], cfg)
        plain = dpo_config("none", None, cfg)
        return [check_schedule(first if i == 0 else plain, m) for i, m in enumerate(sizes)]

    def steps(self, bench: Bench) -> list[int]:
        return checkpoint_steps(sum(self._stage_steps(bench)), bench.cfg["dpo_eval_every"])

    def train(self, bench: Bench, on_step: Callable[[int, Any], None]) -> dict[str, Any]:
        from privalign.rlhf.props import train_props

        c = bench.cell
        model, tok, _ = bench.base()
        res = train_props(
            bench.pairs()["pairs"],
            dpo_config("label", c["epsilon"], bench.cfg),
            stages=int(bench.cfg["props_stages"]),
            model=copy.deepcopy(model),
            tokenizer=tok,
            rng=np.random.default_rng(bench.seed(c["route"])),
            on_step=on_step,
        )
        return {"privacy": {k: v for k, v in res["privacy"].items() if k != "accounting"}}

    def guarantee(
        self, bench: Bench, payload: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        priv = (payload or {}).get("privacy", {})
        return priv.get("privacy_event"), {"statement": priv.get("statement")} if priv else {}
