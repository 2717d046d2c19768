"""privalign: differentially private alignment of language models.

Layers, bottom to top (a package imports only its own modules and lower layers; enforced by
``tests/core/test_core_layers.py``, which lists no exception; a lower layer that needs an implementation
from a higher one takes it as an argument from the caller, e.g. the feature maps built on models):
``errors`` ← ``{_validation, rng, paths, _json, _lazy}`` ← ``{accounting, data, release, stats,
privalign}`` ←
``mechanisms`` ← ``{alignment, estimation, audit}`` ← ``models`` ← ``pipeline`` ← ``rlhf`` ←
``{experiments, service}`` ← ``cli``.
"""

from privalign.errors import (
    BudgetExhaustedError,
    DataFormatError,
    MissingDependencyError,
    PrivacyParameterError,
    PrivacyWarning,
    ReservationError,
    UnsupportedEventError,
    UtilityWarning,
)
from privalign.rng import NoiseSource, SecureNoise, SeededNoise, as_generator, as_noise_source

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "BudgetExhaustedError",
    "DataFormatError",
    "MissingDependencyError",
    "PrivacyParameterError",
    "PrivacyWarning",
    "ReservationError",
    "UnsupportedEventError",
    "UtilityWarning",
    "NoiseSource",
    "SecureNoise",
    "SeededNoise",
    "as_generator",
    "as_noise_source",
]
