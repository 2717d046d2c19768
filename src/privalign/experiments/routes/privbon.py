"""``privbon:RM@EPS``: PrivBoN at inference (:class:`privalign.alignment.priv_bon.PrivBoN`) on a
NON-private reward model fitted on the private pairs, its scores clipped to the public range ``[−B, B]``
(``privbon_bound``).

Privacy:
  ε-DP **per answer** under replace-one, unit one pair: one changed pair changes every clipped score by at
  most Δ_r = 2B, and each answer is a Gumbel noisy arg-max of scale 2Δ_r/ε over the n candidates
  (docs/privacy/privbon.md); k answers cost kε (basic composition). The exact law over n-subsets of the
  reference samples is computed (:func:`privbon_law`), so the curve integrates PrivBoN's randomness out.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import numpy as np

from privalign.experiments.routes import _reward
from privalign.experiments.routes.base import Bench, SelectorRoute

__all__ = ["PrivBoNRoute", "privbon_law"]


def privbon_law(scores: np.ndarray, n: int, sigma: float) -> np.ndarray:
    """Per prompt (rows), the probability that PrivBoN over a uniformly random ``n``-subset of the row's
    ``m`` candidates (Gumbel noisy arg-max of scale σ, i.e. the softmax ``exp(u/σ)`` within the subset)
    returns each candidate; exact (the subsets are enumerated). ``σ = 0`` is plain best-of-n (ties split)."""
    u = np.asarray(scores, float)
    P, m = u.shape
    if not 1 <= n <= m:
        raise ValueError(f"n must be in [1, {m}]; got {n}")
    combos = np.array(list(itertools.combinations(range(m), n)), dtype=np.int64)
    q = np.zeros((P, m))
    for p in range(P):
        z = u[p][combos]
        if sigma > 0:
            w = np.exp((z - z.max(axis=1, keepdims=True)) / sigma)
        else:
            w = (z >= z.max(axis=1, keepdims=True) - 1e-12).astype(float)
        w /= w.sum(axis=1, keepdims=True)
        q[p] = np.bincount(combos.ravel(), weights=w.ravel(), minlength=m) / len(combos)
    return q


class _Law:
    def __init__(self, u: np.ndarray, sigma: float) -> None:
        self.u, self.sigma = u, sigma
        self._q: dict[int, np.ndarray] = {}

    def law(self, n: int) -> np.ndarray:
        if n not in self._q:
            self._q[n] = privbon_law(self.u, n, self.sigma)
        return self._q[n]

    def expected(self, values: np.ndarray, x: int) -> np.ndarray:
        return (self.law(x) * values).sum(axis=1)

    def kl(self, x: int) -> float:
        q, m = self.law(x), self.u.shape[1]
        with np.errstate(divide="ignore", invalid="ignore"):
            kl = np.where(q > 0, q * np.log(q * m), 0.0).sum(axis=1)
        return float(kl.mean())


class PrivBoNRoute(SelectorRoute):
    """PrivBoN per answer on a non-private reward model (module docstring: ε-DP per answer, unit one pair,
    replace-one, k answers cost kε)."""

    family = "privbon"
    methods: ClassVar[dict[str, str]] = {m: "per-answer" for m in (*_reward.LINEAR_NONPRIVATE, "TRM-none")}
    order = 1
    line = ":"
    seeds_key = "privbon_seeds"
    keys = ("eval_prompts", "reference_samples", "max_new_tokens", "bon_ns", "gold", "privbon_bound")
    rm_methods = _reward.RMS

    @classmethod
    def label(cls, method: str) -> str:
        return f"PrivBoN per answer ({method} RM)"

    @classmethod
    def backbone(cls, method: str) -> str | None:
        return _reward.rm_backbone(method)

    def _sigma(self, bench: Bench) -> tuple[float, float]:
        from privalign.alignment.priv_bon import privbon_scale

        B = float(bench.cfg["privbon_bound"])
        return B, privbon_scale(bench.cell["epsilon"], 2 * B)

    def selection(self, bench: Bench) -> _Law:
        B, sigma = self._sigma(bench)
        rm = _reward.fit_rm(bench.cell["method"], None, bench.cell["seed_index"], bench)
        # public range [0, 2B]: Δ_r = 2B for any pair change
        return _Law(np.clip(_reward.ref_scores(rm, bench), -B, B) + B, sigma)

    def guarantee(self, bench: Bench) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        from privalign.alignment.priv_bon import privbon_epsilon

        B, sigma = self._sigma(bench)
        eps = privbon_epsilon(sigma, 2 * B)
        return {"kind": "noisy_argmax", "epsilon": eps, "per": "answer"}, {
            "sensitivity": 2 * B,
            "gumbel_scale": sigma,
            "epsilon_charged_per_answer": eps,
            "composition": "k answers cost k·ε (basic composition); the trained routes pay ε once",
            "reward_model": f"{bench.cell['method']} (non-private), scores clipped to [−{B:g}, {B:g}]",
        }
