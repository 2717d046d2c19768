"""Private selection: Gumbel noisy-argmax (exponential mechanism), one-shot Gumbel top-k, and Peeling.

All three take scores whose ℓ∞ sensitivity between neighbouring datasets is bounded by a declared,
public ``sensitivity`` (each score moves by at most Δ, in any direction).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from privalign._validation import check_choice, check_int, check_probability
from privalign.accounting.events import (
    NoisyArgmaxEvent,
    NonPrivateEvent,
    PeelingEvent,
    PrivacyEvent,
    SelfComposedEvent,
)
from privalign.errors import PrivacyParameterError, PrivacyWarning
from privalign.mechanisms._common import (
    check_epsilon,
    check_scores,
    check_sensitivity,
    check_unit_relation,
    gumbel_scale,
)
from privalign.rng import NoiseSource, as_noise_source

__all__ = ["NoisyArgmax", "NoisyTopK", "Peeling", "softmax"]


def softmax(logits: Any, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis`` (max subtracted before ``exp``)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


@dataclass(frozen=True, slots=True)
class NoisyArgmax:
    """Select ``argmax_i (score_i + G_i)`` with G_i i.i.d. Gumbel(0, 2Δ/ε): the exponential mechanism.

    By the Gumbel-max trick the selected index has the softmax law
    ``P(i) = exp(ε·s_i/(2Δ)) / Σ_j exp(ε·s_j/(2Δ))`` (:meth:`probabilities`). With
    :class:`~privalign.rng.SecureNoise` the draw is OpenDP's ``make_noisy_max`` (Gumbel noise, the
    zCDP variant), which samples the argmax exactly without floating-point leakage.

    Args:
      epsilon: ε in (0, inf]. ``inf`` is the plain argmax (first maximal index): no privacy, and the event
        is ``NonPrivateEvent``.
      sensitivity: Declared ℓ∞ sensitivity Δ > 0 of the score vector.
      unit, relation: Recorded in the event.

    Raises:
      PrivacyParameterError: ε ≤ 0 or NaN; Δ ≤ 0, NaN or infinite; empty or non-finite scores.

    Privacy:
      Unit: ``unit`` (default one preference record). Relation: ``relation`` (default replace-one).
      Sensitivity: ℓ∞, ``max_i |s_i(D) − s_i(D′)| ≤ Δ`` (scores may move in different directions, hence
      the factor 2 in the scale). Guarantee: ε-DP (exponential mechanism, McSherry & Talwar 2007,
      Thm. 6; Dwork & Roth 2014, Thm. 3.10); ε-bounded range (Durfee & Rogers 2019), hence ε²/8-zCDP
      (Cesar & Rogers 2021). A 2-D input is one independent selection per row: each row is one
      mechanism, and the rows compose (count = number of rows) unless they touch disjoint data.
      Event: ``NoisyArgmaxEvent(epsilon)`` per row (``NonPrivateEvent`` at ε = ∞).

    References:
      McSherry & Talwar, "Mechanism Design via Differential Privacy", FOCS 2007 (no arXiv), Theorem 6.
      Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", 2014, Theorem 3.10.
      Durfee & Rogers, "Practical Differentially Private Top-k Selection with Pay-what-you-get
      Composition", NeurIPS 2019, arXiv:1905.04273v2, §4.1 (Gumbel noise ≡ exponential mechanism).
      Cesar & Rogers, "Bounding, Concentrating, and Truncating: Unifying Privacy Loss Composition for
      Data Analytics", ALT 2021, arXiv:2004.07223v2 (ε-BR ⇒ ε²/8-zCDP; result number to be checked,
      see LIMITATIONS.md).

    Example:
      >>> import numpy as np
      >>> m = NoisyArgmax(epsilon=1.0, sensitivity=1.0)
      >>> m.scale
      2.0
      >>> np.round(m.probabilities([0.0, 2.0]), 4)
      array([0.2689, 0.7311])
      >>> m(np.zeros((4, 3)), rng=np.random.default_rng(0)).shape
      (4,)
    """

    epsilon: float
    sensitivity: float
    unit: str = field(default="record", kw_only=True)
    relation: str = field(default="replace_one", kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, allow_inf=True))
        object.__setattr__(self, "sensitivity", check_sensitivity(self.sensitivity))
        check_unit_relation(self.unit, self.relation)

    @property
    def scale(self) -> float:
        """The Gumbel scale 2Δ/ε, rounded up to the next float if needed (0 at ε = ∞)."""
        return 0.0 if math.isinf(self.epsilon) else gumbel_scale(self.sensitivity, self.epsilon)

    @property
    def event(self) -> PrivacyEvent:
        """The cost of one selection (one row)."""
        if math.isinf(self.epsilon):
            return NonPrivateEvent(unit=self.unit, relation=self.relation)
        return NoisyArgmaxEvent(epsilon=self.epsilon, unit=self.unit, relation=self.relation)

    def probabilities(self, scores: Any) -> np.ndarray:
        """The exact law of the selected index: ``softmax(scores / scale)`` along the last axis.

        At ε = ∞ it is the point mass on the first maximal index.
        """
        s = check_scores(scores)
        if self.scale == 0.0:
            out = np.zeros_like(s)
            np.put_along_axis(out, np.argmax(s, axis=-1)[..., None], 1.0, axis=-1)
            return out
        return softmax(s / self.scale, axis=-1)

    def __call__(self, scores: Any, *, rng: NoiseSource | np.random.Generator) -> int | np.ndarray:
        """Select one index per query.

        Args:
          scores: A 1-D vector of candidate scores, or a 2-D array (queries × candidates).
          rng: A ``numpy.random.Generator`` or a :class:`~privalign.rng.NoiseSource`.

        Returns:
          An ``int`` for 1-D scores; an int64 array of shape ``(queries,)`` for 2-D scores.
        """
        s = check_scores(scores)
        src = as_noise_source(rng)
        idx = src.gumbel_argmax(s, self.scale)
        return int(idx) if s.ndim == 1 else np.asarray(idx, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class NoisyTopK:
    """One-shot Gumbel top-k: the k largest of ``score_i + Gumbel(0, 2Δ/ε)``, in decreasing noisy order.

    Its output law equals k rounds of the exponential mechanism at ε each, every round removing the
    previous winners ("peeling" exponential mechanism), so it costs k·ε-DP and k·ε²/8-zCDP. Note that
    ``epsilon`` is the **per-selection** ε. With :class:`~privalign.rng.SecureNoise` it is OpenDP's
    ``make_noisy_top_k`` (Gumbel noise, zCDP variant).

    Args:
      k: Number of indices selected, ``1 ≤ k ≤ d`` (checked at call time against d).
      epsilon: Per-selection ε in (0, inf) (the Gumbel scale is 2Δ/ε).
      sensitivity: Declared ℓ∞ sensitivity Δ > 0 of the score vector.
      unit, relation: Recorded in the event.

    Raises:
      PrivacyParameterError: k < 1, ε ≤ 0/NaN/∞, Δ ≤ 0; at call time k > d or bad scores.

    Privacy:
      Unit: ``unit``. Relation: ``relation``. Sensitivity: ℓ∞ ≤ Δ. Guarantee: k·ε-DP by basic
      composition of k exponential mechanisms, and k·ε²/8-zCDP (k ε-bounded-range mechanisms).
      Event: ``SelfComposedEvent(event=NoisyArgmaxEvent(epsilon), count=k)`` per row.

    References:
      Durfee & Rogers, "Practical Differentially Private Top-k Selection with Pay-what-you-get
      Composition", NeurIPS 2019, arXiv:1905.04273v2, §4.1 (one-shot Gumbel top-k has the law of the
      peeling exponential mechanism; lemma number to be checked, see LIMITATIONS.md).
    """

    k: int
    epsilon: float
    sensitivity: float
    unit: str = field(default="record", kw_only=True)
    relation: str = field(default="replace_one", kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", check_int(self.k, "k", low=1))
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "sensitivity", check_sensitivity(self.sensitivity))
        check_unit_relation(self.unit, self.relation)

    @property
    def scale(self) -> float:
        """The Gumbel scale 2Δ/ε, rounded up to the next float if needed."""
        return gumbel_scale(self.sensitivity, self.epsilon)

    @property
    def event(self) -> SelfComposedEvent:
        return SelfComposedEvent(
            event=NoisyArgmaxEvent(epsilon=self.epsilon, unit=self.unit, relation=self.relation),
            count=self.k,
            unit=self.unit,
            relation=self.relation,
        )

    def __call__(self, scores: Any, *, rng: NoiseSource | np.random.Generator) -> np.ndarray:
        """Return the selected indices, shape ``(k,)`` (1-D scores) or ``(queries, k)`` (2-D scores)."""
        s = check_scores(scores)
        d = s.shape[-1]
        if self.k > d:
            raise PrivacyParameterError(
                f"The 'k' parameter must be at most the number of candidates d={d}. Got {self.k} instead."
            )
        src = as_noise_source(rng)
        return np.asarray(src.gumbel_topk(s, self.k, self.scale), dtype=np.int64)


def _accounting_peeling():
    from privalign.accounting import peeling  # engineer A's module

    return peeling


@dataclass(frozen=True, slots=True)
class Peeling:
    """Private top-s selection and release (Cai, Wang & Zhang 2021, "Peeling").

    ::

        S ← ∅
        for j = 1..s:                       # fresh Laplace(b)^d noise every round
            i* ← argmax_{i ∉ S} |v_i| + w_i
            S ← S ∪ {i*}
        return P_S(v + w̃),  w̃ ~ Laplace(b)^d fresh       # exactly s non-zeros (a.s.)

    The Laplace scale is ``b = noise_multiplier × λ`` with λ = ``sensitivity``:

    * ``scale="accounted"`` (default, spec-reward-estimation §4 option (b)): ``noise_multiplier =
      calibrate_peeling(s, ε, δ)``, the smallest noise whose cost accounted from the 2s sub-mechanisms
      (s Laplace report-noisy-max rounds + s Laplace releases) is ≤ (ε, δ);
    * ``scale="cwz"``: the paper's ``2·sqrt(3·s·log(1/δ))/ε``. Its *accounted* cost is above the
      claimed (ε, δ) (spec §4: about 1.04–1.26 ε at 2δ); the event carries the accounted cost.

    Args:
      sparsity: s ≥ 1, the number of coordinates kept (checked against d at call time).
      epsilon: Target ε in (0, inf).
      delta: Target δ in (0, 1).
      sensitivity: λ > 0, the ℓ∞ sensitivity of v between neighbouring datasets.
      scale: ``"accounted"`` (default) or ``"cwz"``.
      unit, relation: Recorded in the event (default unit ``"sample"``).

    Raises:
      PrivacyParameterError: s < 1, ε ≤ 0/NaN/∞, δ ∉ (0, 1), λ ≤ 0, unknown ``scale``; at call time
        s > d, empty or non-finite v.

    Privacy:
      Unit: ``unit``. Relation: ``relation``. Sensitivity: ℓ∞, ``‖v(D) − v(D′)‖∞ ≤ λ``.
      Guarantee: the (ε, δ) computed by :func:`privalign.accounting.peeling.peeling_epsilon` from
      ``(sparsity, noise_multiplier, δ)``, which is ≤ the target for ``scale="accounted"``.
      Event: ``PeelingEvent(sparsity, noise_multiplier, target_epsilon, target_delta)``, where the
      targets are the *accounted* (ε, total δ), not the requested ones (``target_delta=None`` when the
      accounted cost is pure ε-DP, e.g. s = 1 where basic composition 3s/nm is the tightest bound).

    References:
      Cai, Wang & Zhang, "The Cost of Privacy: Optimal Rates of Convergence for Parameter Estimation
      with Differential Privacy", Annals of Statistics 2021, arXiv:1902.04495v5, Algorithm "Peeling" and
      its privacy lemma (Lemma 3.3 in that version; numbering to be checked, see LIMITATIONS.md).
      Dwork, Rothblum & Vadhan, "Boosting and Differential Privacy", FOCS 2010, Thm. III.3 (advanced
      composition, used by the accounting).
    """

    sparsity: int
    epsilon: float
    delta: float
    sensitivity: float
    scale: Literal["accounted", "cwz"] = "accounted"
    unit: str = field(default="sample", kw_only=True)
    relation: str = field(default="replace_one", kw_only=True)
    _noise_multiplier: float = field(default=0.0, init=False, repr=False, compare=False)
    _accounted: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sparsity", check_int(self.sparsity, "sparsity", low=1))
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", check_probability(self.delta, "delta"))
        object.__setattr__(self, "sensitivity", check_sensitivity(self.sensitivity))
        check_choice(self.scale, "scale", ("accounted", "cwz"))
        check_unit_relation(self.unit, self.relation)
        peeling = _accounting_peeling()
        if self.scale == "accounted":
            nm = float(peeling.calibrate_peeling(self.sparsity, self.epsilon, self.delta))
        else:
            nm = float(peeling.cwz_noise_multiplier(self.sparsity, self.epsilon, self.delta))
        eps_acc, delta_acc = peeling.peeling_epsilon(self.sparsity, nm, self.delta)
        object.__setattr__(self, "_noise_multiplier", nm)
        object.__setattr__(self, "_accounted", (float(eps_acc), float(delta_acc)))

    @property
    def noise_multiplier(self) -> float:
        """b / λ."""
        return self._noise_multiplier

    @property
    def noise_scale(self) -> float:
        """The Laplace scale b = noise_multiplier × λ used in every round and in the release."""
        return self._noise_multiplier * self.sensitivity

    @property
    def accounted(self) -> tuple[float, float]:
        """The accounted (ε, total δ) of one call."""
        return self._accounted

    @property
    def event(self) -> PeelingEvent:
        eps_acc, delta_acc = self._accounted
        return PeelingEvent(
            sparsity=self.sparsity,
            noise_multiplier=self._noise_multiplier,
            target_epsilon=eps_acc,
            target_delta=delta_acc if delta_acc > 0.0 else None,  # None: the accounted cost is pure ε
            unit=self.unit,
            relation=self.relation,
        )

    def __call__(
        self, v: Any, *, rng: NoiseSource | np.random.Generator, noise: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run Peeling on one vector (1-D) or independently on each row of a batch (2-D).

        Args:
          v: The vector (d,) or batch (n, d); finite, d ≥ sparsity.
          rng: A ``numpy.random.Generator`` or a :class:`~privalign.rng.NoiseSource`.
          noise: **Test only.** ``False`` runs deterministic top-s hard thresholding (no privacy) and
            emits a :class:`~privalign.errors.PrivacyWarning`.

        Returns:
          ``(sparse, support)``: ``sparse`` has v's shape with exactly s non-zeros per row (almost
          surely), ``support`` holds the selected indices in selection order, shape (s,) or (n, s).
        """
        arr = check_scores(v, "v")
        d = arr.shape[-1]
        s = self.sparsity
        if s > d:
            raise PrivacyParameterError(
                f"The 'sparsity' parameter must be at most the dimension d={d} of v. Got {s} instead."
            )
        if not noise:
            warnings.warn(
                "Peeling(noise=False) is deterministic hard thresholding: not private.",
                PrivacyWarning,
                stacklevel=2,
            )
        out, support = _peel(arr.reshape(-1, d), s, self.noise_scale, as_noise_source(rng), noise=noise)
        if arr.ndim == 1:
            return out[0], support[0]
        return out, support


def _peel(
    batch: np.ndarray, s: int, b: float, src: NoiseSource, *, noise: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Peeling on each row of ``batch`` (n, d) at Laplace scale ``b`` (no validation; internal)."""
    n, d = batch.shape
    absv = np.abs(batch)
    support = np.empty((n, s), dtype=np.int64)
    taken = np.zeros((n, d), dtype=bool)
    rows = np.arange(n)
    for j in range(s):
        if noise:
            noisy = src.laplace(b, (n, d))
            noisy += absv
        else:
            noisy = absv.copy()
        if j:
            noisy[taken] = -np.inf
        pick = np.argmax(noisy, axis=1)
        support[:, j] = pick
        taken[rows, pick] = True
    vals = np.take_along_axis(batch, support, axis=1)
    if noise:
        # Fresh noise for the released values. Only the s selected coordinates are drawn: the other d − s
        # draws of the pseudocode are zeroed by P_S, so drawing them would change nothing.
        vals = vals + src.laplace(b, (n, s))
    out = np.zeros_like(batch)
    np.put_along_axis(out, support, vals, axis=1)
    return out, support
