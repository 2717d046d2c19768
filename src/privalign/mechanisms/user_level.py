"""User-level randomized response: every one of a person's (at most K) labels flipped at ε/K.

Preference data comes from people who each give many labels. A per-label ε protects one label; what a
person's labels *together* reveal is protected only at K·ε (basic composition). This module protects the
person: with at most ``max_contributions`` = K labels per user (enforced upstream by
:func:`privalign.estimation.users.bound_contributions`), each label goes through binary randomized response
at ε/K, so the K randomizations of one user's labels compose to ε (Dwork & Roth 2014, Thm 3.16), whatever
the other users hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privalign._validation import check_int
from privalign.accounting.events import (
    NonPrivateEvent,
    PrivacyEvent,
    SelfComposedEvent,
)
from privalign.mechanisms._common import check_epsilon
from privalign.mechanisms.randomized_response import RandomizedResponse
from privalign.rng import NoiseSource

__all__ = ["UserRandomizedResponse", "user_level_event"]


def user_level_event(per_label: PrivacyEvent, max_contributions: int) -> PrivacyEvent:
    """The event of running ``per_label`` independently on each of a user's at most K labels: K-fold
    composition, with unit ``"user"`` (relation ``replace_one``: one user's labels, all of them, change).
    ``count`` is K, so the release states K."""
    k = check_int(max_contributions, "max_contributions", low=1)
    if isinstance(per_label, NonPrivateEvent):
        return NonPrivateEvent(unit="user", relation="replace_one")
    return SelfComposedEvent(event=per_label, count=k, unit="user", relation="replace_one")


@dataclass(frozen=True, slots=True)
class UserRandomizedResponse:
    """Randomized response on each label at ε/K, so that a user's K labels are ε-DP together.

    Args:
      epsilon: the per-user ε in (0, inf]; ``inf`` flips nothing (no privacy).
      max_contributions: K ≥ 1, the most labels any one user contributes (bounded before this runs).

    Raises:
      PrivacyParameterError: ε ≤ 0 or NaN, or K < 1.

    Privacy:
      Unit: one user (all of their at most K labels). Relation: replace-one (any or all of one user's labels
      change; the pairs themselves are public, as for label-DP). Guarantee: ε-DP for the user: each of the
      user's labels is flipped independently with probability 1/(1+e^{ε/K}), each is (ε/K)-DP, and K
      independent (ε/K)-DP releases compose to ε (basic composition, Dwork & Roth 2014, Thm 3.16; tight here:
      flipping all K bits of a user moves the log-likelihood of "all K kept" by exactly K·ε/K = ε). Other
      users' labels are untouched by the user's change (each bit is randomized on its own). Event:
      ``SelfComposedEvent(RandomizedResponseEvent(ε/K), count=K, unit="user")``.

    References:
      Warner 1965 (randomized response); Dwork & Roth 2014, Thm 3.16 (composition) and §2.3 (group privacy);
      Ghazi et al., "Deep Learning with Label Differential Privacy", arXiv:2102.06062v2 (label-DP).

    Example:
      >>> import numpy as np
      >>> urr = UserRandomizedResponse(2.0, max_contributions=4)
      >>> urr.per_label_epsilon
      0.5
      >>> urr([0, 1, 1, 0], rng=np.random.default_rng(0)).shape
      (4,)
    """

    epsilon: float
    max_contributions: int = field(kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, allow_inf=True))
        object.__setattr__(
            self, "max_contributions", check_int(self.max_contributions, "max_contributions", low=1)
        )

    @property
    def per_label_epsilon(self) -> float:
        """ε/K, the ε of each label's randomized response."""
        return math.inf if math.isinf(self.epsilon) else self.epsilon / self.max_contributions

    @property
    def per_label(self) -> RandomizedResponse:
        """The randomized response that runs on each label (unit ``"label"``)."""
        return RandomizedResponse(self.per_label_epsilon, unit="label", relation="replace_one")

    @property
    def flip_probability(self) -> float:
        """1/(1+e^{ε/K}) (rounded up as :attr:`RandomizedResponse.flip_probability`)."""
        return float(self.per_label.flip_probability)

    @property
    def event(self) -> PrivacyEvent:
        return user_level_event(self.per_label.event, self.max_contributions)

    def __call__(self, bits: Any, *, rng: NoiseSource | np.random.Generator) -> np.ndarray:
        """The privatized labels (int64 0/1, same shape as ``bits``): every label flipped independently at
        ε/K. ``bits`` may hold many users' labels, provided no user holds more than K of them."""
        return self.per_label(bits, rng=rng)
