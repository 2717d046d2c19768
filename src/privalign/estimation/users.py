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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from privalign._validation import check_int
from privalign.errors import DataFormatError

__all__ = ["USER_LEVEL_METHODS", "bound_contributions", "check_users", "user_level_label_fit"]

#: ``fit-reward`` methods that offer ``--privacy-unit user`` (label-DP: randomized response at ε/K per label).
USER_LEVEL_METHODS = ("rr", "rr-iht")


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
