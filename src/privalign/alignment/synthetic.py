"""Synthetic scored pools with controllable reward-model error and coverage.

Each prompt p has base accuracy ``a_p ~ Beta`` around ``p_correct`` (so the best-true-reward policy has
coverage about ``1/a_p``). A candidate is correct (true reward 1) with probability ``a_p``; its proxy
reward is ``0.5 + gap·(true − ½) + N(0, noise²)``. A rare fraction ``hack_rate`` of candidates are
*reward hacks*: true reward 0 but proxy ``hack_reward`` (plus small noise). All proxies are clipped to
[0, 1]. BoN finds the hacks once N ≳ 1/hack_rate and its accuracy falls (not scaling-monotonic), while
ITP/PrivBoN/PrivITP put bounded weight on them.
"""

from __future__ import annotations

import numpy as np

from privalign._validation import check_int, check_real
from privalign.data.pools import ScoredPool
from privalign.rng import as_generator

__all__ = ["make_synthetic_pool"]


def make_synthetic_pool(
    n_prompts: int = 100,
    n_candidates: int = 1024,
    *,
    p_correct: float = 0.3,
    gap: float = 0.3,
    noise: float = 0.1,
    hack_rate: float = 0.002,
    hack_reward: float = 0.97,
    random_state=None,
) -> ScoredPool:
    """Build a :class:`ScoredPool` with proxy rewards in [0, 1] and binary true rewards.

    Args:
      n_prompts, n_candidates: Pool shape.
      p_correct: Mean base accuracy (coverage of the best policy ≈ 1/p_correct).
      gap: Proxy mean difference between correct and incorrect responses.
      noise: Std of the proxy noise (the reward-model error, together with the hacks).
      hack_rate: Fraction of reward-hacking candidates.
      hack_reward: Proxy reward of a hack.
      random_state: Seed, Generator or None.
    """
    n_prompts = check_int(n_prompts, "n_prompts", low=1)
    n_candidates = check_int(n_candidates, "n_candidates", low=1)
    p_correct = check_real(p_correct, "p_correct", low=0.0, high=1.0, closed="neither")
    noise = check_real(noise, "noise", low=0.0, closed="left")
    hack_rate = check_real(hack_rate, "hack_rate", low=0.0, high=1.0, closed="left")
    rng = as_generator(random_state)
    conc = 10.0
    acc = rng.beta(p_correct * conc, (1 - p_correct) * conc, size=(n_prompts, 1))
    true = (rng.random((n_prompts, n_candidates)) < acc).astype(np.float64)
    proxy = 0.5 + gap * (true - 0.5) + rng.normal(0.0, noise, true.shape)
    hack = rng.random(true.shape) < hack_rate
    true[hack] = 0.0
    proxy[hack] = hack_reward + rng.normal(0.0, 0.01, int(hack.sum()))
    return ScoredPool.from_arrays(np.clip(proxy, 0.0, 1.0), true)
