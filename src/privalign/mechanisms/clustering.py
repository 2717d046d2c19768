"""DP-PCA (the Gaussian "Analyze Gauss" second moment) and DP k-means (noisy Lloyd iterations): the private
stages of DPPrefSyn before its per-cluster reward models (docs/privacy/dp_pca.md, docs/privacy/dp_kmeans.md).

Both take rows clipped to a public ℓ2 bound B and add Gaussian noise calibrated to their replace-one ℓ2
sensitivity; both expose the privacy event they cost, built from the parameters they sample with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from privalign._validation import check_int, check_probability, check_real
from privalign.accounting.events import GaussianEvent, PrivacyEvent, SelfComposedEvent
from privalign.mechanisms._common import check_epsilon, check_unit_relation
from privalign.mechanisms.additive import GaussianMechanism
from privalign.rng import as_noise_source

__all__ = ["DPKMeans", "DPPCA", "assign", "clip_rows", "kmeans_noise_multiplier"]


def clip_rows(X: Any, bound: float) -> np.ndarray:
    """Each row scaled to ℓ2 norm at most ``bound`` (``x · min(1, B/‖x‖)``): a per-record map, so the
    sensitivity analysis holds with ‖x‖ ≤ B whatever the data."""
    A = np.asarray(X, dtype=np.float64)
    if A.ndim != 2 or not np.isfinite(A).all():
        raise ValueError(f"X must be a finite 2-D array. Got shape {A.shape}.")
    norms = np.linalg.norm(A, axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(norms > bound, bound / np.where(norms > 0, norms, 1.0), 1.0)
    return A * scale


@dataclass(frozen=True)
class DPPCA:
    """The top-``n_components`` eigenvectors of the noisy second moment ``XᵀX + E`` (Analyze Gauss).

    Rows are clipped to ℓ2 norm ``row_bound`` B; ``E`` is symmetric with i.i.d. N(0, σ²) entries on and
    above the diagonal (mirrored below), σ from :meth:`GaussianMechanism.from_epsilon_delta` at ℓ2
    sensitivity Δ₂ = √2·B² of the upper triangle. The second moment is *uncentred* (no mean is released).

    Privacy:
      Unit: one row (``unit``, default ``"sample"``: one preference pair's embedding difference). Relation:
      replace-one. Sensitivity: replacing x by y changes XᵀX by yyᵀ − xxᵀ, whose Frobenius norm is
      √(‖x‖⁴ + ‖y‖⁴ − 2(xᵀy)²) ≤ √2·B²; the upper triangle's ℓ2 change is at most that. Guarantee:
      (ε, δ)-DP (the analytic Gaussian, Balle & Wang 2018, Thm. 8); the eigenvectors are post-processing.
      Event: ``GaussianEvent(σ/Δ₂)``.

    References:
      Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss: Optimal Bounds for Privacy-Preserving Principal
      Component Analysis", STOC 2014, Algorithm 1 (there with symmetric noise on the covariance).
    """

    n_components: int
    epsilon: float
    delta: float
    row_bound: float = 1.0
    unit: str = field(default="sample", kw_only=True)
    relation: str = field(default="replace_one", kw_only=True)

    def __post_init__(self) -> None:
        check_int(self.n_components, "n_components", low=1)
        check_epsilon(self.epsilon)
        check_probability(self.delta, "delta")
        check_real(self.row_bound, "row_bound", low=0.0, closed="neither")
        check_unit_relation(self.unit, self.relation)

    @property
    def sensitivity(self) -> float:
        return math.sqrt(2.0) * float(self.row_bound) ** 2

    @cached_property
    def gaussian(self) -> GaussianMechanism:
        return GaussianMechanism.from_epsilon_delta(
            self.epsilon, self.delta, self.sensitivity, unit=self.unit, relation=self.relation
        )

    @property
    def event(self) -> PrivacyEvent:
        return self.gaussian.event

    def noisy_second_moment(self, X: Any, *, rng: Any) -> np.ndarray:
        """``XᵀX + E`` on the clipped rows (the mechanism's release; symmetric)."""
        A = clip_rows(X, self.row_bound)
        d = A.shape[1]
        iu = np.triu_indices(d)
        M = A.T @ A
        noisy = self.gaussian(M[iu], rng=rng)
        out = np.zeros((d, d))
        out[iu] = noisy
        return out + np.triu(out, 1).T

    def fit(self, X: Any, *, rng: Any) -> np.ndarray:
        """The released components, ``(n_components, d)`` (rows orthonormal)."""
        S = self.noisy_second_moment(X, rng=rng)
        k = min(int(self.n_components), S.shape[0])
        w, V = np.linalg.eigh(S)
        return V[:, np.argsort(w)[::-1][:k]].T.copy()


def kmeans_noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """The smallest Gaussian noise multiplier (σ/Δ₂) whose ``releases``-fold self-composition is (ε, δ)-DP
    through zCDP (ρ = releases/(2ν²), ε = ρ + 2√(ρ·log(1/δ)); Bun & Steinke 2016, Prop. 1.3), rounded up."""
    eps = check_epsilon(epsilon)
    dlt = check_probability(delta, "delta")
    r = check_int(releases, "releases", low=1)
    L = math.log(1.0 / dlt)
    rho = (math.sqrt(L + eps) - math.sqrt(L)) ** 2  # the largest ρ with ρ + 2√(ρL) ≤ ε
    nu = math.sqrt(r / (2.0 * rho))
    while r / (2.0 * nu * nu) + 2.0 * math.sqrt(r / (2.0 * nu * nu) * L) > eps:
        nu = math.nextafter(nu, math.inf)
    return nu


@dataclass(frozen=True)
class DPKMeans:
    """Noisy Lloyd iterations on rows clipped to ℓ2 norm ``row_bound`` B, then noisy cluster sizes.

    From ``k`` initial centres drawn independently of the data (uniform on the sphere of radius B/2, from
    ``rng``), each of ``iterations`` rounds assigns every row to its nearest centre and releases
    ``(counts, sums) + N(0, σ²)`` (one Gaussian release of dimension k·(d + 1)); the new centres are the noisy
    sums over max(noisy counts, 1), projected into the ball of radius B (post-processing). A final release of
    the same form at the final centres gives the clusters' noisy sizes. σ = ν·Δ₂ with
    Δ₂ = max(√(2 + 2B²), 2B) (= 2 at B = 1; below).

    Privacy:
      Unit: one row (``unit``, default ``"sample"``). Relation: replace-one. Sensitivity of one release:
      replacing x (cluster a) by y (cluster b) changes counts by e_b − e_a and sums by y − x in the same
      cluster or by (−x, +y) in two clusters: ℓ2 change ≤ √(2 + ‖x‖² + ‖y‖²) ≤ √(2 + 2B²) if a ≠ b, and
      ≤ ‖y − x‖ ≤ 2B if a = b; Δ₂ = max(√(2 + 2B²), 2B). Guarantee: (ε, δ)-DP over the ``iterations + 1``
      adaptively composed Gaussian releases (zCDP: ρ = (T + 1)/(2ν²), converted by Bun & Steinke 2016,
      Prop. 1.3; :func:`kmeans_noise_multiplier`). Event: ``SelfComposedEvent(GaussianEvent(ν), T + 1)``.

    References:
      Blum, Dwork, McSherry & Nissim, "Practical Privacy: the SuLQ Framework", PODS 2005 (noisy Lloyd);
      Su et al., "Differentially Private k-Means Clustering", CODASPY 2016 (the iterated form).
    """

    n_clusters: int
    epsilon: float
    delta: float
    iterations: int = 5
    row_bound: float = 1.0
    unit: str = field(default="sample", kw_only=True)
    relation: str = field(default="replace_one", kw_only=True)

    def __post_init__(self) -> None:
        check_int(self.n_clusters, "n_clusters", low=1)
        check_epsilon(self.epsilon)
        check_probability(self.delta, "delta")
        check_int(self.iterations, "iterations", low=1)
        check_real(self.row_bound, "row_bound", low=0.0, closed="neither")
        check_unit_relation(self.unit, self.relation)

    @property
    def sensitivity(self) -> float:
        B = float(self.row_bound)
        return max(math.sqrt(2.0 + 2.0 * B * B), 2.0 * B)

    @cached_property
    def noise_multiplier(self) -> float:
        return kmeans_noise_multiplier(self.epsilon, self.delta, int(self.iterations) + 1)

    @property
    def sigma(self) -> float:
        return self.noise_multiplier * self.sensitivity

    @property
    def event(self) -> PrivacyEvent:
        g = GaussianEvent(noise_multiplier=self.noise_multiplier, unit=self.unit, relation=self.relation)
        return SelfComposedEvent(
            event=g, count=int(self.iterations) + 1, unit=self.unit, relation=self.relation
        )

    def noisy_statistics(self, X: Any, centers: np.ndarray, *, rng: Any) -> tuple[np.ndarray, np.ndarray]:
        """One release: ``(counts, sums)`` of the clipped rows by nearest centre, plus N(0, σ²) noise."""
        A = clip_rows(X, self.row_bound)
        k, d = centers.shape
        lab = assign(A, centers)
        counts = np.bincount(lab, minlength=k).astype(np.float64)
        sums = np.zeros((k, d))
        np.add.at(sums, lab, A)
        src = as_noise_source(rng)
        noise = np.asarray(src.normal(self.sigma, k * (d + 1))).reshape(k, d + 1)
        return counts + noise[:, 0], sums + noise[:, 1:]

    def fit(self, X: Any, *, rng: Any) -> dict[str, np.ndarray]:
        """``{"centers": (k, d), "sizes": (k,) noisy sizes at the final centres}`` (the released values)."""
        A = np.asarray(X, dtype=np.float64)
        k, d, B = int(self.n_clusters), A.shape[1], float(self.row_bound)
        src = as_noise_source(rng)
        z = np.asarray(src.normal(1.0, k * d)).reshape(k, d)  # data-independent initial centres
        centers = 0.5 * B * z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
        for _ in range(int(self.iterations)):
            counts, sums = self.noisy_statistics(A, centers, rng=rng)
            centers = sums / np.maximum(counts, 1.0)[:, None]
            centers = clip_rows(centers, B)
        counts, _ = self.noisy_statistics(A, centers, rng=rng)
        return {"centers": centers, "sizes": counts}


def assign(X: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Each row's nearest centre (ties to the lowest index)."""
    dist = ((X[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    return np.argmin(dist, axis=1)
