"""The user in preference data: contribution bounding and user-level label privacy for the estimators.

A person who labels many pairs is protected at user level only if (1) no user contributes more than K
pairs, by a rule that looks at nothing but that user's own pairs, and (2) the mechanism's cost is stated for
one user's K pairs together. :func:`bound_contributions` does (1): it keeps the first K pairs of each user,
in file order. The rows kept for a user are then a function of that user's own rows (and their relative
order) only: adding, removing or replacing every pair of another user changes nothing about them. Which
of a user's pairs come first is the file's order: bring the file in the order in which you would rather
keep pairs (e.g. oldest first), never in an order computed from other users' data.

:func:`user_level_label_fit` does (2) for the label-DP estimators (``rr``, ``rr-iht``): randomized response on
each label at ε/K (:class:`privalign.mechanisms.UserRandomizedResponse`), the debiased fit as usual, and the
estimator's event restated for the user (``SelfComposedEvent(..., count=K, unit="user")``).

:func:`user_groups` is what the sample-DP estimators read at user level (``DPSGDLinear`` and ``SampleDPIHT``
with ``max_pairs_per_user=K``, fitted with ``users=``): each row's user as an index, refusing data in which a
user holds more than K rows. DP-SGD then samples, sums and clips *users* (McMahan et al. 2018); Sample-DP IHT
puts each user's rows in one batch and scales Peeling's sensitivity by K (``docs/privacy/user_level.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from privalign._validation import check_int
from privalign.errors import DataFormatError

__all__ = [
    "bound_contributions",
    "check_users",
    "user_groups",
    "user_level_label_fit",
    "user_level_methods",
]


def user_level_methods() -> tuple[str, ...]:
    """The ``fit-reward`` methods (short spellings) that offer ``--privacy-unit user``: the registered
    estimators whose class declares ``user_level``."""
    from privalign.estimation.registry import estimator_class, names, short_name

    return tuple(short_name(n) for n in names() if estimator_class(n).user_level)


def check_users(users: Sequence[Any] | None, where: str, field: str = "user") -> list[str]:
    """Every record's user id as a string; refuses a missing, empty or non-scalar id (naming the first)."""
    if users is None:
        raise DataFormatError(
            f"{where}: the privacy unit 'user' needs a user id on every pair (field {field!r}); none was "
            "read."
        )
    out: list[str] = []
    for i, u in enumerate(users):
        if isinstance(u, bool) or not isinstance(u, str | int) or (isinstance(u, str) and not u.strip()):
            raise DataFormatError(
                f"{where}: pair {i + 1} has no usable user id in field {field!r} (got {u!r}); every pair "
                "must name its user under the privacy unit 'user'."
            )
        out.append(str(u))
    return out


def bound_contributions(users: Sequence[Any], max_per_user: int) -> np.ndarray:
    """Positions of the pairs kept when each user keeps at most ``max_per_user`` pairs: the first K of each
    user, in order (sorted positions).

    Which of a user's pairs are kept depends on that user's own pairs and their order only, never on another
    user's data; the positions shift when other users' rows are added or removed, the kept *pairs* do not.

    >>> bound_contributions(["a", "b", "a", "a", "b"], 2).tolist()
    [0, 1, 2, 4]
    """
    k = check_int(max_per_user, "max_per_user", low=1)
    seen: dict[Any, int] = {}
    keep: list[int] = []
    for i, u in enumerate(users):
        c = seen.get(u, 0)
        if c < k:
            keep.append(i)
        seen[u] = c + 1
    return np.asarray(keep, dtype=np.int64)


def user_groups(users: Any, n: int, max_per_user: Any) -> tuple[np.ndarray, int]:
    """Each of the ``n`` rows' user as an index ``0..U−1`` (in order of first appearance) and U, the number of
    users; refuses ``users`` of the wrong length and any user holding more than ``max_per_user`` = K rows (the
    per-user sensitivity of the sample-DP estimators rests on that bound: it is checked, never assumed).

    >>> codes, u = user_groups(["a", "b", "a"], 3, 2)
    >>> codes.tolist(), u
    ([0, 1, 0], 2)
    """
    from privalign.errors import PrivacyParameterError

    k = check_int(max_per_user, "max_pairs_per_user", low=1)
    if users is None:
        raise PrivacyParameterError(
            "The 'users' parameter is required when 'max_pairs_per_user' is set (user-level privacy): pass "
            "each row's user id to fit(X, y, users=...). Got None instead."
        )
    ids = np.asarray(users, dtype=object).ravel()
    if ids.shape != (n,):
        raise PrivacyParameterError(
            f"The 'users' parameter must name the user of each of the {n} rows. Got {ids.shape[0]} ids "
            "instead."
        )
    index: dict[Any, int] = {}
    codes = np.fromiter((index.setdefault(u, len(index)) for u in ids.tolist()), dtype=np.int64, count=n)
    counts = np.bincount(codes, minlength=len(index))
    if counts.size and int(counts.max()) > k:
        worst = int(np.argmax(counts))
        raise PrivacyParameterError(
            f"The 'users' parameter gives user {list(index)[worst]!r} {int(counts[worst])} rows, more than "
            f"max_pairs_per_user={k}: bound contributions first (bound_contributions). Got {k} as the bound."
        )
    return codes, len(index)


def user_level_label_fit(estimator: Any, X: Any, y: np.ndarray, *, epsilon: float, max_per_user: int) -> Any:
    """Fit a label-DP estimator (``RRIHT``, ``DenseRR``) so that each user's ≤ K labels are ε-DP together.

    The estimator runs randomized response at ε/K on every label (its own ``epsilon`` is set to ε/K) and
    debiases with that flip rate; its ``privacy_event_`` is then restated as the K-fold composition with unit
    ``"user"``. The caller must have bounded contributions to K per user (:func:`bound_contributions`).
    """
    from privalign.mechanisms.user_level import UserRandomizedResponse, user_level_event

    urr = UserRandomizedResponse(epsilon, max_contributions=max_per_user)
    estimator.set_params(epsilon=urr.per_label_epsilon)
    estimator.fit(X, y)
    estimator.privacy_event_ = user_level_event(estimator.privacy_event_, urr.max_contributions)
    return estimator
