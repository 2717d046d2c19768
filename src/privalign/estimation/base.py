"""Shared machinery of the reward estimators: input checks, the BTL loss, scikit-learn plumbing.

All estimators fit a linear Bradley–Terry–Luce reward ``r_θ(x) = ⟨x, θ⟩`` on comparison features
``x_i = φ(k_i, a_i¹) − φ(k_i, a_i⁰)`` with labels ``y_i ∈ {0, 1}`` (``y_i = 1``: ``a_i¹ ≻ a_i⁰``), so
``P(y = 1 | x) = σ(⟨x, θ*⟩)`` (spec-reward-estimation.md §1).

Feature matrices may be dense ``numpy`` arrays (float32 is kept as float32, so that a large design is
never copied) or ``scipy.sparse`` matrices (converted to CSR, never densified). The coefficient vector
``coef_`` is always a dense float64 vector of length ``d``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import NotFittedError as _SkNotFittedError

from privalign._validation import check_epsilon_range
from privalign.errors import PrivacyParameterError

__all__ = [
    "EstimatorParam",
    "RewardEstimator",
    "NotFittedError",
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
    """HT_s: keep the ``s`` largest entries of ``|v|`` exactly (ties broken by lowest index), zero the
    rest."""
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


class _NonNumericError(PrivacyParameterError, TypeError):
    """Non-numeric features: a ``PrivacyParameterError`` that is also a ``TypeError`` (as numpy raises)."""


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
        if np.iscomplexobj(X):
            raise PrivacyParameterError(
                f"The '{name}' parameter must be real (Complex data not supported). Got dtype {X.dtype} "
                "instead."
            )
        if X.dtype not in (np.float32, np.float64):
            try:
                X = X.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise _NonNumericError(
                    f"The '{name}' parameter must be a numeric matrix. Got dtype {X.dtype} instead ({exc})."
                ) from exc
        data = X
    if X.ndim != 2:
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a 2-D matrix (Reshape your data: one row per comparison). "
            f"Got shape {X.shape} instead."
        )
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise PrivacyParameterError(
            f"The '{name}' parameter must be non-empty. Got shape {X.shape} instead: {X.shape[0]} sample(s) "
            f"and {X.shape[1]} feature(s) (shape={X.shape}) while a minimum of 1 is required."
        )
    if not check_values:
        return X
    if data.size:
        # min/max propagate NaN and expose ±inf without allocating a temporary of the data's size.
        lo, hi = float(data.min()), float(data.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            bad = np.argwhere(~np.isfinite(data))[0]
            where = tuple(int(i) for i in bad)
            raise PrivacyParameterError(
                f"The '{name}' parameter must contain only finite values (no NaN or inf). Got "
                f"{data[tuple(bad)]!r} at {'data index' if _is_sparse(X) else 'index'} {where}."
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
                    f"{feature_bound:g}] (feature_bound); pass clip=True to clip it. Got a value {val!r} "
                    "instead."
                )
    return X


def check_labels(y: Any, n: int | None = None, name: str = "y") -> np.ndarray:
    """Validate preference labels: 1-D, values in {0, 1}, length ``n``; returns float64."""
    if y is None:
        raise PrivacyParameterError(
            f"The '{name}' parameter is required: this estimator requires y to be passed, but the target y "
            "is None."
        )
    arr = np.asarray(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        import warnings

        from sklearn.exceptions import DataConversionWarning

        warnings.warn(
            "A column-vector y was passed when a 1d array was expected; it is raveled "
            f"(the {name} parameter must be 1-D).",
            DataConversionWarning,
            stacklevel=3,
        )
        arr = arr.ravel()
    if arr.ndim != 1:
        raise PrivacyParameterError(
            f"The '{name}' parameter must be a 1-D array. Got shape {arr.shape} instead."
        )
    if n is not None and arr.shape[0] != n:
        raise PrivacyParameterError(
            f"The '{name}' parameter must have one label per row of X ({n}). Got {arr.shape[0]} labels "
            "instead."
        )
    if arr.dtype == bool:
        return arr.astype(np.float64)
    try:
        f = arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise PrivacyParameterError(
            f"The '{name}' parameter must contain labels in {{0, 1}}. Got dtype {arr.dtype}."
        ) from exc
    bad = ~((f == 0.0) | (f == 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        finite = np.isfinite(f)
        kind = (
            "Unknown label type: continuous. "
            if not (finite.all() and (f == np.round(f)).all())
            else "Only binary classification is supported. "
        )
        raise PrivacyParameterError(
            f"{kind}The '{name}' parameter must contain labels in {{0, 1}}. Got {arr[i]!r} at index {i} "
            "instead."
        )
    return f


def check_Xy(
    X: Any, y: Any, *, feature_bound: float | None = None, clip: bool = False, check_values: bool = True
) -> tuple[Matrix, np.ndarray]:
    """Validate ``(X, y)`` together (shapes first, so a length mismatch is reported as such); ``check_values``
    as in :func:`check_features`."""
    if not hasattr(X, "shape") or not hasattr(X, "dtype"):
        X = np.asarray(X)
    n = X.shape[0] if X.ndim >= 1 else 0
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
    """ε by the one rule (finite, in ``[EPS_MIN, EPS_MAX]``; ``_validation.check_epsilon_range``);
    ``inf`` means "no privacy noise" where the estimator allows it."""
    return check_epsilon_range(value, name, allow_inf=allow_inf)


class NotFittedError(PrivacyParameterError, _SkNotFittedError):
    """An estimator was used before ``fit``: scikit-learn's ``NotFittedError`` (so ``check_is_fitted`` and
    scikit-learn tools recognise it) and privalign's ``PrivacyParameterError`` (a ``ValueError``)."""


@dataclass(frozen=True)
class EstimatorParam:
    """A hyper-parameter an estimator class exposes to the experiments' configurations (a TOML key).

    Args:
      name: The constructor keyword.
      key: The configuration key; classes that share a key (``step_size`` of the IHT estimators) share its
        declaration (the registry checks that they agree).
      type: ``"int"`` or ``"float"`` (the configuration's type).
      default: The experiments' default (not necessarily the constructor's).
      help: What the key means, units included.
      low: The smallest allowed value.
      zero_means_default: ``0`` in a configuration means the constructor's own (data-dependent or
        noise-aware) default, passed as ``None``.
      at_most_n: The value is capped at the number of training pairs (a public quantity), e.g. DP-SGD's
        expected batch size.
    """

    name: str
    key: str
    type: str
    default: Any
    help: str
    low: float | None = None
    zero_means_default: bool = False
    at_most_n: bool = False

    def value(self, config: dict[str, Any], n_train: int | None = None) -> Any:
        """The constructor value of this parameter under ``config`` (a validated experiment configuration)."""
        v = config[self.key]
        if self.zero_means_default and not v:
            return None
        if self.at_most_n and n_train is not None:
            return min(v, n_train)
        return v


#: Shared declarations of the IHT estimators' and the ridge estimators' experiment parameters.
STEP_SIZE = EstimatorParam("step_size", "step_size", "float", 4.0, "IHT step size η", low=1e-12)
RADIUS = EstimatorParam("radius", "radius", "float", 5.0, "IHT ℓ2 radius B_θ", low=1e-12)
ALPHA = EstimatorParam(
    "alpha",
    "alpha",
    "float",
    1e-3,
    "ℓ2 regularisation of MLE / DenseRR (0: 0.1·d/n)",
    low=0.0,
    zero_means_default=True,
)


class RewardEstimator(ClassifierMixin, BaseEstimator):
    """scikit-learn base class of the reward estimators: parameters are ``__init__`` keyword arguments
    stored unchanged; ``fit`` validates them and sets attributes ending in ``_``.

    **Input convention for preference pairs** (works with ``clone``, ``GridSearchCV``,
    ``cross_val_score``, ``Pipeline``, ``check_is_fitted``): one row per comparison,
    ``X[i] = φ(k_i, a_i¹) − φ(k_i, a_i⁰)`` (the difference of the two responses' public features, dense or
    ``scipy.sparse``), ``y[i] = 1`` if ``a_i¹`` is preferred and ``0`` otherwise
    (:class:`~privalign.estimation.preferences.PreferenceData` builds both). The estimators are binary
    classifiers of the preference: ``predict`` returns the preferred side (``reward > 0``),
    ``predict_proba`` the BTL probabilities ``σ(⟨x, θ̂⟩)``, ``decision_function`` the reward difference
    and ``score`` the preference accuracy (ties count ½). ``predict_reward`` applied to rows ``φ(k, a)``
    gives rewards of single responses.

    Privacy caveat: a scikit-learn tool that looks at the data (a fitted scaler in a ``Pipeline``, the
    validation folds of ``GridSearchCV``) is not accounted; only data-independent transforms keep the
    estimator's guarantee. :class:`~privalign.estimation.tuning.PrivateGridSearch` is the accounted tuner.

    **What a subclass declares** (read by :mod:`privalign.estimation.registry`, which the CLI, the rates
    scans, the experiments and the reports ask instead of comparing names): ``name``, its one name in
    configurations, records and reports (the class name); ``aliases``, other accepted spellings (the CLI's
    ``dp-iht``...); ``privacy_kind``, what its event protects (``"label"``, ``"sample"`` or ``"none"``,
    checked against the fitted ``privacy_event_`` by a test); ``sparse`` (it keeps ``sparsity``
    coordinates); ``title``, the display title; ``step_param``, the constructor keyword a generic
    step-size option sets; ``params``, its experiment parameters (:class:`EstimatorParam`); ``user_level``,
    whether ``fit-reward --privacy-unit user`` offers it (label-DP: its ``epsilon`` is set to ε/K; sample-DP:
    it takes ``max_pairs_per_user`` and ``fit(X, y, users=...)``).
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    privacy_kind: ClassVar[str | None] = None
    sparse: ClassVar[bool] = False
    title: ClassVar[str] = ""
    step_param: ClassVar[str] = "step_size"
    params: ClassVar[tuple[EstimatorParam, ...]] = ()
    user_level: ClassVar[bool] = False

    coef_: np.ndarray

    def set_params(self, **params: Any) -> RewardEstimator:
        """Set constructor parameters (nested ``a__b`` names as scikit-learn); unknown names raise
        ``PrivacyParameterError`` (a ``ValueError``, as scikit-learn raises)."""
        valid = set(self.get_params(deep=True))
        for k in params:
            if k not in valid:
                raise PrivacyParameterError(
                    f"Invalid parameter {k!r} for estimator {type(self).__name__}; valid parameters: "
                    f"{sorted(self._get_param_names())}."
                )
        return super().set_params(**params)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.required = True
        tags.classifier_tags.multi_class = False
        tags.classifier_tags.poor_score = True  # private estimators are noisy by design
        tags.non_deterministic = True  # randomized mechanisms (seeded by random_state)
        return tags

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "coef_")

    def _check_is_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with appropriate "
                "arguments first."
            )

    @property
    def classes_(self) -> np.ndarray:
        """The labels, ``[0, 1]`` (0: the first response ``a⁰`` preferred; 1: the second ``a¹``)."""
        self._check_is_fitted()
        return np.array([0, 1])

    def decision_function(self, X: Any) -> np.ndarray:
        """The reward difference ``⟨x, θ̂⟩`` of each comparison (positive: ``a¹`` preferred)."""
        return self.predict_reward(X)

    def predict(self, X: Any) -> np.ndarray:
        """Predicted label per comparison: ``1`` where ``⟨x, θ̂⟩ > 0``, else ``0`` (int64)."""
        return (self.predict_reward(X) > 0).astype(np.int64)

    def predict_proba(self, X: Any) -> np.ndarray:
        """BTL probabilities ``[1 − σ(⟨x, θ̂⟩), σ(⟨x, θ̂⟩)]`` per comparison, shape ``(n, 2)``."""
        p = sigmoid(self.predict_reward(X))
        return np.column_stack([1.0 - p, p])

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
                f"The 'X' parameter must have {self.coef_.shape[0]} columns (the fitted dimension): X has "
                f"{X.shape[1]} features, but {type(self).__name__} is expecting {self.coef_.shape[0]} "
                "features as input."
            )
        return matvec(X, self.coef_)

    def score(self, X: Any, y: Any) -> float:
        """Held-out preference accuracy: the fraction of comparisons with ``(⟨x_i, θ̂⟩ > 0) == y_i``;
        ties ½."""
        yv = check_labels(y, None)
        r = self.predict_reward(X)
        if r.shape[0] != yv.shape[0]:
            raise PrivacyParameterError(
                f"The 'y' parameter must have one label per row of X ({r.shape[0]}). Got {yv.shape[0]} "
                "labels instead."
            )
        return preference_accuracy(r, yv)
