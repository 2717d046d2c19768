"""Privacy accounting: events, accountants, privacy filters. Pure, deterministic, no I/O, no RNG."""

from privalign.accounting.accountant import (
    Accountant,
    ApproxDPAccountant,
    PureDPAccountant,
    ZCDPAccountant,
)
from privalign.accounting.conversions import (
    gaussian_delta,
    gaussian_epsilon,
    pure_to_zcdp,
    zcdp_to_approx_dp,
    zcdp_to_approx_dp_bun_steinke,
)
from privalign.accounting.events import *  # noqa: F403
from privalign.accounting.events import __all__ as _events_all
from privalign.accounting.filters import (
    BudgetStore,
    ExPostFilter,
    InMemoryBudgetStore,
    PrivacyFilter,
    PureDPFilter,
    Reservation,
    ZCDPFilter,
)
from privalign.accounting.peeling import calibrate_peeling, peeling_epsilon
from privalign.accounting.rdp import RDPAccountant

__all__ = list(_events_all) + [
    "Accountant",
    "PureDPAccountant",
    "ZCDPAccountant",
    "ApproxDPAccountant",
    "RDPAccountant",
    "zcdp_to_approx_dp",
    "zcdp_to_approx_dp_bun_steinke",
    "gaussian_epsilon",
    "gaussian_delta",
    "pure_to_zcdp",
    "peeling_epsilon",
    "calibrate_peeling",
    "PrivacyFilter",
    "PureDPFilter",
    "ZCDPFilter",
    "ExPostFilter",
    "Reservation",
    "BudgetStore",
    "InMemoryBudgetStore",
]
