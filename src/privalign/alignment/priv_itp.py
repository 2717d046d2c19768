"""PrivITP: private inference-time pessimism, a two-phase Gaussian mechanism (spec §2.4)."""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import ArrayLike

from privalign._validation import check_probability, check_real
from privalign.accounting.events import ExPostEvent
from privalign.accounting.expost import PrivITPAccountant, calibrate_privitp_sigma
from privalign.alignment.base import (
    FALLBACK,
    BatchSelection,
    CandidateLayout,
    LazyEvents,
    MethodBase,
    Param,
    Selection,
    SelectionLaw,
    pick_from_pools,
    require_pool_b,
    scores_matrix,
    scores_vector,
)
from privalign.alignment.laws import privitp_law
from privalign.alignment.normalizer import solve_normalizer
from privalign.errors import PrivacyParameterError
from privalign.rng import as_noise_source

__all__ = ["PrivITP"]


class PrivITP(MethodBase):
    """Two-phase PrivITP with the fixes of spec-inference-time §6 (disjoint phase pools, one width and noise
    split shared with the accountant, a valid ε1, scores clipped to a public range, a true worst case).

    Phase 1: ``λ̃ = clamp(λ̂(pool A) + N(0, σ_X²), −β, R_max − β)`` (clamping is post-processing).
    Phase 2 on a fresh pool B: accept candidate i iff ``r_i + Z_i > λ̃ + W·U_i`` with ``Z_i ~ N(0, σ_Z²)``,
    ``U_i ~ Unif[0, 1]``, ``W = R_max + σ_Z·L − λ̃`` — equal in law to
    ``Bernoulli(min(relu((r̃_i − λ̃)/β)/M, 1))``, ``M = W/β``. If nothing is accepted the caller serves
    one more fresh sample (``FALLBACK``).

    Args:
      beta: β > 0.
      sigma_x: Phase-1 noise std σ_X > 0.
      sigma_z: Phase-2 noise std σ_Z > 0.
      r_max: Public upper end of the score range [0, R_max].
      L: Envelope widening in units of σ_Z (≥ 0).
      delta: δ of phase 1's (ε1, δ) guarantee.
      sensitivity: Δ_r (default r_max).
      clip: Clip scores into [0, r_max] instead of raising.

    Privacy:
      Unit: one training record of the reward model. Relation: replace-one. Sensitivity: every score
      moves by ≤ Δ (ℓ∞); λ̂ is 1-Lipschitz so it moves by ≤ Δ (``docs/privacy/privitp.md``).
      Guarantee: ex-post (ε1(δ) + ε2(t; λ̃), δ): phase 1 is the Gaussian mechanism (analytic Gaussian
      ε1 at δ; ρ1 = Δ²/(2σ_X²)-zCDP also reported), phase 2 conditional on λ̃ has pure ex-post loss
      ε2(t; λ̃) = (t−1)ℓ1 + ℓ2 (n·ℓ1 on fallback). Event: ``ExPostEvent(epsilon_realized,
      epsilon_max, delta, details={lambda_tilde, t, rho1, epsilon1, ...})``.

    References:
      Paper 1, arXiv 2608.26324v1 (PrivITP; theorem numbers not available); Balle & Wang 2018,
      arXiv 1805.06530v2, Thm. 8; Bun & Steinke 2016, arXiv 1605.02065v1, Prop. 1.6; Lebensold,
      Precup & Balle 2024, arXiv 2402.06137 (ex-post DP of Gaussian AboveThreshold).
    """

    name = "privitp"
    label = "PrivITP"
    private = True
    accounting = "ex-post"
    layout = CandidateLayout(pools=2, fallback=True)
    #: the public bounds a server enforces on β and σ (σ = 1e308 overflows σ²)
    params = (
        Param("beta", "KL temperature β > 0", required=True, bounds=(1e-6, 1e6)),
        Param("sigma_x", "phase-1 Gaussian noise σ_X > 0", required=True, bounds=(1e-6, 1e6)),
        Param(
            "sigma_z",
            "phase-2 Gaussian noise σ_Z > 0 (default σ_X)",
            bounds=(1e-6, 1e6),
            default_from="sigma_x",
        ),
        Param("L", "envelope widening in units of σ_Z", default=3.0),
        Param("delta", "phase-1 δ", default=1e-6),
    )

    @classmethod
    def from_params(cls, params, *, r_max=1.0, sensitivity=None, clip=False) -> PrivITP:
        sx = params["sigma_x"]
        sz = params.get("sigma_z")
        return cls(
            params["beta"],
            sigma_x=sx,
            sigma_z=sx if sz is None else sz,
            r_max=r_max,
            L=params.get("L", 3.0),
            delta=params.get("delta", 1e-6),
            sensitivity=sensitivity,
            clip=clip,
        )

    @classmethod
    def describe(cls, params) -> str:
        sx = params["sigma_x"]
        sz = params.get("sigma_z")
        return f"PrivITP β={params['beta']:g} σx={sx:g} σz={sx if sz is None else sz:g}"

    calibrated_params = ("sigma_x", "sigma_z")

    @classmethod
    def calibrate(cls, epsilon, n, params, *, r_max, sensitivity) -> dict:
        """σ_X = σ_Z with the worst case ``ε_max(n)`` at ``delta`` at most ``epsilon`` (relative σ tolerance
        1e-6; :func:`~privalign.accounting.expost.calibrate_privitp_sigma`)."""
        s = calibrate_privitp_sigma(
            epsilon,
            params.get("delta", 1e-6),
            n,
            beta=params["beta"],
            r_max=r_max,
            sensitivity=sensitivity,
            L=params.get("L", 3.0),
            rtol=1e-6,
        )
        return {"sigma_x": s, "sigma_z": s}

    def pick(self, candidates, *, rng) -> Selection:
        """Select from ``[pool A (n), pool B (n), fallback (1)]``; the index is into that list (``2n`` =
        serve the fallback candidate)."""
        return pick_from_pools(self, candidates, rng=rng)

    def worst_case_epsilon(self, n: int) -> float:
        return float(self.epsilon_max(int(n)))

    def __init__(
        self,
        beta: float,
        *,
        sigma_x: float,
        sigma_z: float,
        r_max: float = 1.0,
        L: float = 3.0,
        delta: float = 1e-6,
        sensitivity: float | None = None,
        clip: bool = False,
    ) -> None:
        beta = check_real(beta, "beta", low=0.0, closed="neither")
        sigma_x = check_real(sigma_x, "sigma_x", low=0.0, closed="neither")
        sigma_z = check_real(sigma_z, "sigma_z", low=0.0, closed="neither")
        r_max = check_real(r_max, "r_max", low=0.0, closed="neither")
        L = check_real(L, "L", low=0.0, closed="left")
        delta = check_probability(delta, "delta")
        sensitivity = (
            r_max
            if sensitivity is None
            else check_real(sensitivity, "sensitivity", low=0.0, closed="neither")
        )
        self.clip = bool(clip)
        # The accountant (frozen) is the single source of every public parameter: the mechanism reads
        # β, σ_X, σ_Z, R_max, L, δ, Δ from it, and they are read-only, so what is sampled and what is
        # accounted cannot drift apart (an accountant with its own width or noise split under-reports the
        # loss), and the cached ε_max cannot go stale.
        self._accountant = PrivITPAccountant(
            beta=beta,
            r_max=r_max,
            sensitivity=sensitivity,
            sigma_x=sigma_x,
            sigma_z=sigma_z,
            L=L,
            delta=delta,
        )

    accountant = property(
        lambda self: self._accountant, doc="The PrivITPAccountant built from this mechanism."
    )
    beta = property(lambda self: self._accountant.beta, doc="β (read-only).")
    sigma_x = property(lambda self: self._accountant.sigma_x, doc="Phase-1 noise std σ_X (read-only).")
    sigma_z = property(lambda self: self._accountant.sigma_z, doc="Phase-2 noise std σ_Z (read-only).")
    r_max = property(lambda self: self._accountant.r_max, doc="R_max (read-only).")
    L = property(lambda self: self._accountant.L, doc="Envelope widening L (read-only).")
    delta = property(lambda self: self._accountant.delta, doc="Phase-1 δ (read-only).")
    sensitivity = property(lambda self: self._accountant.sensitivity, doc="Δ_r (read-only).")

    @property
    def interval(self) -> tuple[float, float]:
        """The public clamp interval ``[λ_lo, λ_hi] = [−β, R_max − β]`` (range of λ̂ on [0, R_max])."""
        return -self.beta, self.r_max - self.beta

    def width(self, lam_tilde):
        """W = R_max + σ_Z·L − λ̃: the one width shared by mechanism and accountant (the narrower
        ``R_max − λ̃`` under-reports the acceptance ratio's loss)."""
        return self.accountant.width(lam_tilde)

    @functools.lru_cache(maxsize=64)  # noqa: B019 - instances are few and long-lived
    def epsilon_max(self, n: int) -> float:
        """The worst case ε1(δ) + sup ε2 for a phase-2 pool of ``n``.

        Raises:
          PrivacyParameterError: σ_X or σ_Z so small relative to Δ that the cost is not a finite number (no
            privacy event can record it); the message names the parameter.
        """
        try:
            e1 = self.accountant.epsilon1
        except PrivacyParameterError:  # σ_X / (Δ + 2τ) underflows to 0 (e.g. an astronomically large β)
            e1 = math.inf
        if not math.isfinite(e1):
            raise PrivacyParameterError(
                f"The 'sigma_x' parameter is too small for a finite privacy cost: phase 1's epsilon at "
                f"delta={self.delta:g} with sensitivity {self.sensitivity:g} exceeds 1e6. Got "
                f"{self.sigma_x!r} instead."
            )
        with np.errstate(all="ignore"):
            e = self.accountant.epsilon_max(n)
        if not math.isfinite(e):
            raise PrivacyParameterError(
                f"The 'sigma_z' parameter is too small for a finite privacy cost: phase 2's worst-case "
                f"epsilon for n={n} with sensitivity {self.sensitivity:g} is {e!r}. Got {self.sigma_z!r} "
                "instead."
            )
        return e

    def worst_case_event(self, n: int) -> ExPostEvent:
        """The data-independent worst case for a phase-2 pool of ``n``, available before any score."""
        e = self.epsilon_max(int(n))
        return ExPostEvent(
            epsilon_realized=e, epsilon_max=e, delta=self.delta, details={"n": int(n), "worst_case": True}
        )

    def _pools(self, scores, pool_b, batch: bool):
        f = scores_matrix if batch else scores_vector
        a = f(scores, "scores", r_max=self.r_max, clip=self.clip)
        b = f(require_pool_b(pool_b, "PrivITP"), "pool_b_scores", r_max=self.r_max, clip=self.clip)
        if batch and a.shape[0] != b.shape[0]:
            raise PrivacyParameterError(
                f"The 'pool_b_scores' parameter must have as many rows as 'scores' ({a.shape[0]}). Got "
                f"{b.shape[0]} instead."
            )
        return a, b

    def select(self, scores: ArrayLike, *, rng, pool_b_scores: ArrayLike | None = None) -> Selection:
        """Run PrivITP for one prompt. Validation happens before any noise is drawn.

        Returns:
          A :class:`Selection`; diagnostics hold the *released* ``lambda_tilde``, ``t``, ``M``, ``W``
          (never the clean λ̂).
        """
        a, b = self._pools(scores, pool_b_scores, batch=False)
        return self._run(a[None, :], b[None, :], rng)[0]

    def select_batch(
        self, scores: ArrayLike, *, rng, pool_b_scores: ArrayLike | None = None
    ) -> BatchSelection:
        """Vectorized PrivITP over rows (one prompt per row)."""
        a, b = self._pools(scores, pool_b_scores, batch=True)
        return self._run(a, b, rng)

    def _run(self, a: np.ndarray, b: np.ndarray, rng) -> BatchSelection:
        src = as_noise_source(rng)
        p, n = b.shape
        lo, hi = self.interval
        lam_hat = np.atleast_1d(solve_normalizer(a, self.beta))
        lam_t = np.clip(lam_hat + src.normal(self.sigma_x, p), lo, hi)
        idx, t, w = self.phase2(b, lam_t, src)
        eps_max = self.epsilon_max(n)
        e1 = self.accountant.epsilon1
        e2 = self.accountant.epsilon2(t, n, lam_t)
        realized = np.minimum(e1 + e2, eps_max)
        rho1 = self.accountant.rho1
        n_rows = p

        def make(i: int) -> ExPostEvent:
            return ExPostEvent(
                epsilon_realized=float(realized[i]),
                epsilon_max=eps_max,
                delta=self.delta,
                details={
                    "lambda_tilde": float(lam_t[i]),
                    "t": int(t[i]),
                    "n": n,
                    "epsilon1": e1,
                    "epsilon2": float(e2[i]),
                    "rho1": rho1,
                },
            )

        events = LazyEvents(make, n_rows)
        return BatchSelection(
            idx,
            events,
            self.worst_case_event(n),
            {"lambda_tilde": lam_t, "t": t, "M": w / self.beta, "W": w, "epsilon_realized": realized},
        )

    def phase2(
        self, pool_b: np.ndarray, lam_tilde: np.ndarray, rng
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Phase 2 given the released λ̃ (rows of ``pool_b``, one λ̃ per row): the threshold form
        ``r + Z > λ̃ + W·U``. Returns ``(indices, t, W)`` (t 1-based, -1 on fallback). Exposed so that the
        audit can condition on λ̃; :meth:`select` uses exactly this code."""
        src = as_noise_source(rng)
        p, n = pool_b.shape
        w = self.width(lam_tilde)
        z = _writable(src.normal(self.sigma_z, (p, n)))
        # r + Z > λ̃ + W·U on blocks of rows (~1 MB, in cache), in place. The uniforms are drawn block by
        # block after all the normals: the same draws, in the same order, as one (p, n) draw of each.
        any_acc = np.empty(p, dtype=bool)
        first = np.empty(p, dtype=np.int64)
        step = max(1, (1 << 17) // max(n, 1))
        for i in range(0, p, step):
            sl = slice(i, i + step)
            zb = z[sl]
            ub = _writable(src.uniform((zb.shape[0], n)))
            zb += pool_b[sl]
            ub *= w[sl, None]
            ub += lam_tilde[sl, None]
            acc = np.greater(zb, ub)
            any_acc[sl] = acc.any(axis=1)
            first[sl] = np.argmax(acc, axis=1)
        return np.where(any_acc, first, FALLBACK), np.where(any_acc, first + 1, -1), w

    def law(self, scores: ArrayLike, *, pool_b_scores: ArrayLike | None = None) -> SelectionLaw:
        """Exact law over pool B (closed form given λ̃, Gauss–Legendre over λ̃, point masses at the
        clamp ends); ``error_bound`` is the quadrature error estimate."""
        a, b = self._pools(scores, pool_b_scores, batch=False)
        p, fb, err = privitp_law(
            a, b, beta=self.beta, r_max=self.r_max, sigma_x=self.sigma_x, sigma_z=self.sigma_z, L=self.L
        )
        return SelectionLaw(p, fb, err)


def _writable(x) -> np.ndarray:
    """``x`` as a float64 array that may be modified in place (a copy only when it is read-only)."""
    x = np.asarray(x, dtype=np.float64)
    return x if x.flags.writeable else x.copy()
