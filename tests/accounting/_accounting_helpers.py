"""Shared helpers for the accounting tests (unique module name: test dirs have no __init__.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from privalign.accounting import (
    ApproxDPAccountant,
    ApproxDPEvent,
    ExPostEvent,
    GaussianEvent,
    LaplaceEvent,
    NoisyArgmaxEvent,
    PeelingEvent,
    PoissonSampledEvent,
    PureDPAccountant,
    PureDPEvent,
    RandomizedResponseEvent,
    RDPAccountant,
    ZCDPAccountant,
    ZCDPEvent,
)

pos = st.floats(min_value=0.01, max_value=5.0, allow_nan=False, allow_infinity=False)
nms = st.floats(min_value=0.3, max_value=20.0, allow_nan=False, allow_infinity=False)
deltas = st.floats(min_value=1e-9, max_value=1e-2, allow_nan=False, allow_infinity=False)

# One strategy per event kind.
EVENT_STRATEGIES = {
    "pure_dp": st.builds(lambda e: PureDPEvent(epsilon=e), pos),
    "approx_dp": st.builds(lambda e, d: ApproxDPEvent(epsilon=e, delta=d), pos, deltas),
    "approx_dp_zero_delta": st.builds(lambda e: ApproxDPEvent(epsilon=e, delta=0.0), pos),
    "zcdp": st.builds(lambda r: ZCDPEvent(rho=r), pos),
    "ex_post": st.builds(
        lambda a, b, d: ExPostEvent(epsilon_realized=min(a, b), epsilon_max=max(a, b), delta=d),
        pos,
        pos,
        deltas,
    ),
    "ex_post_pure": st.builds(
        lambda a, b: ExPostEvent(epsilon_realized=min(a, b), epsilon_max=max(a, b)), pos, pos
    ),
    "noisy_argmax": st.builds(lambda e: NoisyArgmaxEvent(epsilon=e), pos),
    "gaussian": st.builds(lambda n: GaussianEvent(noise_multiplier=n), nms),
    "laplace": st.builds(lambda n: LaplaceEvent(noise_multiplier=n), nms),
    "randomized_response": st.builds(lambda e: RandomizedResponseEvent(epsilon=e), pos),
    "peeling": st.builds(lambda s, n: PeelingEvent(sparsity=s, noise_multiplier=n), st.integers(1, 6), nms),
    "poisson_gaussian": st.builds(
        lambda q, n: PoissonSampledEvent(
            sampling_probability=q, event=GaussianEvent(noise_multiplier=n), relation="add_remove_one"
        ),
        st.floats(min_value=0.001, max_value=1.0),
        st.floats(min_value=0.5, max_value=5.0),
    ),
}

# Which kinds each accountant supports (the contract says: every other kind fails closed).
SUPPORTED = {
    "pure": {
        "pure_dp",
        "approx_dp_zero_delta",
        "ex_post_pure",
        "noisy_argmax",
        "laplace",
        "randomized_response",
        "peeling",
    },
    "zcdp": {
        "pure_dp",
        "approx_dp_zero_delta",
        "ex_post_pure",
        "zcdp",
        "noisy_argmax",
        "gaussian",
        "laplace",
        "randomized_response",
        "peeling",
    },
    "approx": {
        "pure_dp",
        "approx_dp",
        "approx_dp_zero_delta",
        "ex_post",
        "ex_post_pure",
        "noisy_argmax",
        "laplace",
        "randomized_response",
        "peeling",
    },
    "rdp": {
        "pure_dp",
        "approx_dp_zero_delta",
        "ex_post_pure",
        "zcdp",
        "noisy_argmax",
        "gaussian",
        "laplace",
        "randomized_response",
        "peeling",
        "poisson_gaussian",
    },
    "pld": {
        "pure_dp",
        "approx_dp_zero_delta",
        "ex_post_pure",
        "noisy_argmax",
        "gaussian",
        "laplace",
        "randomized_response",
        "peeling",
        "poisson_gaussian",
    },
}

FACTORIES = {
    "pure": PureDPAccountant,
    "zcdp": ZCDPAccountant,
    "approx": ApproxDPAccountant,
    "rdp": lambda: RDPAccountant("rdp"),
    # Coarse discretisation keeps the PLD tests fast; still a pessimistic (upper) estimate.
    "pld": lambda: RDPAccountant("pld", value_discretization_interval=1e-2),
}


def readout(acc) -> tuple:
    """A fingerprint of an accountant's guarantees, compared for exact equality."""
    return (acc.get_epsilon(1e-5), acc.get_epsilon(1e-2), acc.get_delta(1.0), acc.get_delta(3.0))
