"""Shared machinery of the reward estimators: input checks, the BTL loss, scikit-learn plumbing.

All estimators fit a linear Bradley–Terry–Luce reward ``r_θ(x) = ⟨x, θ⟩`` on comparison features
``x_i = φ(k_i, a_i¹) − φ(k_i, a_i⁰)`` with labels ``y_i ∈ {0, 1}`` (``y_i = 1``: ``a_i¹ ≻ a_i⁰``), so
``P(y = 1 | x) = σ(⟨x, θ*⟩)`` (spec-reward-estimation.md §1).

Feature matrices may be dense ``numpy`` arrays (float32 is kept as float32, so that a large design is
never copied) or ``scipy.sparse`` matrices (converted to CSR, never densified). The coefficient vector
``coef_`` is always a dense float64 vector of length ``d``.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from privalign._validation import check_real
from privalign.errors import PrivacyParameterError

__all__ = [
    "RewardEstimator",
    "check_features",
    "check_labels",
    "check_Xy",
    "sigmoid",
    "hard_threshold",
    "project_l2",
    "preference_accuracy",
]

Matrix = Any  # np.ndarray | scipy.sparse.csr_matrix


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function σ(z) = 1/(1 + e^{−z}) (float64 out)."""
    z = np.asarray(z, dtype=np.float64)
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def softplus(z: np.ndarray) -> np.ndarray:
    """log(1 + e^z), stable."""
    return np.logaddexp(0.0, z)


def hard_threshold(v: np.ndarray, s: int) -> np.ndarray:
    """HT_s: keep the ``s`` largest entries of ``|v|`` exactly (ties broken by lowest index), zero the rest."""
    out = np.zeros_like(v)
    if s >= v.shape[0]:
        return v.copy()
    # Stable selection: sort by (-|v|, index) so ties are broken deterministically.
    idx = np.argpartition(-np.abs(v), s - 1)[:s]
    kth = np.abs(v[idx]).min()
    cand = np.flatnonzero(np.abs(v) >= kth)
    if cand.shape[0] > s:  # ties at the threshold: lexicographic (value desc, index asc)
        order = np.lexsort((cand, -np.abs(v[cand])))
        idx = cand[order[:s]]
    out[idx] = v[idx]
    return out


def project_l2(v: np.ndarray, radius: float) -> np.ndarray:
    """Project onto the ℓ2 ball of the given radius (``inf`` = no projection); keeps the support."""
    if math.isinf(radius):
        return v
    nrm = float(np.linalg.norm(v))
    if nrm > radius:
        return v * (radius / nrm)
    return v


def _is_sparse(X: Any) -> bool:
    return sp.issparse(X)


def check_features(
    X: Any,
    name: str = "X",
    *,
    feature_bound: float | None = None,
    clip: bool = False,
    check_values: bool = True,
) -> Matrix:
    """Validate a feature matrix: 2-D, non-empty, finite, and within the declared public bound.

    Dense float32/float64 arrays are returned without a copy (unless ``clip`` must change values);
    other dtypes become float64; sparse input becomes CSR (float64 unless float32).

    Args:
      X: ``(n, d)`` array-like or ``scipy.sparse`` matrix.
      name: Parameter name used in messages.
      feature_bound: The public coordinate bound ``c_x``: every entry must lie in ``[−c_x, c_x]``.
      clip: Clip entries into ``[−c_x, c_x]`` instead of raising (a data-independent map; the caller asked).
      check_values: ``False`` checks only type, shape and emptiness; the caller then owes the finiteness and
        bound check of every entry before anything computed from ``X`` is released (the IHT estimators
        fuse it into their first pass over each row: :func:`privalign.estimation.iht.fused_btl_gradient`).

    Returns:
      The validated matrix (a new one only if it had to be converted or clipped).

    Raises:
      PrivacyParameterError: wrong shape, empty, NaN/inf entries, or a bound violation without ``clip``.
    """
    if _is_sparse(X):
        X = X.tocsr()
        if X.dtype not in (np.float32, np.float64):
            X = X.astype(np.float64)
        data = X.data
    else:
        X = np.asarray(X)
        if X.dtype not in (np.float32, np.float64):
            try:
                X = X.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise PrivacyParameterError(
                    f"The '{name}' parameter must be a numeric matrix. Got dtype {X.dtype} instead."
                ) from exc
        data = X
    if X.ndim != 2:
        raise PrivacyParameterError(f"The '{name}' parameter must be a 2-D matrix. Got shape {X.shape} instead.")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise PrivacyParameterError(f"The '{name}' parameter must be non-empty. Got shape {X.shape} instead.")
    if not check_values:
        return X
    if data.size:
        # min/max propagate NaN and expose ±inf without allocating a temporary of the data's size.
        lo, hi = float(data.min()), float(data.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            bad = np.argwhere(~np.isfinite(data))[0]
            where = tuple(int(i) for i in bad)
            raise PrivacyParameterError(
                f"The '{name}' parameter must contain only finite values. Got {data[tuple(bad)]!r} at "
                f"{'data index' if _is_sparse(X) else 'index'} {where}."
            )
        if feature_bound is not None and (lo < -feature_bound or hi > feature_bound):
            if clip:
                if _is_sparse(X):
                    X = X.copy()
                    np.clip(X.data, -feature_bound, feature_bound, out=X.data)
                else:
                    X = np.clip(X, -feature_bound, feature_bound)
            else:
                val = lo if lo < -feature_bound else hi
                raise PrivacyParameterError(
                    f"The '{name}' parameter must lie in the declared public range [-{feature_bound:g}, "
                    f"{feature_bound:g}] (feature_bound); pass clip=True to clip it. Got a value {val!r} instead."
                )
    return X


def check_labels(y: Any, n: int | None = None, name: str = "y") -> np.ndarray:
    """Validate preference labels: 1-D, values in {0, 1}, length ``n``; returns float64."""
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise PrivacyParameterError(f"The '{name}' parameter must be a 1-D array. Got shape {arr.shape} instead.")
    if n is not None and arr.shape[0] != n:
        raise PrivacyParameterError(
            f"The '{name}' parameter must have one label per row of X ({n}). Got {arr.shape[0]} labels instead."
        )
    if arr.dtype == bool:
        return arr.astype(np.float64)
    try:
        f = arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise PrivacyParameterError(f"The '{name}' parameter must contain labels in {{0, 1}}. Got dtype {arr.dtype}.") from exc
    bad = ~((f == 0.0) | (f == 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise PrivacyParameterError(
            f"The '{name}' parameter must contain labels in {{0, 1}}. Got {arr[i]!r} at index {i} instead."
        )
    return f


def check_Xy(
    X: Any, y: Any, *, feature_bound: float | None = None, clip: bool = False, check_values: bool = True
) -> tuple[Matrix, np.ndarray]:
    """Validate ``(X, y)`` together (shapes first, so a length mismatch is reported as such); ``check_values``
    as in :func:`check_features`."""
    n = X.shape[0] if getattr(X, "shape", None) else len(X)
    yv = check_labels(y, None)
    if yv.shape[0] != n:
        raise PrivacyParameterError(
            f"The 'y' parameter must have one label per row of X ({n}). Got {yv.shape[0]} labels instead."
        )
    Xv = check_features(X, "X", feature_bound=feature_bound, clip=clip, check_values=check_values)
    return Xv, yv


def matvec(X: Matrix, theta: np.ndarray) -> np.ndarray:
    """``X @ θ`` in X's dtype (no upcast copy of a float32 X), returned as float64."""
    return np.asarray(X @ theta.astype(X.dtype, copy=False), dtype=np.float64).ravel()


def rmatvec(X: Matrix, r: np.ndarray) -> np.ndarray:
    """``Xᵀ r`` in X's dtype, returned as float64 (sparse-friendly)."""
    if _is_sparse(X):
        return np.asarray(X.T @ r.astype(X.dtype, copy=False), dtype=np.float64).ravel()
    return np.asarray(r.astype(X.dtype, copy=False) @ X, dtype=np.float64).ravel()


def btl_gradient(X: Matrix, targets: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Mean logistic/BTL gradient ``(1/m) Σ (σ(x_iᵀθ) − t_i)·x_i`` (targets may be debiased labels)."""
    z = matvec(X, theta)
    return rmatvec(X, sigmoid(z) - targets) / X.shape[0]


def preference_accuracy(rewards: np.ndarray, y: np.ndarray) -> float:
    """Fraction of pairs whose predicted preference (reward difference > 0) matches ``y``; ties count ½."""
    rewards = np.asarray(rewards, dtype=np.float64)
    pred = np.where(rewards > 0, 1.0, np.where(rewards < 0, 0.0, 0.5))
    agree = np.where(pred == 0.5, 0.5, (pred == y).astype(np.float64))
    return float(agree.mean())


def check_epsilon(value: Any, name: str = "epsilon", *, allow_inf: bool = True) -> float:
    """ε in (0, ∞]; ``inf`` means "no privacy noise" where the estimator allows it."""
    return check_real(value, name, low=0.0, closed="neither", allow_inf=allow_inf)


class RewardEstimator:
    """scikit-learn-style base class: parameters are ``__init__`` keyword arguments stored unchanged.

    Subclasses implement ``fit(X, y)`` (validate there, set attributes ending in ``_``, return ``self``).
    """

    coef_: np.ndarray

    @classmethod
    def _get_param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return sorted(p.name for p in sig.parameters.values() if p.name != "self" and p.kind != p.VAR_KEYWORD)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters (scikit-learn convention)."""
        return {k: getattr(self, k) for k in self._get_param_names()}

    def set_params(self, **params: Any) -> RewardEstimator:
        """Set constructor parameters; unknown names raise ``PrivacyParameterError``."""
        valid = set(self._get_param_names())
        for k, v in params.items():
            if k not in valid:
                raise PrivacyParameterError(
                    f"Invalid parameter {k!r} for estimator {type(self).__name__}; valid parameters: {sorted(valid)}."
                )
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _check_is_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise PrivacyParameterError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with appropriate arguments first."
            )

    def predict_reward(self, X: Any) -> np.ndarray:
        """Reward ``⟨x, θ̂⟩`` of each row of ``X`` (rows may be φ(k, a) or comparison differences).

        Args:
          X: ``(n, d)`` dense or sparse matrix with ``d = len(coef_)``.

        Returns:
          float64 array of shape ``(n,)``.

        Raises:
          PrivacyParameterError: not fitted, wrong width or non-finite input.
        """
        self._check_is_fitted()
        X = check_features(X, "X")
        if X.shape[1] != self.coef_.shape[0]:
            raise PrivacyParameterError(
                f"The 'X' parameter must have {self.coef_.shape[0]} columns (the fitted dimension). "
                f"Got {X.shape[1]} instead."
            )
        return matvec(X, self.coef_)

    def score(self, X: Any, y: Any) -> float:
        """Held-out preference accuracy: the fraction of comparisons with ``(⟨x_i, θ̂⟩ > 0) == y_i``; ties ½."""
        yv = check_labels(y, None)
        r = self.predict_reward(X)
        if r.shape[0] != yv.shape[0]:
            raise PrivacyParameterError(
                f"The 'y' parameter must have one label per row of X ({r.shape[0]}). Got {yv.shape[0]} labels instead."
            )
        return preference_accuracy(r, yv)
