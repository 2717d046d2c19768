"""Deliberately broken mechanisms: negative controls for the audits. **Never use them on data.**

Each one samples with a wrong noise law but *claims* the same event as the correct mechanism, so an
audit that cannot tell them apart is useless (style.md §8, "mandatory negative controls"):

* ``noisy_argmax`` / ``noisy_top_k``: ``half_scale`` and ``sensitivity_ignored`` (Gumbel scale Δ/ε instead
  of 2Δ/ε; for the exponential mechanism both bugs give the same scale);
* ``gaussian`` / ``laplace``: ``half_scale`` (σ/2, b/2);
* ``randomized_response``: ``wrong_flip`` (flip probability 1/(1+e^{2ε}) instead of 1/(1+e^ε));
* ``user_randomized_response``: ``per_label_epsilon`` (each of a user's K labels flipped at ε instead of ε/K:
  the per-label guarantee restated as the user's, the bug user-level privacy exists to prevent);
* ``peeling``: ``sqrt_scale`` (``2λ·sqrt(3s·log(1/δ)/ε)``, i.e. ``sqrt(·/ε)`` instead of ``·/ε``; less noise
  than claimed when ε < 1; seen in public code, spec-reward-estimation §12).

And one broken *function*: :func:`broken_solve_normalizer`, PrivITP's phase-1 normaliser as shipped up to
commit 96b6291 (wrong roots at ties, so not 1-Lipschitz): the negative control of the normaliser's property
tests and of the phase-1 audit on tie-heavy neighbours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from privalign.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    NoisyArgmax,
    NoisyTopK,
    RandomizedResponse,
)
from privalign.mechanisms._common import check_scores
from privalign.mechanisms.selection import _peel
from privalign.rng import as_noise_source

__all__ = ["BROKEN_VARIANTS", "broken_mechanism", "broken_solve_normalizer"]

BROKEN_VARIANTS: dict[str, tuple[str, ...]] = {
    "noisy_argmax": ("half_scale", "sensitivity_ignored"),
    "noisy_top_k": ("half_scale", "sensitivity_ignored"),
    "gaussian": ("half_scale",),
    "laplace": ("half_scale",),
    "randomized_response": ("wrong_flip",),
    "user_randomized_response": ("per_label_epsilon",),
    "peeling": ("sqrt_scale",),
}


@dataclass(frozen=True)
class _BrokenNoisyArgmax:
    correct: NoisyArgmax

    @property
    def event(self):  # claims the correct event
        return self.correct.event

    @property
    def scale(self) -> float:
        return self.correct.sensitivity / self.correct.epsilon  # BUG: Δ/ε instead of 2Δ/ε

    def __call__(self, scores: Any, *, rng) -> Any:
        s = check_scores(scores)
        idx = as_noise_source(rng).gumbel_argmax(s, self.scale)
        return int(idx) if s.ndim == 1 else np.asarray(idx)


@dataclass(frozen=True)
class _BrokenNoisyTopK:
    correct: NoisyTopK

    @property
    def event(self):
        return self.correct.event

    @property
    def scale(self) -> float:
        return self.correct.sensitivity / self.correct.epsilon  # BUG

    def __call__(self, scores: Any, *, rng) -> np.ndarray:
        s = check_scores(scores)
        return np.asarray(as_noise_source(rng).gumbel_topk(s, self.correct.k, self.scale))


@dataclass(frozen=True)
class _BrokenAdditive:
    correct: GaussianMechanism | LaplaceMechanism

    @property
    def event(self):
        return self.correct.event

    def __call__(self, values: Any, *, rng) -> np.ndarray:
        arr = np.asarray(values, dtype=np.float64)
        src = as_noise_source(rng)
        shape = arr.shape if arr.ndim else 1
        if isinstance(self.correct, GaussianMechanism):
            noise = src.normal(self.correct.sigma / 2.0, shape)  # BUG: half σ
        else:
            noise = src.laplace(self.correct.scale / 2.0, shape)  # BUG: half b
        return arr + np.asarray(noise).reshape(arr.shape)


@dataclass(frozen=True)
class _BrokenRR:
    correct: RandomizedResponse

    @property
    def event(self):
        return self.correct.event

    @property
    def flip_probability(self) -> float:
        return 1.0 / (1.0 + math.exp(2.0 * self.correct.epsilon))  # BUG: 2ε

    def __call__(self, bits: Any, *, rng) -> np.ndarray:
        b = np.asarray(bits).astype(np.int64)
        flips = np.asarray(
            as_noise_source(rng).bernoulli(self.flip_probability, b.shape if b.ndim else 1)
        ).reshape(b.shape)
        return np.bitwise_xor(b, flips.astype(np.int64))


@dataclass(frozen=True)
class _BrokenUserRR:
    correct: Any  # UserRandomizedResponse

    @property
    def event(self):
        return self.correct.event

    def __call__(self, bits: Any, *, rng) -> np.ndarray:
        return RandomizedResponse(self.correct.epsilon)(bits, rng=rng)  # BUG: ε per label, not ε/K


@dataclass(frozen=True)
class BrokenPeeling:
    """Peeling at the ``sqrt(·/ε)`` scale, claiming the requested (ε, δ). Negative control only."""

    sparsity: int
    epsilon: float
    delta: float
    sensitivity: float

    @property
    def noise_scale(self) -> float:
        # BUG: sqrt(3 s log(1/δ) / ε) instead of sqrt(3 s log(1/δ)) / ε.
        return (
            2.0
            * self.sensitivity
            * math.sqrt(3.0 * self.sparsity * math.log(1.0 / self.delta) / self.epsilon)
        )

    @property
    def accounted(self) -> tuple[float, float]:
        return (self.epsilon, self.delta)  # what the broken code claims

    def __call__(self, v: Any, *, rng) -> tuple[np.ndarray, np.ndarray]:
        arr = check_scores(v, "v")
        out, sup = _peel(
            arr.reshape(-1, arr.shape[-1]), self.sparsity, self.noise_scale, as_noise_source(rng)
        )
        return (out[0], sup[0]) if arr.ndim == 1 else (out, sup)


def broken_mechanism(correct: Any, variant: str) -> Any:
    """Wrap a correct mechanism into its broken negative control ``variant`` (see the module docstring)."""
    if isinstance(correct, NoisyArgmax) and variant in BROKEN_VARIANTS["noisy_argmax"]:
        return _BrokenNoisyArgmax(correct)
    if isinstance(correct, NoisyTopK) and variant in BROKEN_VARIANTS["noisy_top_k"]:
        return _BrokenNoisyTopK(correct)
    if isinstance(correct, GaussianMechanism | LaplaceMechanism) and variant == "half_scale":
        return _BrokenAdditive(correct)
    if isinstance(correct, RandomizedResponse) and variant == "wrong_flip":
        return _BrokenRR(correct)
    from privalign.mechanisms import Peeling, UserRandomizedResponse

    if isinstance(correct, UserRandomizedResponse) and variant == "per_label_epsilon":
        return _BrokenUserRR(correct)

    if isinstance(correct, Peeling) and variant == "sqrt_scale":
        return BrokenPeeling(correct.sparsity, correct.epsilon, correct.delta, correct.sensitivity)
    from privalign.errors import PrivacyParameterError

    raise PrivacyParameterError(
        f"The 'variant' parameter must be one of {BROKEN_VARIANTS} for {type(correct).__name__}. Got "
        f"{variant!r} instead."
    )


def broken_solve_normalizer(scores: Any, beta: float) -> np.ndarray | float:
    """The pre-fix sort-and-scan normaliser (commits up to 96b6291). **Wrong at ties; never use it.**

    It tests ``s_{k−1} ≤ λ_k < s_k`` in floating point and, when no interval passes (a root that coincides
    with a score fails its true interval by one ulp), forces the last interval ``k = n − 1``:
    ``broken_solve_normalizer([1.0, 0.8, 0.9], 0.1) == 0.7`` where the root is 0.8.
    """
    r = np.asarray(scores, dtype=np.float64)
    one_d = r.ndim == 1
    if one_d:
        r = r[None, :]
    n = r.shape[1]
    s = np.sort(r, axis=1)
    suffix = np.cumsum(s[:, ::-1], axis=1)[:, ::-1]
    lam = (suffix - n * beta) / (n - np.arange(n))
    prev = np.concatenate([np.full((s.shape[0], 1), -np.inf), s[:, :-1]], axis=1)
    valid = (prev <= lam) & (lam < s)
    valid[:, -1] = True  # BUG: the "floating-point guard" that turns a one-ulp miss into a wrong interval
    out = lam[np.arange(s.shape[0]), np.argmax(valid, axis=1)]
    return float(out[0]) if one_d else out
