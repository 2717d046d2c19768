"""Synthetic sparse BTL preference data with the ground truth (spec-reward-estimation.md §11–§12).

``x_i`` is drawn from a public design, ``θ*`` is ``s*``-sparse with ``‖θ*‖₂ = theta_norm`` on a uniformly
random support with random signs and equal magnitudes, and ``y_i ~ Bernoulli(σ(⟨x_i, θ*⟩))``.

Designs:
  * ``"uniform"``: ``x ~ Unif[−c, c]^d`` (``Σ = c²/3·I``), so ``‖x‖∞ ≤ c = feature_bound``.
  * ``"toeplitz"``: a Gaussian AR(1) design, ``Corr(x_j, x_k) = correlation^{|j−k|}``, marginal
    standard deviation ``feature_bound/3``, clipped (data-independently) into ``[−c, c]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privalign._validation import check_choice, check_int, check_real
from privalign.errors import PrivacyParameterError
from privalign.estimation.base import sigmoid
from privalign.estimation.preferences import PreferenceData
from privalign.rng import as_generator

__all__ = ["SyntheticBTL", "make_btl", "sparse_theta"]


@dataclass
class SyntheticBTL:
    """A synthetic problem: the data, the true parameter and its support."""

    data: PreferenceData
    theta_star: np.ndarray
    support: np.ndarray
    design: str
    feature_bound: float

    @property
    def X(self):  # noqa: D401 - shorthand
        return self.data.X

    @property
    def y(self) -> np.ndarray:
        return self.data.y

    def squared_error(self, theta: np.ndarray) -> float:
        """``‖θ − θ*‖₂²``."""
        return float(np.sum((np.asarray(theta, dtype=np.float64) - self.theta_star) ** 2))


def sparse_theta(d: int, s_star: int, theta_norm: float, rng: np.random.Generator) -> np.ndarray:
    """An ``s*``-sparse vector with ``‖θ‖₂ = theta_norm``: random support, random signs, equal magnitudes."""
    theta = np.zeros(d)
    support = np.sort(rng.choice(d, size=s_star, replace=False))
    theta[support] = rng.choice([-1.0, 1.0], size=s_star) * theta_norm / np.sqrt(s_star)
    return theta


def make_btl(
    n: int,
    d: int,
    s_star: int,
    *,
    theta_norm: float = 3.0,
    design: str = "uniform",
    correlation: float = 0.0,
    feature_bound: float = 1.0,
    dtype: type = np.float64,
    random_state: np.random.Generator | int | None = None,
    theta_star: np.ndarray | None = None,
) -> SyntheticBTL:
    """Draw ``n`` synthetic BTL comparisons in dimension ``d`` with an ``s*``-sparse truth.

    Args:
      n: number of comparisons.
      d: feature dimension.
      s_star: true sparsity, ``1 ≤ s* ≤ d``.
      theta_norm: ``‖θ*‖₂``.
      design: ``"uniform"`` or ``"toeplitz"`` (see the module docstring).
      correlation: AR(1) coefficient of the Toeplitz design, in [0, 1).
      feature_bound: the public coordinate bound ``c_x`` of the design.
      dtype: float64 or float32 feature matrix.
      random_state: seed.
      theta_star: use this truth instead of drawing one (e.g. the same θ* at several n).

    Returns:
      A :class:`SyntheticBTL`.
    """
    n = check_int(n, "n", low=1)
    d = check_int(d, "d", low=1)
    s_star = check_int(s_star, "s_star", low=1, high=d)
    theta_norm = check_real(theta_norm, "theta_norm", low=0.0, closed="left")
    design = check_choice(design, "design", ("uniform", "toeplitz"))
    correlation = check_real(correlation, "correlation", low=0.0, high=1.0, closed="left")
    feature_bound = check_real(feature_bound, "feature_bound", low=0.0)
    rng = as_generator(random_state)
    if theta_star is None:
        theta_star = sparse_theta(d, s_star, theta_norm, rng)
    else:
        theta_star = np.asarray(theta_star, dtype=np.float64)
        if theta_star.shape != (d,):
            raise PrivacyParameterError(
                f"The 'theta_star' parameter must have shape ({d},). Got {theta_star.shape}."
            )
    X: np.ndarray
    if design == "uniform":
        X = rng.uniform(-feature_bound, feature_bound, size=(n, d)).astype(dtype, copy=False)
    else:
        sd = feature_bound / 3.0
        X = np.empty((n, d), dtype=dtype)
        prev = rng.standard_normal(n)
        X[:, 0] = prev
        innov = np.sqrt(1.0 - correlation**2)
        for j in range(1, d):
            prev = correlation * prev + innov * rng.standard_normal(n)
            X[:, j] = prev
        X *= sd
        np.clip(X, -feature_bound, feature_bound, out=X)
    z = np.asarray(X @ theta_star.astype(X.dtype), dtype=np.float64)
    y = (rng.random(n) < sigmoid(z)).astype(np.float64)
    data = PreferenceData(X=X, y=y)
    return SyntheticBTL(
        data=data,
        theta_star=theta_star,
        support=np.flatnonzero(theta_star),
        design=design,
        feature_bound=feature_bound,
    )
