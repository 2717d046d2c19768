"""Bad input to every public accounting function: a named exception whose message names the parameter
and the offending value (style.md §7)."""

from __future__ import annotations

import math

import pytest

from privalign.accounting import (
    RDPAccountant,
    gaussian_delta,
    gaussian_epsilon,
    pure_to_zcdp,
    zcdp_to_approx_dp,
    zcdp_to_approx_dp_bun_steinke,
)
from privalign.accounting.conversions import approx_dp_to_zcdp, zcdp_to_approx_dp_cks
from privalign.errors import PrivacyParameterError

NAN = float("nan")

CASES = [
    (zcdp_to_approx_dp, (-0.1, 1e-5), "rho", "-0.1"),
    (zcdp_to_approx_dp, (NAN, 1e-5), "rho", "nan"),
    (zcdp_to_approx_dp, (1.0, 0.0), "delta", "0.0"),
    (zcdp_to_approx_dp, (1.0, 1.0), "delta", "1.0"),
    (zcdp_to_approx_dp_bun_steinke, (1.0, -1e-5), "delta", "-1e-05"),
    (zcdp_to_approx_dp_cks, (1.0, NAN), "delta", "nan"),
    (approx_dp_to_zcdp, (0.0, 1e-5), "epsilon", "0.0"),
    (gaussian_delta, (0.0, 1.0), "noise_multiplier", "0.0"),
    (gaussian_delta, (1.0, -1.0), "epsilon", "-1.0"),
    (gaussian_delta, (math.inf, 1.0), "noise_multiplier", "inf"),
    (gaussian_epsilon, (1.0, 2.0), "delta", "2.0"),
    (gaussian_epsilon, (-2.0, 1e-5), "noise_multiplier", "-2.0"),
    (pure_to_zcdp, (-1.0,), "epsilon", "-1.0"),
]


@pytest.mark.parametrize(
    ("fn", "args", "param", "value"), CASES, ids=[f"{c[0].__name__}-{c[2]}-{c[3]}" for c in CASES]
)
def test_bad_values(fn, args, param, value):
    with pytest.raises(PrivacyParameterError) as info:
        fn(*args)
    msg = str(info.value)
    assert f"'{param}'" in msg and value in msg


def test_bad_types():
    with pytest.raises(TypeError, match="'rho'"):
        zcdp_to_approx_dp("1", 1e-5)
    with pytest.raises(TypeError, match="'delta'"):
        gaussian_epsilon(1.0, None)


def test_rdp_accountant_bad_construction():
    with pytest.raises(PrivacyParameterError, match=r"'method'.*'moments'"):
        RDPAccountant("moments")
    with pytest.raises(PrivacyParameterError, match="'orders'"):
        RDPAccountant("rdp", orders=[0.5, 2.0])
    with pytest.raises(PrivacyParameterError, match=r"'value_discretization_interval'.*-1"):
        RDPAccountant("pld", value_discretization_interval=-1.0)


def test_edge_values():
    assert zcdp_to_approx_dp(0.0, 1e-5) == 0.0
    assert math.isinf(zcdp_to_approx_dp(math.inf, 1e-5))
    assert pure_to_zcdp(2.0) == 2.0
    assert gaussian_delta(1.0, 1000.0) >= 0.0
