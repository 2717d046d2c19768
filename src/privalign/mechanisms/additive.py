"""Additive noise mechanisms: Gaussian (ℓ2) and Laplace (ℓ1), on vectors.

Both add i.i.d. noise to every coordinate of a query answer whose sensitivity (ℓ2 for Gaussian, ℓ1 for
Laplace) between neighbouring datasets is bounded by a *declared, public* ``sensitivity``. The caller is
responsible for that bound (e.g. by clipping); the mechanism cannot check it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privalign._validation import check_probability, check_real
from privalign.accounting.events import GaussianEvent, LaplaceEvent
from privalign.errors import PrivacyParameterError
from privalign.mechanisms._common import (
    _div_down,
    _div_up,
    _finite_ratio,
    check_epsilon,
    check_sensitivity,
    check_unit_relation,
)
from privalign.rng import NoiseSource, as_noise_source

__all__ = ["GaussianMechanism", "LaplaceMechanism"]


def _check_values(values: Any, name: str = "values") -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise PrivacyParameterError(
            f"The '{name}' parameter must have at least 1 element. Got shape {arr.shape} instead."
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0]) if arr.ndim else ()
        raise PrivacyParameterError(
            f"The '{name}' parameter must contain only finite values. Got {arr[idx]!r} at index {idx}."
        )
    return arr


@dataclass(frozen=True, slots=True)
class GaussianMechanism:
    """Add N(0, σ²) noise to every coordinate of a vector with ℓ2 sensitivity ``sensitivity``.

    Args:
      sigma: Noise standard deviation σ > 0 (absolute, in the units of the query).
      sensitivity: Declared ℓ2 sensitivity Δ₂ > 0 of the whole query answer (the array passed to
        ``__call__`` is one query).
      unit: The privacy unit recorded in the event (default ``"record"``).
      relation: The neighbouring relation recorded in the event (default ``"replace_one"``); Δ₂ must
        be the sensitivity *under this relation*.

    Raises:
      PrivacyParameterError: σ or Δ₂ not a finite positive real.

    Privacy:
      Unit: ``unit``. Relation: ``relation``. Sensitivity: ℓ2, ``‖f(D) − f(D′)‖₂ ≤ sensitivity``.
      Guarantee: ρ-zCDP with ρ = Δ₂²/(2σ²) (Bun & Steinke 2016, Prop. 1.6); (ε, δ)-DP exactly on the
      analytic Gaussian curve δ(ε) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) (Balle & Wang 2018, Thm. 8).
      Event: ``GaussianEvent(noise_multiplier=σ/Δ₂)``.

    References:
      Bun & Steinke, "Concentrated Differential Privacy: Simplifications, Extensions, and Lower Bounds",
      TCC 2016, arXiv:1605.02065v1, Proposition 1.6.
      Balle & Wang, "Improving the Gaussian Mechanism for Differential Privacy: Analytical Calibration
      and Optimal Denoising", ICML 2018, arXiv:1805.06530v2, Theorem 8.

    Example:
      >>> import numpy as np
      >>> m = GaussianMechanism(sigma=2.0, sensitivity=1.0)
      >>> m.event.noise_multiplier
      2.0
      >>> m([0.0, 1.0], rng=np.random.default_rng(0)).shape
      (2,)
    """

    sigma: float
    sensitivity: float
    unit: str = field(default="record", kw_only=True)
    relation: str = field(default="replace_one", kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", check_real(self.sigma, "sigma", low=0.0, closed="neither"))
        object.__setattr__(self, "sensitivity", check_sensitivity(self.sensitivity))
        check_unit_relation(self.unit, self.relation)

    @classmethod
    def from_zcdp(cls, rho: float, sensitivity: float, **kwargs: Any) -> GaussianMechanism:
        """The Gaussian mechanism that is exactly ρ-zCDP: σ = Δ₂ / sqrt(2ρ)."""
        rho = check_real(rho, "rho", low=0.0, closed="neither")
        sensitivity = check_sensitivity(sensitivity)
        sigma = sensitivity / math.sqrt(2.0 * rho)
        # round σ up until Δ²/(2σ²) ≤ ρ holds exactly (sqrt and division each round to nearest)
        from fractions import Fraction

        while Fraction(sensitivity) ** 2 > 2 * Fraction(rho) * Fraction(sigma) ** 2:
            sigma = math.nextafter(sigma, math.inf)
        return cls(sigma=sigma, sensitivity=sensitivity, **kwargs)

    @classmethod
    def from_epsilon_delta(
        cls, epsilon: float, delta: float, sensitivity: float, **kwargs: Any
    ) -> GaussianMechanism:
        """The smallest σ (to bisection tolerance, rounded up) whose analytic-Gaussian δ(ε) ≤ ``delta``.

        Uses :func:`privalign.accounting.conversions.gaussian_delta` (Balle & Wang 2018, Thm. 8).
        """
        epsilon = check_epsilon(epsilon)
        delta = check_probability(delta, "delta")
        sensitivity = check_sensitivity(sensitivity)
        from privalign.accounting.calibration import CalibrationLimitError, bisect_monotone
        from privalign.accounting.conversions import gaussian_delta

        try:
            nm = bisect_monotone(
                lambda m: gaussian_delta(m, epsilon) <= delta,
                1e-6,
                1.0,
                feasible="above",
                rtol=1e-12,
                limit=1e12,
            )
        except CalibrationLimitError:  # pragma: no cover - unreachable for δ in (0, 1)
            raise PrivacyParameterError(
                f"Cannot calibrate a Gaussian to epsilon={epsilon!r}, delta={delta!r}."
            ) from None
        return cls(sigma=nm * sensitivity, sensitivity=sensitivity, **kwargs)

    @property
    def noise_multiplier(self) -> float:
        """σ / Δ₂, rounded down (every ε or ρ computed from the event is then conservative)."""
        return _div_down(self.sigma, self.sensitivity)

    @property
    def rho(self) -> float:
        """The zCDP parameter Δ₂²/(2σ²)."""
        return 1.0 / (2.0 * self.noise_multiplier**2)

    @property
    def event(self) -> GaussianEvent:
        return GaussianEvent(noise_multiplier=self.noise_multiplier, unit=self.unit, relation=self.relation)

    def __call__(self, values: Any, *, rng: NoiseSource | np.random.Generator) -> np.ndarray:
        """Return ``values + N(0, σ²)`` (same shape, float64).

        Args:
          values: The exact query answer (scalar or array, finite, non-empty).
          rng: A ``numpy.random.Generator`` or a :class:`~privalign.rng.NoiseSource`
            (:class:`~privalign.rng.SecureNoise` when serving).

        Raises:
          PrivacyParameterError: empty or non-finite ``values``.
        """
        arr = _check_values(values)
        src = as_noise_source(rng)
        return arr + src.normal(self.sigma, arr.shape if arr.ndim else 1).reshape(arr.shape)


@dataclass(frozen=True, slots=True)
class LaplaceMechanism:
    """Add Laplace(0, b) noise to every coordinate of a vector with ℓ1 sensitivity ``sensitivity``.

    Args:
      scale: Laplace scale b > 0 (absolute, in the units of the query).
      sensitivity: Declared ℓ1 sensitivity Δ₁ > 0 of the whole query answer.
      unit, relation: Recorded in the event; Δ₁ must hold under ``relation``.

    Raises:
      PrivacyParameterError: b or Δ₁ not a finite positive real.

    Privacy:
      Unit: ``unit``. Relation: ``relation``. Sensitivity: ℓ1, ``‖f(D) − f(D′)‖₁ ≤ sensitivity``.
      Guarantee: ε-DP with ε = Δ₁/b (Dwork, McSherry, Nissim & Smith 2006, Prop. 1; Dwork & Roth 2014,
      Thm. 3.6). Event: ``LaplaceEvent(noise_multiplier=b/Δ₁)``.

    References:
      Dwork, McSherry, Nissim & Smith, "Calibrating Noise to Sensitivity in Private Data Analysis",
      TCC 2006 (no arXiv version), Proposition 1.
      Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", 2014, Theorem 3.6.

    Example:
      >>> m = LaplaceMechanism.from_epsilon(0.5, sensitivity=1.0)
      >>> m.scale, m.epsilon
      (2.0, 0.5)
    """

    scale: float
    sensitivity: float
    unit: str = field(default="record", kw_only=True)
    relation: str = field(default="replace_one", kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", check_real(self.scale, "scale", low=0.0, closed="neither"))
        object.__setattr__(self, "sensitivity", check_sensitivity(self.sensitivity))
        check_unit_relation(self.unit, self.relation)

    @classmethod
    def from_epsilon(cls, epsilon: float, sensitivity: float, **kwargs: Any) -> LaplaceMechanism:
        """The ε-DP Laplace mechanism: b = Δ₁/ε."""
        epsilon = check_epsilon(epsilon)
        sensitivity = check_sensitivity(sensitivity)
        scale = _finite_ratio(
            _div_up(sensitivity, epsilon), "Laplace scale", "sensitivity", sensitivity, "epsilon", epsilon
        )
        return cls(scale=scale, sensitivity=sensitivity, **kwargs)  # b rounded up: loss Δ₁/b ≤ ε exactly

    @property
    def noise_multiplier(self) -> float:
        """b / Δ₁, rounded down (the event's ε = 1/nm is then never below the true Δ₁/b)."""
        return _div_down(self.scale, self.sensitivity)

    @property
    def epsilon(self) -> float:
        """Δ₁ / b, rounded up."""
        return _div_up(self.sensitivity, self.scale)

    @property
    def event(self) -> LaplaceEvent:
        return LaplaceEvent(noise_multiplier=self.noise_multiplier, unit=self.unit, relation=self.relation)

    def __call__(self, values: Any, *, rng: NoiseSource | np.random.Generator) -> np.ndarray:
        """Return ``values + Laplace(0, b)`` (same shape, float64).

        Raises:
          PrivacyParameterError: empty or non-finite ``values``.
        """
        arr = _check_values(values)
        src = as_noise_source(rng)
        return arr + src.laplace(self.scale, arr.shape if arr.ndim else 1).reshape(arr.shape)
