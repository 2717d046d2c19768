"""Binary randomized response (Warner 1965)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privalign.accounting.events import NonPrivateEvent, PrivacyEvent, RandomizedResponseEvent
from privalign.errors import PrivacyParameterError
from privalign.mechanisms._common import check_epsilon, check_unit_relation
from privalign.rng import NoiseSource, as_noise_source

__all__ = ["RandomizedResponse"]


@dataclass(frozen=True, slots=True)
class RandomizedResponse:
    """Keep each bit with probability e^ε/(1+e^ε), flip it with probability 1/(1+e^ε).

    Every bit is flipped independently, so each bit is protected separately (local DP per label).

    Args:
      epsilon: ε in (0, inf]; ``inf`` flips nothing (no privacy, event ``NonPrivateEvent``).
      unit: Recorded in the event (default ``"label"``: one preference label).
      relation: Recorded in the event (default ``"replace_one"``: the bit is changed).

    Raises:
      PrivacyParameterError: ε ≤ 0 or NaN.

    Privacy:
      Unit: one bit (``unit``, default a label). Relation: replace-one (the bit 0 ↔ 1).
      Sensitivity: not applicable (the input is a bit). Guarantee: ε-DP (ε-local DP) for that bit: the
      likelihood ratio of any output is exactly e^ε or e^{-ε}. Event:
      ``RandomizedResponseEvent(epsilon)`` (``NonPrivateEvent`` at ε = ∞).

    References:
      Warner, "Randomized Response: A Survey Technique for Eliminating Evasive Answer Bias", JASA 1965
      (no arXiv version). Dwork & Roth 2014, §3.2 (randomized response is ε-DP with e^ε = keep/flip).
      Kairouz, Oh & Viswanath, "Extremal Mechanisms for Local Differential Privacy", arXiv:1407.1338v2
      (optimality for binary inputs).

    Example:
      >>> import numpy as np
      >>> rr = RandomizedResponse(1.0)
      >>> round(rr.flip_probability, 4)
      0.2689
      >>> rr([0, 1, 1], rng=np.random.default_rng(0)).shape
      (3,)
    """

    epsilon: float
    unit: str = field(default="label", kw_only=True)
    relation: str = field(default="replace_one", kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, allow_inf=True))
        check_unit_relation(self.unit, self.relation)

    @property
    def flip_probability(self) -> float:
        """1/(1+e^ε), rounded up, and at least 2⁻⁵² (0 at ε = ∞).

        Rounding *up* keeps the realized loss ``ln((1−p)/p)`` at or below ε (each of ``exp`` and the
        division rounds to nearest, within an ulp; two ulps up cover both). Below 2⁻⁵² a float Bernoulli
        draw would never flip (``exp(−ε)`` underflows near ε ≈ 745), releasing the bit in the clear while
        charging ε; the floor keeps every bit randomized (true loss ≤ ln(2⁵²) ≈ 36 < ε there).
        """
        if math.isinf(self.epsilon):
            return 0.0
        e = math.exp(-self.epsilon)
        p = math.nextafter(math.nextafter(e / (1.0 + e), 1.0), 1.0)
        return min(max(p, 2.0**-52), 0.5)

    @property
    def event(self) -> PrivacyEvent:
        if math.isinf(self.epsilon):
            return NonPrivateEvent(unit=self.unit, relation=self.relation)
        return RandomizedResponseEvent(epsilon=self.epsilon, unit=self.unit, relation=self.relation)

    def __call__(self, bits: Any, *, rng: NoiseSource | np.random.Generator) -> np.ndarray:
        """Return the privatized bits (int64 array of 0/1, same shape as ``bits``).

        Args:
          bits: An array of 0/1 (ints, bools or floats equal to 0.0/1.0), non-empty.
          rng: A ``numpy.random.Generator`` or a :class:`~privalign.rng.NoiseSource`.

        Raises:
          PrivacyParameterError: empty input or a value other than 0/1.
        """
        arr = np.asarray(bits)
        if arr.size == 0:
            raise PrivacyParameterError(
                f"The 'bits' parameter must have at least 1 element. Got shape {arr.shape} instead."
            )
        if arr.dtype == np.bool_:
            b = arr.astype(np.int64)
        else:
            try:
                f = arr.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise PrivacyParameterError(
                    f"The 'bits' parameter must contain only 0/1. Got dtype {arr.dtype}."
                ) from exc
            bad = ~((f == 0.0) | (f == 1.0))
            if bad.any():
                idx = tuple(int(i) for i in np.argwhere(bad)[0]) if arr.ndim else ()
                raise PrivacyParameterError(
                    f"The 'bits' parameter must contain only 0/1. Got {arr[idx]!r} at index {idx}."
                )
            b = f.astype(np.int64)
        src = as_noise_source(rng)
        flips = np.asarray(src.bernoulli(self.flip_probability, b.shape if b.ndim else 1)).reshape(b.shape)
        return np.bitwise_xor(b, flips.astype(np.int64))
