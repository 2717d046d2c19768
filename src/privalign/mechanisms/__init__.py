"""privalign.mechanisms: noise mechanisms, each exposing the privacy event it costs.

* :class:`NoisyArgmax`: Gumbel noisy-argmax at scale 2Δ/ε (exponential mechanism; ε-DP, ε²/8-zCDP).
* :class:`NoisyTopK`: one-shot Gumbel top-k (k·ε-DP, k·ε²/8-zCDP).
* :class:`Peeling`: private top-s selection and release (Cai, Wang & Zhang 2021), accounted honestly.
* :class:`GaussianMechanism`, :class:`LaplaceMechanism`: additive vector noise (ℓ2 / ℓ1 sensitivity).
* :class:`RandomizedResponse`: binary randomized response.
* :class:`UserRandomizedResponse`: randomized response at ε/K on each of a user's ≤ K labels (user-level).

Every mechanism is a frozen dataclass validated at construction, takes ``rng`` keyword-only (a
``numpy.random.Generator`` or a :class:`privalign.rng.NoiseSource`) and exposes ``.event``, built from
the same parameters it samples with. Proof notes: ``docs/privacy/<mechanism>.md``.
"""

from typing import TYPE_CHECKING

from privalign._lazy import lazy_exports

if TYPE_CHECKING:  # imported on first access (module __getattr__ below)
    from privalign.mechanisms.additive import GaussianMechanism, LaplaceMechanism
    from privalign.mechanisms.randomized_response import RandomizedResponse
    from privalign.mechanisms.selection import NoisyArgmax, NoisyTopK, Peeling, softmax
    from privalign.mechanisms.user_level import UserRandomizedResponse

#: public name → the submodule defining it
_LAZY = {
    "GaussianMechanism": "additive",
    "LaplaceMechanism": "additive",
    "RandomizedResponse": "randomized_response",
    "NoisyArgmax": "selection",
    "NoisyTopK": "selection",
    "Peeling": "selection",
    "softmax": "selection",
    "UserRandomizedResponse": "user_level",
}

__all__ = [
    "GaussianMechanism",
    "LaplaceMechanism",
    "NoisyArgmax",
    "NoisyTopK",
    "Peeling",
    "RandomizedResponse",
    "UserRandomizedResponse",
    "softmax",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
