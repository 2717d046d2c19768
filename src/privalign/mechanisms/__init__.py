"""privalign.mechanisms: noise mechanisms, each exposing the privacy event it costs.

* :class:`NoisyArgmax`: Gumbel noisy-argmax at scale 2Δ/ε (exponential mechanism; ε-DP, ε²/8-zCDP).
* :class:`NoisyTopK`: one-shot Gumbel top-k (k·ε-DP, k·ε²/8-zCDP).
* :class:`Peeling`: private top-s selection and release (Cai, Wang & Zhang 2021), accounted honestly.
* :class:`GaussianMechanism`, :class:`LaplaceMechanism`: additive vector noise (ℓ2 / ℓ1 sensitivity).
* :class:`RandomizedResponse`: binary randomized response.

Every mechanism is a frozen dataclass validated at construction, takes ``rng`` keyword-only (a
``numpy.random.Generator`` or a :class:`privalign.rng.NoiseSource`) and exposes ``.event``, built from
the same parameters it samples with. Proof notes: ``docs/privacy/<mechanism>.md``.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on first access (module __getattr__ below)
    from privalign.mechanisms.additive import GaussianMechanism, LaplaceMechanism
    from privalign.mechanisms.randomized_response import RandomizedResponse
    from privalign.mechanisms.selection import NoisyArgmax, NoisyTopK, Peeling, softmax

#: public name → the submodule defining it
_LAZY = {
    "GaussianMechanism": "additive",
    "LaplaceMechanism": "additive",
    "RandomizedResponse": "randomized_response",
    "NoisyArgmax": "selection",
    "NoisyTopK": "selection",
    "Peeling": "selection",
    "softmax": "selection",
}

__all__ = [
    "GaussianMechanism",
    "LaplaceMechanism",
    "NoisyArgmax",
    "NoisyTopK",
    "Peeling",
    "RandomizedResponse",
    "softmax",
]


def __getattr__(name: str) -> Any:
    """Import the submodule defining ``name`` on first access (PEP 562), so that importing one submodule
    (e.g. by ``privalign simulate``) does not import all of them; the public names are unchanged."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
