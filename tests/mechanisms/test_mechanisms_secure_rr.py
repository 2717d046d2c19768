"""Secure randomized response on OpenDP's exact Bernoulli sampler.

``SecureNoise.bernoulli(p)`` for a scalar p ≤ 1/2 (randomized response's flip probability) now draws with
OpenDP's ``make_randomized_response_bitvec`` (each bit set with probability exactly the float p) instead of
comparing a 53-bit uniform with p. Statistical checks state α and use exact critical values (binomial test,
Clopper–Pearson + Bonferroni in the audit); SecureNoise cannot be seeded, so each test runs once at its α.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from privalign.audit.audit import audit_mechanism
from privalign.audit.stats import assert_binomial
from privalign.errors import PrivacyParameterError
from privalign.mechanisms import RandomizedResponse
from privalign.rng import SecureNoise

pytestmark = pytest.mark.statistical

ALPHA = 1e-4


@pytest.mark.parametrize("p", [0.5, 0.3, 0.0625, 1.0 / (1.0 + math.e)])
def test_flip_mask_rate_is_p(p):
    n = 200_000
    mask = SecureNoise().flip_mask(p, n)
    assert mask.dtype == np.bool_ and mask.shape == (n,)
    assert_binomial(int(mask.sum()), n, p, ALPHA)


def test_flip_mask_shapes_and_bounds():
    src = SecureNoise()
    assert src.flip_mask(0.25, (3, 5)).shape == (3, 5)
    assert not src.flip_mask(0.0, 1000).any()
    assert src.flip_mask(0.25, 0).shape == (0,)
    for bad in (-0.1, 0.51, math.nan):
        with pytest.raises(PrivacyParameterError, match="'p' parameter of flip_mask"):
            src.flip_mask(bad, 4)


def test_randomized_response_uses_the_exact_sampler(monkeypatch):
    src, calls = SecureNoise(), []
    real = src.flip_mask
    monkeypatch.setattr(src, "flip_mask", lambda p, size: calls.append(p) or real(p, size))
    rr = RandomizedResponse(epsilon=1.3)
    out = rr(np.array([0, 1, 1, 0]), rng=src)
    assert calls == [rr.flip_probability] and set(np.unique(out)) <= {0, 1}


def _secure_rr(flip_probability: float, bit: int):
    src = SecureNoise()
    return lambda n: np.bitwise_xor(np.full(n, bit), src.flip_mask(flip_probability, n).astype(np.int64))


@pytest.mark.parametrize("eps", [1.0, 3.0])
def test_secure_randomized_response_audit_passes_and_catches_broken(eps):
    """Worst-case pair bit 0 vs bit 1 (the only one). The correct mechanism must pass (ε̂ ≤ ε, false-positive
    probability ≤ ALPHA); the negative control flips with 1/(1+e^{2ε}) while claiming ε and must be caught."""
    n = {1.0: 10_000, 3.0: 20_000}[eps]
    rr = RandomizedResponse(epsilon=eps)
    src = SecureNoise()
    good = audit_mechanism(
        lambda k: rr(np.zeros(k, dtype=np.int64), rng=src),
        lambda k: rr(np.ones(k, dtype=np.int64), rng=src),
        n,
        ALPHA,
        claimed_epsilon=eps,
        outcomes=(0, 1),
    )
    assert good.passed, good.to_dict()
    p_bad = 1.0 / (1.0 + math.exp(2 * eps))
    bad = audit_mechanism(
        _secure_rr(p_bad, 0), _secure_rr(p_bad, 1), n, ALPHA, claimed_epsilon=eps, outcomes=(0, 1)
    )
    assert not bad.passed, bad.to_dict()
