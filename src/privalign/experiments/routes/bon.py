"""``bon:RM[@EPS]``: a reward model fitted on the private pairs, then best-of-n over each eval prompt's
reference samples, at the exact tie-aware KL.

Privacy:
  The reward model's guarantee (``RRIHT``/``DenseRR``/``TRM-label``: ε-label-DP, unit one pair's label;
  ``SampleDPIHT``/``DPSGDLinear``/``TRM-sample``: (ε, δ)-DP, unit one pair; ``MLE``/``IHT``/``TRM-none``:
  none), relation replace-one. Best-of-n reads only the released model's scores of public reference samples:
  post-processing, paid once whatever the number of answers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from privalign.experiments.routes import _reward
from privalign.experiments.routes.base import Bench, SelectorRoute

__all__ = ["BestOfNRoute"]


class _BoN:
    def __init__(self, scores: np.ndarray) -> None:
        self.scores = scores

    def expected(self, values: np.ndarray, x: int) -> np.ndarray:
        from privalign.experiments.rlhf_bon import bon_expected_gold

        return bon_expected_gold(self.scores, values, x)

    def kl(self, x: int) -> float:
        from privalign.experiments.rlhf_bon import bon_kl_ties

        return float(bon_kl_ties(self.scores, x).mean())


class BestOfNRoute(SelectorRoute):
    """Reward model → best-of-n (:func:`privalign.experiments.rlhf_bon.bon_expected_gold`,
    :func:`~privalign.experiments.rlhf_bon.bon_kl_ties`). Guarantee, unit and relation: the reward model's
    (module docstring)."""

    family = "bon"
    methods: ClassVar[dict[str, str]] = dict(_reward.RM_KINDS)
    order = 0
    line = "--"
    seeds_key = "bon_seeds"
    keys = ("eval_prompts", "reference_samples", "max_new_tokens", "bon_ns", "gold")
    rm_methods = _reward.RMS

    @classmethod
    def label(cls, method: str) -> str:
        return f"{method} RM → best-of-n"

    @classmethod
    def backbone(cls, method: str) -> str | None:
        return _reward.rm_backbone(method)

    def _rm(self, bench: Bench) -> dict[str, Any]:
        c = bench.cell
        return _reward.fit_rm(c["method"], c["epsilon"], c["seed_index"], bench)

    def selection(self, bench: Bench) -> _BoN:
        return _BoN(_reward.ref_scores(self._rm(bench), bench))

    def guarantee(self, bench: Bench) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        rm = self._rm(bench)
        return rm["event"], {"overlap_check": _reward.overlap_facts(rm)}
