"""PrivBoN: private Best-of-N by Gumbel noisy-argmax (spec-inference-time §2.3)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from privalign._validation import check_epsilon_range, check_real
from privalign.accounting.events import NoisyArgmaxEvent, NonPrivateEvent, PrivacyEvent
from privalign.alignment.base import (
    BatchSelection,
    MethodBase,
    Param,
    Selection,
    SelectionLaw,
    scores_matrix,
    scores_matrix_row_max,
    scores_vector,
)
from privalign.alignment.laws import softmax_law
from privalign.errors import PrivacyParameterError
from privalign.mechanisms._common import gumbel_epsilon, gumbel_scale
from privalign.rng import FastSeededNoise, as_noise_source

__all__ = ["PrivBoN", "privbon_scale", "privbon_epsilon", "privbon_epsilon_within"]


def privbon_scale(epsilon: float, sensitivity: float) -> float:
    """PrivBoN's Gumbel scale for a target ε: ``2Δ/ε`` rounded *up* (so the charged ε never exceeds the
    target); ``0.0`` (plain BoN) when ε = ∞. The one ε → scale conversion of the package."""
    return 0.0 if math.isinf(epsilon) else gumbel_scale(sensitivity, epsilon)


def privbon_epsilon(scale: float, sensitivity: float) -> float:
    """The ε charged for Gumbel noise of scale σ: ``2Δ/σ`` rounded *up*; ∞ when σ = 0. The one scale → ε
    conversion of the package (the inverse of :func:`privbon_scale`, conservative in both directions)."""
    return math.inf if scale == 0.0 else gumbel_epsilon(sensitivity, scale)


def privbon_epsilon_within(target: Fraction | int, sensitivity: float, *, max_steps: int = 64) -> float:
    """The float ε to run PrivBoN at so that the ε it charges is at most an exact budget ``target``.

    Starts at the largest float whose exact value is ≤ ``target`` and steps down one ulp at a time while the
    charged ε (:attr:`PrivBoN.epsilon_effective`: :func:`privbon_scale` then :func:`privbon_epsilon`, each
    rounded up) still exceeds ``target`` exactly. The service runs its ledger-unit ε here, so a budget of
    2.0 serves exactly twenty ε = 0.1 requests.

    Raises:
      PrivacyParameterError: ``target`` is not positive, or no such float within ``max_steps`` ulps.
    """
    target = Fraction(target)
    if target <= 0:
        raise PrivacyParameterError(f"The 'target' parameter must be > 0. Got {target} instead.")
    run = float(target)
    while Fraction(run) > target:
        run = math.nextafter(run, 0.0)
    for _ in range(max_steps):  # the two round-ups may lift the charge by an ulp: step down until it fits
        if Fraction(PrivBoN(run, sensitivity=sensitivity).epsilon_effective) <= target:
            return run
        run = math.nextafter(run, 0.0)
    raise PrivacyParameterError(  # pragma: no cover - one or two steps suffice
        f"No float ε within {max_steps} ulps of {target} charges at most {target} (Δ = {sensitivity!r})."
    )


class PrivBoN(MethodBase):
    """Select ``argmax_i (r_i + g_i)``, ``g_i ~ Gumbel(0, σ)``, ``σ = max(2Δ/ε, σ_reg)``.

    Scores must lie in the public range ``[0, r_max]`` (an error unless ``clip=True``; clipping is
    1-Lipschitz so it never increases Δ). The Gumbel draw is the exponential mechanism, so the law is
    the softmax ``exp(r_i/σ)/Σ_j exp(r_j/σ)``.

    Args:
      epsilon: Requested ε > 0; ``math.inf`` means no privacy (≡ BoN unless ``sigma_reg`` > 0; the event is
        then ``NonPrivateEvent``). The CLI and the service refuse ε = ∞: a non-private run is asked for by
        name (method ``bon``, or σ = 0 in a sweep).
      sensitivity: Δ_r, the public ℓ∞ sensitivity of the scores (default ``r_max``, always valid after
        clipping).
      r_max: Public upper end of the score range.
      clip: Clip scores into ``[0, r_max]`` instead of raising.
      sigma_reg: Optional regularisation temperature (``theory.sigma_reg``). When
        ``σ_reg > 2Δ/ε`` the mechanism uses σ = σ_reg and reports the smaller ``ε_eff = 2Δ/σ_reg`` it
        actually spends. ``σ_reg`` must be public (chosen without looking at the private scores, e.g.
        from public data): a σ that is a function of the scores (such as ``theory.estimate_theory`` on the
        pool being served) makes the noise scale itself a release and voids the guarantee.

    Privacy:
      Unit: one training record of the reward model. Relation: replace-one. Sensitivity: ℓ∞ of the
      scores ≤ Δ. Guarantee: ε_eff-DP (exponential mechanism; the pool is data-independent), and
      ε_eff²/8-zCDP (bounded range). Event: ``NoisyArgmaxEvent(epsilon=ε_eff)``, or ``NonPrivateEvent``
      when σ = 0.

    References:
      McSherry & Talwar 2007 (exponential mechanism, Thm. 6); Durfee & Rogers 2019, arXiv 1905.04273
      (bounded range); Cesar & Rogers 2021, arXiv 2004.07223v2 (ε-BR ⇒ ε²/8-zCDP, Lemma 3.2); paper 1,
      arXiv 2608.26324v1 (PrivBoN; theorem numbers not available).
    """

    name = "privbon"
    label = "PrivBoN"
    private = True
    spends_budget = True
    accounting = "pure"
    params = (
        Param("epsilon", "ε > 0 of the exponential mechanism (or give sigma)"),
        Param(
            "sigma",
            "the Gumbel scale σ ≥ 0 instead of ε (σ = 0 is plain BoN)",
            excludes=("epsilon", "sigma_reg"),
        ),
        Param("sigma_reg", "public regularisation temperature: σ = max(2Δ/ε, σ_reg)"),
    )

    @classmethod
    def from_params(cls, params, *, r_max=1.0, sensitivity=None, clip=False) -> PrivBoN:
        """ε, or the Gumbel scale σ directly (``sigma``: then ε = ∞ and σ_reg = σ make the scale exactly σ;
        ``sigma`` excludes ``epsilon`` and ``sigma_reg``)."""
        epsilon, sigma, sigma_reg = (params.get(k) for k in ("epsilon", "sigma", "sigma_reg"))
        if sigma is not None:
            if epsilon is not None or sigma_reg is not None:
                raise PrivacyParameterError(
                    "PrivBoN needs exactly one of 'epsilon' or 'sigma' (and 'sigma' excludes 'sigma_reg'). "
                    f"Got epsilon={epsilon!r}, sigma={sigma!r}, sigma_reg={sigma_reg!r}."
                )
            sigma = check_real(sigma, "sigma", low=0.0, closed="left")
            return cls(math.inf, sensitivity=sensitivity, r_max=r_max, clip=clip, sigma_reg=sigma)
        if epsilon is None:
            raise PrivacyParameterError(
                "The 'epsilon' parameter is required for method 'privbon'. Got None instead."
            )
        return cls(epsilon, sensitivity=sensitivity, r_max=r_max, clip=clip, sigma_reg=sigma_reg)

    @classmethod
    def for_budget(cls, cap, n, params, *, r_max=1.0, sensitivity=None, clip=False) -> PrivBoN:
        """The largest float ε whose charged ε (scale and ε each rounded up) is at most ``cap`` exactly
        (:func:`privbon_epsilon_within`): the charge is then exactly the requested amount."""
        delta_r = r_max if sensitivity is None else sensitivity
        run = privbon_epsilon_within(cap, delta_r)
        return cls(run, sensitivity=sensitivity, r_max=r_max, clip=clip)

    @classmethod
    def describe(cls, params) -> str:
        eps, sigma = params.get("epsilon"), params.get("sigma")
        name = f"PrivBoN ε={eps:g}" if eps is not None else f"PrivBoN σ={sigma:g}"
        # ε = ∞ or σ = 0: no noise, so the curve must not read as a private one
        plain = (eps is not None and math.isinf(eps)) or (eps is None and sigma == 0.0)
        return name + " (non-private: = BoN)" if plain else name

    def __init__(
        self,
        epsilon: float,
        *,
        sensitivity: float | None = None,
        r_max: float = 1.0,
        clip: bool = False,
        sigma_reg: float | None = None,
    ) -> None:
        self.epsilon = check_epsilon_range(epsilon, "epsilon", allow_inf=True)
        self.r_max = check_real(r_max, "r_max", low=0.0, closed="neither")
        self.sensitivity = (
            self.r_max
            if sensitivity is None
            else check_real(sensitivity, "sensitivity", low=0.0, closed="neither")
        )
        self.sigma_reg = (
            None if sigma_reg is None else check_real(sigma_reg, "sigma_reg", low=0.0, closed="left")
        )
        self.clip = bool(clip)

    @property
    def scale(self) -> float:
        """The Gumbel scale σ actually used: ``max(2Δ/ε, σ_reg)`` (2Δ/ε rounded up to the next float if
        needed)."""
        return max(privbon_scale(self.epsilon, self.sensitivity), self.sigma_reg or 0.0)

    @property
    def epsilon_effective(self) -> float:
        """``2Δ/σ`` rounded up (≤ the requested ε; ∞ when σ = 0): the ε that is charged."""
        return privbon_epsilon(self.scale, self.sensitivity)

    @property
    def event(self) -> PrivacyEvent:
        return NonPrivateEvent() if self.scale == 0.0 else NoisyArgmaxEvent(epsilon=self.epsilon_effective)

    def worst_case_event(self, n: int | None = None) -> PrivacyEvent:
        return self.event

    def _argmax(self, r: np.ndarray, rng, row_max: np.ndarray | None = None) -> np.ndarray:
        if self.scale == 0.0:
            return np.argmax(r, axis=-1)
        from privalign.mechanisms.selection import NoisyArgmax

        mech = NoisyArgmax(epsilon=self.epsilon_effective, sensitivity=self.sensitivity)
        # ``mech(r, rng=rng)`` without its second validation pass: ``r`` was validated by the caller (float64,
        # finite, in range); same noise source, same scale, same draw
        src = as_noise_source(rng)
        if row_max is not None and isinstance(src, FastSeededNoise):
            return np.asarray(src.gumbel_argmax(r, mech.scale, row_max=row_max), dtype=np.int64)
        return np.asarray(src.gumbel_argmax(r, mech.scale), dtype=np.int64)

    def select(self, scores: ArrayLike, *, rng, pool_b_scores=None) -> Selection:
        """Select one index (``pool_b_scores`` is ignored: one pool).

        Raises:
          PrivacyParameterError: non-finite scores, or scores outside [0, r_max] without ``clip``.
        """
        r = scores_vector(scores, "scores", r_max=self.r_max, clip=self.clip)
        i = int(self._argmax(r, rng))
        return Selection(
            i,
            self.event,
            self.event,
            {"scale": self.scale, "epsilon_effective": self.epsilon_effective, "n": r.size},
        )

    def select_batch(self, scores: ArrayLike, *, rng, pool_b_scores=None) -> BatchSelection:
        if isinstance(rng, FastSeededNoise):  # the range check's row maxima are the sampler's envelope
            r, top = scores_matrix_row_max(scores, "scores", r_max=self.r_max, clip=self.clip)
        else:
            r, top = scores_matrix(scores, "scores", r_max=self.r_max, clip=self.clip), None
        idx = np.asarray(self._argmax(r, rng, top), dtype=np.int64).reshape(r.shape[0])
        return BatchSelection(idx, [self.event] * r.shape[0], self.event, {})

    def law(self, scores: ArrayLike, *, pool_b_scores=None) -> SelectionLaw:
        """The exact softmax law."""
        r = scores_vector(scores, "scores", r_max=self.r_max, clip=self.clip)
        return SelectionLaw(softmax_law(r, self.scale))
