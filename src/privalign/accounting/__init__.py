"""Privacy accounting: events, accountants, privacy filters. Pure, deterministic, no I/O, no RNG."""

from typing import TYPE_CHECKING

from privalign._lazy import lazy_exports
from privalign.accounting.events import *  # noqa: F403
from privalign.accounting.events import __all__ as _events_all

if TYPE_CHECKING:  # imported on first access (module __getattr__ below)
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

#: public name → the submodule defining it
_LAZY = {
    "Accountant": "accountant",
    "ApproxDPAccountant": "accountant",
    "PureDPAccountant": "accountant",
    "ZCDPAccountant": "accountant",
    "gaussian_delta": "conversions",
    "gaussian_epsilon": "conversions",
    "pure_to_zcdp": "conversions",
    "zcdp_to_approx_dp": "conversions",
    "zcdp_to_approx_dp_bun_steinke": "conversions",
    "BudgetStore": "filters",
    "ExPostFilter": "filters",
    "InMemoryBudgetStore": "filters",
    "PrivacyFilter": "filters",
    "PureDPFilter": "filters",
    "Reservation": "filters",
    "ZCDPFilter": "filters",
    "calibrate_peeling": "peeling",
    "peeling_epsilon": "peeling",
    "RDPAccountant": "rdp",
}

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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
