"""Count semantics (style.md §9): ``compose(e, k)`` ≡ ``compose(SelfComposedEvent(e, k))`` ≡ k single
composes, *exactly*, for every event kind each accountant supports; and every other kind is refused."""

from __future__ import annotations

import pytest
from _accounting_helpers import EVENT_STRATEGIES, FACTORIES, SUPPORTED, readout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privalign.accounting import (
    NoisyArgmaxEvent,
    PureDPAccountant,
    RandomizedResponseEvent,
    RDPAccountant,
    SelfComposedEvent,
    ZCDPAccountant,
)
from privalign.errors import UnsupportedEventError

CASES = [(acc, kind) for acc in FACTORIES for kind in sorted(SUPPORTED[acc])]


@pytest.mark.parametrize(("acc_kind", "event_kind"), CASES)
def test_count_semantics(acc_kind, event_kind):
    n = 4 if acc_kind == "pld" or event_kind == "poisson_gaussian" else (8 if acc_kind == "rdp" else 12)

    @settings(max_examples=n, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(event=EVENT_STRATEGIES[event_kind], k=st.integers(0, 5))
    def check(event, k):
        a = FACTORIES[acc_kind]().compose(event, k)
        b = FACTORIES[acc_kind]().compose(SelfComposedEvent(event=event, count=k))
        c = FACTORIES[acc_kind]()
        for _ in range(k):
            c.compose(event)
        assert readout(a) == readout(b) == readout(c)

    check()


@pytest.mark.parametrize("acc_kind", sorted(FACTORIES))
def test_unsupported_kinds_are_refused(acc_kind):
    """Every kind not declared supported fails closed (no silent zero cost)."""
    for kind in sorted(set(EVENT_STRATEGIES) - SUPPORTED[acc_kind]):
        event = _one(kind)
        acc = FACTORIES[acc_kind]()
        assert not acc.supports(event), (acc_kind, kind)
        with pytest.raises(UnsupportedEventError):
            acc.compose(event)
        assert acc.ledger == ()


def _one(kind):
    from privalign.accounting import (
        ApproxDPEvent,
        ExPostEvent,
        GaussianEvent,
        PoissonSampledEvent,
        ZCDPEvent,
    )

    return {
        "approx_dp": ApproxDPEvent(epsilon=1.0, delta=1e-6),
        "zcdp": ZCDPEvent(rho=0.1),
        "ex_post": ExPostEvent(epsilon_realized=0.1, epsilon_max=0.5, delta=1e-6),
        "gaussian": GaussianEvent(noise_multiplier=1.0),
        "poisson_gaussian": PoissonSampledEvent(
            sampling_probability=0.1, event=GaussianEvent(noise_multiplier=1.0), relation="add_remove_one"
        ),
    }[kind]


def test_k_randomized_response_events_cost_exactly_k_epsilon():
    acc = PureDPAccountant().compose(RandomizedResponseEvent(epsilon=0.75), 8)
    assert acc.get_epsilon() == 6.0


def test_rdp_honours_count_for_noisy_argmax():
    """The public RDP accountant that ignores ``count`` for exponential-mechanism events would give the
    same curve for 10 events as for 1; ours must scale (and equal ZCDPAccountant's ρ = 10·ε²/8 curve where
    the bounded-range bound is the smaller one)."""
    one = RDPAccountant("rdp").compose(NoisyArgmaxEvent(epsilon=0.1))
    ten = RDPAccountant("rdp").compose(NoisyArgmaxEvent(epsilon=0.1), 10)
    assert ten.get_epsilon(1e-6) > one.get_epsilon(1e-6) * 2.5
    rho = ZCDPAccountant().compose(NoisyArgmaxEvent(epsilon=0.1), 10).get_rho()
    orders = ten.orders
    small = orders < 100  # where α·ε²/8 < ε
    assert (abs(ten.get_rdp()[small] - rho * orders[small]) <= 1e-9 * rho * orders[small]).all()
