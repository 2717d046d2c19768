"""Audits of DPPrefSyn's private stages on worst-case neighbours, with their negative controls
(:mod:`privalign.mechanisms.clustering`; the house pattern of :mod:`privalign.audit.worst_case`).

* ``dp_pca``: one row ``(2B, 0)`` vs ``(0, 2B)`` (both clipped to norm B; d = 2). The statistic
  ``S₁₁ − S₂₂`` of the released noisy second moment is N(±B², 2σ²): a shift of exactly the upper triangle's
  sensitivity √2·B² in units of its noise, so the pair is tight. Broken ``no_clip``: the rows are not clipped
  (the guarantee's ‖x‖ ≤ B assumed of the features instead of enforced), so the shift is 4× larger.
* ``dp_kmeans``: one release (noisy counts and sums at the public centres ``(±1, 0)``) on one row ``(1, 0)``
  vs ``(−1, 0)`` (B = 1): the point changes cluster, the change is ``(1, −1 | 1, 0 | 1, 0)`` of norm 2 = Δ₂,
  and the statistic is the release projected on that direction. The claim audited is one release's (ε₁, δ)
  (the analytic Gaussian at the mechanism's ν; the T + 1 releases compose to the mechanism's ε by zCDP).
  Broken ``sensitivity_ignored``: σ calibrated to Δ = 1 (counts and sums treated as if a replacement moved
  one coordinate), half the noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from privalign._validation import check_choice
from privalign.audit.worst_case import AuditSetup
from privalign.mechanisms.clustering import DPPCA, DPKMeans, clip_rows

__all__ = ["BROKEN_CLUSTERING", "CLUSTERING_MECHANISMS", "clustering_setup", "single_release_epsilon"]

CLUSTERING_MECHANISMS = ("dp_pca", "dp_kmeans")
BROKEN_CLUSTERING: dict[str, tuple[str, ...]] = {
    "dp_pca": ("no_clip",),
    "dp_kmeans": ("sensitivity_ignored",),
}


@dataclass(frozen=True)
class _NoClipPCA:
    """DP-PCA without the row clipping. **Never use on data.**"""

    correct: DPPCA

    @property
    def event(self) -> Any:
        return self.correct.event

    def noisy_second_moment(self, X: Any, *, rng: Any) -> np.ndarray:
        A = np.asarray(X, float)  # BUG: rows not clipped to row_bound
        d = A.shape[1]
        iu = np.triu_indices(d)
        noisy = self.correct.gaussian((A.T @ A)[iu], rng=rng)
        out = np.zeros((d, d))
        out[iu] = noisy
        return out + np.triu(out, 1).T


@dataclass(frozen=True)
class _HalfSigmaKMeans:
    """DP k-means with σ calibrated to Δ = 1 instead of Δ₂. **Never use on data.**"""

    correct: DPKMeans

    @property
    def event(self) -> Any:
        return self.correct.event

    def noisy_statistics(self, X: Any, centers: np.ndarray, *, rng: np.random.Generator) -> tuple[Any, Any]:
        A = clip_rows(X, self.correct.row_bound)
        k, d = centers.shape
        lab = np.argmin(((A[:, None, :] - centers[None]) ** 2).sum(axis=2), axis=1)
        counts = np.bincount(lab, minlength=k).astype(float)
        sums = np.zeros((k, d))
        np.add.at(sums, lab, A)
        noise = rng.normal(0.0, self.correct.noise_multiplier * 1.0, (k, d + 1))  # BUG: Δ taken as 1
        return counts + noise[:, 0], sums + noise[:, 1:]


def single_release_epsilon(noise_multiplier: float, delta: float) -> float:
    """ε of one Gaussian release at ``noise_multiplier`` and ``delta`` (the analytic curve, bisection, rounded
    up)."""
    from privalign.accounting.calibration import bisect_monotone
    from privalign.accounting.conversions import gaussian_delta

    return float(
        bisect_monotone(
            lambda e: gaussian_delta(noise_multiplier, e) <= delta, 1e-9, 1.0, feasible="above", rtol=1e-9
        )
    )


def clustering_setup(
    mechanism: str,
    *,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    broken: str | None = None,
    iterations: int = 1,
) -> AuditSetup:
    """The audit of ``dp_pca`` or ``dp_kmeans`` on its worst-case pair (module docstring); ``broken`` picks a
    negative control that claims the correct mechanism's guarantee."""
    check_choice(mechanism, "mechanism", CLUSTERING_MECHANISMS)
    if broken is not None:
        check_choice(broken, "broken", BROKEN_CLUSTERING[mechanism])
    if mechanism == "dp_pca":
        good = DPPCA(1, epsilon, delta, row_bound=1.0)
        m: Any = _NoClipPCA(good) if broken else good
        sig = good.gaussian.sigma

        def pca_sampler(row: np.ndarray) -> Any:
            def draw(n: int) -> np.ndarray:
                return np.array(
                    [(lambda S: S[0, 0] - S[1, 1])(m.noisy_second_moment(row, rng=rng)) for _ in range(n)]
                )

            return draw

        # statistic N(+1, 2σ²) on D, N(−1, 2σ²) on D′: thresholds around the midpoint, in the tail of D′
        ts = tuple(-1.0 + c * np.sqrt(2.0) * sig for c in (1.0, 1.5, 2.0, 2.5))
        return AuditSetup(
            "dp_pca",
            "one row (2, 0) vs (0, 2), B = 1, d = 2",
            float(epsilon),
            float(delta),
            pca_sampler(np.array([[2.0, 0.0]])),
            pca_sampler(np.array([[0.0, 2.0]])),
            thresholds=ts,
            parameters={"epsilon": epsilon, "delta": delta, "sigma": sig, "sensitivity": good.sensitivity},
            broken=broken,
        )
    km = DPKMeans(2, epsilon, delta, iterations=iterations, row_bound=1.0)
    mk: Any = _HalfSigmaKMeans(km) if broken else km
    centers = np.array([[1.0, 0.0], [-1.0, 0.0]])
    u = np.array([1.0, -1.0, 1.0, 0.0, 1.0, 0.0]) / 2.0  # the unit direction of v_D − v_D′

    def km_sampler(row: np.ndarray) -> Any:
        def draw(n: int) -> np.ndarray:
            out = np.empty(n)
            for i in range(n):
                c, s = mk.noisy_statistics(row, centers, rng=rng)
                out[i] = np.concatenate([c, s.ravel()]) @ u
            return out

        return draw

    eps1 = single_release_epsilon(km.noise_multiplier, delta)
    sig = km.sigma
    # T = 1 on D, −1 on D′ (+ N(0, σ²)): thresholds in the upper tail
    ts = tuple(c * sig for c in (0.5, 1.0, 1.5, 2.0))
    return AuditSetup(
        "dp_kmeans",
        "one row (1, 0) vs (−1, 0) at centres (±1, 0), one release",
        eps1,
        float(delta),
        km_sampler(np.array([[1.0, 0.0]])),
        km_sampler(np.array([[-1.0, 0.0]])),
        thresholds=ts,
        parameters={
            "epsilon_mechanism": epsilon,
            "releases": iterations + 1,
            "noise_multiplier": km.noise_multiplier,
            "sigma": sig,
        },
        broken=broken,
    )
