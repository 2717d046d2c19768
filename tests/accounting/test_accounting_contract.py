"""One contract suite for every accountant and every filter (style.md §9, after dp_accounting's
``privacy_accountant_test.py``): empty ledger → 0, non-private → ∞, unsupported (nested) events fail
closed naming the sub-event, a failed compose/reserve leaves state and ledger unchanged."""

from __future__ import annotations

import math

import pytest
from _accounting_helpers import FACTORIES

from privalign.accounting import (
    ApproxDPEvent,
    ComposedEvent,
    ExPostFilter,
    GaussianEvent,
    LaplaceEvent,
    NoisyArgmaxEvent,
    NonPrivateEvent,
    PureDPFilter,
    SelfComposedEvent,
    ZCDPEvent,
    ZCDPFilter,
)
from privalign.errors import PrivacyParameterError, UnsupportedEventError

# An event each accountant must refuse, and one it must accept.
UNSUPPORTED = {
    "pure": GaussianEvent(noise_multiplier=1.0),
    "zcdp": ApproxDPEvent(epsilon=1.0, delta=1e-6),
    "approx": GaussianEvent(noise_multiplier=1.0),
    "rdp": ApproxDPEvent(epsilon=1.0, delta=1e-6),
    "pld": ZCDPEvent(rho=0.5),
}
SUPPORTED_EVENT = LaplaceEvent(noise_multiplier=2.0)


class AccountantContract:
    """Abstract contract; concrete classes set ``kind``."""

    kind: str

    def make(self):
        return FACTORIES[self.kind]()

    def test_empty_ledger_is_zero(self):
        acc = self.make()
        assert acc.ledger == ()
        assert acc.get_epsilon(1e-5) == 0.0
        assert acc.get_epsilon(0.0) == 0.0
        assert acc.get_delta(0.0) == 0.0

    def test_non_private_is_infinite(self):
        acc = self.make().compose(NonPrivateEvent())
        assert math.isinf(acc.get_epsilon(1e-5))
        assert acc.get_delta(10.0) == 1.0

    def test_count_zero_costs_nothing(self):
        acc = self.make().compose(SUPPORTED_EVENT, 0)
        assert acc.get_epsilon(1e-5) == 0.0
        assert acc.ledger == ((SUPPORTED_EVENT, 0),)

    @pytest.mark.parametrize("wrap", ["top", "composed", "self_composed_in_composed"])
    def test_unsupported_fails_closed_naming_sub_event(self, wrap):
        acc = self.make().compose(SUPPORTED_EVENT, 2)
        before = (acc.ledger, acc.get_epsilon(1e-5), acc.get_delta(1.0))
        bad = UNSUPPORTED[self.kind]
        if wrap == "top":
            event, where = bad, None
        elif wrap == "composed":
            event, where = ComposedEvent(events=[SUPPORTED_EVENT, bad]), "events[1]"
        else:
            event = ComposedEvent(events=[SUPPORTED_EVENT, SelfComposedEvent(event=bad, count=3)])
            where = "events[1].event"
        assert not acc.supports(event)
        with pytest.raises(UnsupportedEventError) as info:
            acc.compose(event)
        msg = str(info.value)
        assert repr(bad) in msg and bad.kind in msg
        if where:
            assert where in msg
        assert (acc.ledger, acc.get_epsilon(1e-5), acc.get_delta(1.0)) == before

    def test_bad_count_leaves_state_unchanged(self):
        acc = self.make().compose(SUPPORTED_EVENT)
        before = (acc.ledger, acc.get_epsilon(1e-5))
        with pytest.raises(PrivacyParameterError, match=r"'count'.*-1"):
            acc.compose(SUPPORTED_EVENT, -1)
        with pytest.raises(TypeError, match="'count'"):
            acc.compose(SUPPORTED_EVENT, 1.5)
        with pytest.raises(TypeError, match="'event'"):
            acc.compose({"kind": "laplace"})
        assert (acc.ledger, acc.get_epsilon(1e-5)) == before

    def test_unit_mismatch_refused(self):
        acc = self.make().compose(SUPPORTED_EVENT)
        before = acc.ledger
        with pytest.raises(UnsupportedEventError, match="unit='user'"):
            acc.compose(LaplaceEvent(noise_multiplier=2.0, unit="user"))
        assert acc.ledger == before

    def test_bad_query_arguments(self):
        acc = self.make().compose(SUPPORTED_EVENT)
        with pytest.raises(PrivacyParameterError, match=r"'delta'.*-0\.1"):
            acc.get_epsilon(-0.1)
        with pytest.raises(PrivacyParameterError, match=r"'delta'.*nan"):
            acc.get_epsilon(float("nan"))
        with pytest.raises(PrivacyParameterError, match=r"'epsilon'.*-1"):
            acc.get_delta(-1.0)

    def test_compose_is_monotone(self):
        acc = self.make().compose(SUPPORTED_EVENT)
        e1 = acc.get_epsilon(1e-5)
        acc.compose(SUPPORTED_EVENT)
        assert acc.get_epsilon(1e-5) >= e1 > 0


class TestPureDPAccountant(AccountantContract):
    kind = "pure"


class TestZCDPAccountant(AccountantContract):
    kind = "zcdp"


class TestApproxDPAccountant(AccountantContract):
    kind = "approx"


class TestRDPAccountantRDP(AccountantContract):
    kind = "rdp"


class TestRDPAccountantPLD(AccountantContract):
    kind = "pld"


# ------------------------------------------------------------------------------------------------
# Filters: the same contract in filter form.
# ------------------------------------------------------------------------------------------------

FILTERS = {
    "pure": (lambda: PureDPFilter(1.0), GaussianEvent(noise_multiplier=1.0), "epsilon"),
    "zcdp": (lambda: ZCDPFilter(0.5), ApproxDPEvent(epsilon=0.1, delta=1e-7), "rho"),
    "expost": (lambda: ExPostFilter(1.0, 1e-5), ApproxDPEvent(epsilon=0.1, delta=1e-7), "epsilon"),
}


class FilterContract:
    kind: str

    def make(self):
        return FILTERS[self.kind][0]()

    def test_empty_is_zero(self):
        f = self.make()
        name = FILTERS[self.kind][2]
        assert f.spent("alice")[name] == 0.0
        assert f.remaining("alice")[name] == f.budget[0]

    def test_non_private_is_refused(self):
        from privalign.errors import BudgetExhaustedError

        f = self.make()
        with pytest.raises(BudgetExhaustedError):
            f.reserve("alice", NonPrivateEvent())
        assert f.spent("alice") == self.make().spent("alice")

    @pytest.mark.parametrize("nested", [False, True])
    def test_unsupported_fails_closed(self, nested):
        f = self.make()
        r = f.reserve("alice", NoisyArgmaxEvent(epsilon=0.1))
        before = (f.spent("alice"), f.remaining("alice"))
        bad = FILTERS[self.kind][1]
        event = ComposedEvent(events=[NoisyArgmaxEvent(epsilon=0.01), bad]) if nested else bad
        with pytest.raises(UnsupportedEventError) as info:
            f.reserve("alice", event)
        assert repr(bad) in str(info.value)
        if nested:
            assert "events[1]" in str(info.value)
        with pytest.raises(UnsupportedEventError):
            f.settle(r, event)
        assert (f.spent("alice"), f.remaining("alice")) == before
        f.settle(r, NoisyArgmaxEvent(epsilon=0.1))  # the reservation is still open and settles fine


class TestPureDPFilterContract(FilterContract):
    kind = "pure"


class TestZCDPFilterContract(FilterContract):
    kind = "zcdp"


class TestExPostFilterContract(FilterContract):
    kind = "expost"
