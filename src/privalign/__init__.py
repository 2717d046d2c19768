"""privalign: differentially private alignment of language models.

Layers, bottom to top (a package imports only its own modules and lower layers; enforced by
``tests/core/test_core_layers.py``, which lists no exception; a lower layer reaches an implementation in a
higher one only by name, through an entry-point group declared in ``pyproject.toml``, e.g. the feature maps
of ``privalign.feature_maps``):
``errors`` ← ``{_validation, rng, paths, _json, _lazy}`` ← ``{accounting, data, release, privalign}`` ←
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
    "NoiseSource",
    "SecureNoise",
    "SeededNoise",
    "as_generator",
    "as_noise_source",
]
