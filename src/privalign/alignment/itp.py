"""InferenceTimePessimism (Huang et al. 2025; spec-inference-time §2.2), non-private."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from privalign._validation import check_real
from privalign.accounting.events import NonPrivateEvent
from privalign.alignment.base import (
    FALLBACK,
    BatchSelection,
    CandidateLayout,
    MethodBase,
    Param,
    Selection,
    SelectionLaw,
    pick_from_pools,
    require_pool_b,
    scores_matrix,
    scores_vector,
)
from privalign.alignment.laws import itp_acceptance, sequential_law
from privalign.alignment.normalizer import solve_normalizer
from privalign.rng import as_noise_source

__all__ = ["InferenceTimePessimism"]


class InferenceTimePessimism(MethodBase):
    """ITP: λ̂ from pool A, sequential rejection sampling on a fresh pool B, fresh-sample fallback.

    Candidate i of pool B is accepted with probability ``min(relu((r_i − λ̂)/β)/M, 1)``,
    ``M = (R_max − λ̂)/β``; implemented in the equivalent threshold form ``r_i > λ̂ + W·U_i`` with
    ``W = β·M = R_max − λ̂`` (reconstruction lemma, spec §2.4).

    Args:
      beta: β > 0, the χ²-regularisation strength.
      r_max: Public upper end of the score range [0, R_max].
      clip: Clip scores into [0, R_max] instead of raising.

    Privacy:
      None (event ``NonPrivateEvent``); the diagnostics include the clean λ̂.

    References:
      Huang et al. 2025, "Is Best-of-N the Best of Them?", arXiv 2503.21878 (ICML 2025).
    """

    name = "itp"
    label = "ITP"
    served = False  # non-private; the service's non-private method is BoN
    layout = CandidateLayout(pools=2, fallback=True)
    params = (Param("beta", "KL temperature β > 0", required=True),)

    @classmethod
    def from_params(cls, params, *, r_max=1.0, sensitivity=None, clip=False) -> InferenceTimePessimism:
        return cls(params["beta"], r_max=r_max, clip=clip)

    @classmethod
    def describe(cls, params) -> str:
        return f"ITP β={params['beta']:g}"

    def pick(self, candidates, *, rng) -> Selection:
        """Select from ``[pool A (n), pool B (n), fallback (1)]``; the index is into that list (``2n`` =
        serve the fallback candidate)."""
        return pick_from_pools(self, candidates, rng=rng)

    def __init__(self, beta: float, *, r_max: float = 1.0, clip: bool = False) -> None:
        self.beta = check_real(beta, "beta", low=0.0, closed="neither")
        self.r_max = check_real(r_max, "r_max", low=0.0, closed="neither")
        self.clip = bool(clip)

    def worst_case_event(self, n: int | None = None) -> NonPrivateEvent:
        return NonPrivateEvent()

    def _pools(self, scores, pool_b, batch: bool):
        f = scores_matrix if batch else scores_vector
        a = f(scores, "scores", r_max=self.r_max, clip=self.clip)
        b = f(require_pool_b(pool_b, type(self).__name__), "pool_b_scores", r_max=self.r_max, clip=self.clip)
        return a, b

    def select(self, scores: ArrayLike, *, rng, pool_b_scores: ArrayLike | None = None) -> Selection:
        """Run ITP on pool A ``scores`` and pool B ``pool_b_scores``.

        Returns:
          A :class:`Selection` with ``index`` into pool B or ``FALLBACK``; diagnostics ``lambda_hat``,
          ``M``, ``t`` (1-based stopping time, or ``None`` on fallback).
        """
        a, b = self._pools(scores, pool_b_scores, batch=False)
        return self._run(a[None, :], b[None, :], rng)[0]

    def select_batch(
        self, scores: ArrayLike, *, rng, pool_b_scores: ArrayLike | None = None
    ) -> BatchSelection:
        """Vectorized ITP over rows (prompts)."""
        a, b = self._pools(scores, pool_b_scores, batch=True)
        if a.shape[0] != b.shape[0]:
            raise _rows_error(a, b)
        return self._run(a, b, rng)

    def _run(self, a: np.ndarray, b: np.ndarray, rng) -> BatchSelection:
        src = as_noise_source(rng)
        lam = np.asarray(solve_normalizer(a, self.beta))  # 2-D scores: one λ̂ per row
        width = self.r_max - lam
        u = src.uniform(b.shape)
        acc = b > lam[:, None] + width[:, None] * u
        any_acc = acc.any(axis=1)
        first = np.argmax(acc, axis=1)
        idx = np.where(any_acc, first, FALLBACK)
        t = np.where(any_acc, first + 1, -1)
        ev = NonPrivateEvent()
        return BatchSelection(idx, [ev] * a.shape[0], ev, {"lambda_hat": lam, "M": width / self.beta, "t": t})

    def law(self, scores: ArrayLike, *, pool_b_scores: ArrayLike | None = None) -> SelectionLaw:
        """Exact law over pool B: the sequential acceptance product; fallback mass Π(1 − a_i)."""
        a, b = self._pools(scores, pool_b_scores, batch=False)
        lam = solve_normalizer(a, self.beta)
        p, fb = sequential_law(itp_acceptance(b, lam, self.r_max))
        return SelectionLaw(p, float(fb))


def _rows_error(a, b):  # noqa: N802 - small helper returning the exception
    from privalign.errors import PrivacyParameterError

    return PrivacyParameterError(
        f"The 'pool_b_scores' parameter must have as many rows as 'scores' ({a.shape[0]}). Got {b.shape[0]} "
        "instead."
    )
