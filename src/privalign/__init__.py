"""privalign: differentially private alignment of language models.

Layers (imports go one way): ``errors/_validation/rng`` ← ``accounting`` ← ``mechanisms`` ←
``{alignment, estimation}`` ← ``{pipeline, models, data}`` ← ``{experiments, service, cli}``;
``audit`` imports only ``mechanisms``/``accounting``.
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
