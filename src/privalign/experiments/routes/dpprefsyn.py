"""``dpprefsyn:dpo@EPS``: DPPrefSyn (:func:`privalign.rlhf.dpprefsyn.train_dpprefsyn`; Gao & Yang, ICML 2026,
arXiv:2605.30808v1) on the private pairs: a private preference model (DP-PCA → DP k-means → per-cluster
DP-SGD linear Bradley–Terry) labels the base policy's own completions of the frontier's public GRPO prompt
slice, and non-private DPO trains on those synthetic pairs; each DPO checkpoint is handed to the frontier.

Privacy:
  (ε, δ)-DP under replace-one, unit one preference pair (sample-DP; δ is the frontier's ``delta``): basic
  composition of DP-PCA (ε/8, δ/3), DP k-means (ε/8, δ/3) and DP-SGD (3ε/4, δ/3); the synthetic pairs and the
  DPO on them read only the released model and public data: post-processing (docs/privacy/dpprefsyn.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from privalign.experiments.config import Field
from privalign.experiments.routes.base import Bench, PolicyRoute
from privalign.experiments.routes.dpo import DPORoute, checkpoint_steps, dpo_config

__all__ = ["DPPrefSynRoute"]


class DPPrefSynRoute(PolicyRoute):
    """DPPrefSyn, DPO on privately synthesized pairs (module docstring: guarantee, unit, relation)."""

    family = "dpprefsyn"
    methods: ClassVar[dict[str, str]] = {"dpo": "sample-DP"}
    order = 2
    seeds_key = "dpprefsyn_seeds"
    keys = (
        *DPORoute.keys, "delta", "grpo_prompts", "dpprefsyn_components", "dpprefsyn_clusters",
        "dpprefsyn_candidates",
    )  # fmt: skip
    fields: ClassVar[dict[str, Field]] = {
        "dpprefsyn_seeds": Field("int", 2, "seeds per DPPrefSyn route", low=1),
        "dpprefsyn_components": Field("int", 20, "DPPrefSyn: DP-PCA dimension k", low=1),
        "dpprefsyn_clusters": Field("int", 5, "DPPrefSyn: DP k-means clusters K", low=1),
        "dpprefsyn_candidates": Field(
            "int", 4, "DPPrefSyn: base-policy completions per public prompt (synthetic pairs)", low=2
        ),
    }

    @classmethod
    def label(cls, method: str) -> str:
        return "DPPrefSyn (DPO on DP-synthesized pairs)"

    @classmethod
    def check(cls, cell: dict[str, object], cfg: dict[str, object]) -> str | None:
        b, g = cfg["dpo_batch"], cfg["grpo_prompts"]
        if isinstance(b, int) and isinstance(g, int) and b > g:
            return (
                f"config key 'dpo_batch': {b} > grpo_prompts = {g} (dpprefsyn trains DPO on one synthetic "
                "pair per public GRPO prompt)."
            )
        return None

    def steps(self, bench: Bench) -> list[int]:
        from privalign.rlhf.dpo import check_schedule

        n_public = len(bench.pairs()["grpo"])  # one synthetic pair per public prompt: a public count
        total = check_schedule(dpo_config("none", None, bench.cfg), n_public)
        return checkpoint_steps(total, bench.cfg["dpo_eval_every"])

    def train(self, bench: Bench, on_step: Callable[[int, object], None]) -> dict[str, object]:
        from privalign.rlhf.dpprefsyn import DPPrefSynSettings, train_dpprefsyn

        c, cfg = bench.cell, bench.cfg
        model, tok, _ = bench.base()
        data = bench.pairs()
        res = train_dpprefsyn(
            data["pairs"],
            data["grpo"],
            dpo_config("none", None, cfg),
            epsilon=float(c["epsilon"]),
            delta=float(cfg["delta"]),
            model=copy.deepcopy(model),
            tokenizer=tok,
            rng=np.random.default_rng(bench.seed(c["route"])),
            settings=DPPrefSynSettings(
                n_components=int(cfg["dpprefsyn_components"]),
                n_clusters=int(cfg["dpprefsyn_clusters"]),
                candidates=int(cfg["dpprefsyn_candidates"]),
                max_new_tokens=int(cfg["max_new_tokens"]),
                max_length=int(cfg["dpo_max_length"]),
            ),
            on_step=on_step,
        )
        return {"privacy": res["privacy"]}

    def guarantee(
        self, bench: Bench, payload: dict[str, object] | None
    ) -> tuple[dict[str, object] | None, dict[str, object]]:
        priv = (payload or {}).get("privacy")
        if not isinstance(priv, dict):
            return None, {}
        g = priv["guarantee"]
        return priv["privacy_event"], {
            "delta": g["delta"],
            "epsilon_accounted": g["epsilon"],
            "statement": priv["statement"],
        }
