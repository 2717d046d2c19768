"""Selector interface, events and bad input."""

import math

import numpy as np
import pytest

from privalign.accounting.events import ExPostEvent, NoisyArgmaxEvent, NonPrivateEvent
from privalign.alignment import FALLBACK, BestOfN, InferenceTimePessimism, PrivBoN, PrivITP
from privalign.errors import PrivacyParameterError

SELECTORS = [BestOfN(), InferenceTimePessimism(0.1), PrivBoN(1.0), PrivITP(0.1, sigma_x=0.5, sigma_z=0.5)]


@pytest.mark.parametrize("sel", SELECTORS, ids=lambda s: s.name)
@pytest.mark.parametrize(
    "bad,match", [([0.1, math.nan], "finite"), ([0.1, math.inf], "finite"), ([], "at least 1")]
)
def test_bad_scores_named(sel, bad, match, rng):
    with pytest.raises(PrivacyParameterError, match=match):
        sel.select(bad, rng=rng, pool_b_scores=[0.2, 0.3])


@pytest.mark.parametrize("sel", SELECTORS[1:], ids=lambda s: s.name)
def test_out_of_range_needs_clip(sel, rng):
    with pytest.raises(PrivacyParameterError, match="public range"):
        sel.select([0.2, 1.5], rng=rng, pool_b_scores=[0.2, 0.3])


@pytest.mark.parametrize("sel", SELECTORS[1:], ids=lambda s: s.name)
def test_out_of_range_message_does_not_quote_private_scores(sel, rng):
    """Regression (review): the error quoted the offending score and its index; scores are private and
    messages reach logs, CLI output and HTTP errors."""
    with pytest.raises(PrivacyParameterError) as exc:
        sel.select([0.2, 1.2345678], rng=rng, pool_b_scores=[0.2, 0.3])
    assert "1.2345678" not in str(exc.value) and "index" not in str(exc.value)
    with pytest.raises(PrivacyParameterError) as exc:
        sel.select_batch([[0.2, -0.7654321]], rng=rng, pool_b_scores=[[0.2, 0.3]])
    assert "0.7654321" not in str(exc.value) and "index" not in str(exc.value)


def test_clip_option(rng):
    s = PrivBoN(1.0, clip=True).select([-3.0, 1.5], rng=rng)
    assert s.index in (0, 1)
    out = PrivITP(0.1, sigma_x=0.5, sigma_z=0.5, clip=True).select([-1, 2], rng=rng, pool_b_scores=[3, -2])
    assert out.index in (FALLBACK, 0, 1)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(beta=0.0, sigma_x=1, sigma_z=1), "beta"),
        (dict(beta=0.1, sigma_x=0.0, sigma_z=1), "sigma_x"),
        (dict(beta=0.1, sigma_x=1, sigma_z=-1), "sigma_z"),
        (dict(beta=0.1, sigma_x=1, sigma_z=1, delta=0.0), "delta"),
        (dict(beta=0.1, sigma_x=1, sigma_z=1, L=-1), "'L'"),
    ],
)
def test_privitp_parameters(kwargs, name):
    with pytest.raises(PrivacyParameterError, match=name):
        PrivITP(**kwargs)


def test_other_parameters():
    with pytest.raises(PrivacyParameterError, match="beta"):
        InferenceTimePessimism(-1)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        PrivBoN(0.0)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        PrivBoN(math.nan)


@pytest.mark.parametrize("sel", SELECTORS[1:4:2], ids=lambda s: s.name)
def test_two_pool_methods_need_pool_b(sel, rng):
    with pytest.raises(PrivacyParameterError, match="pool_b_scores"):
        sel.select([0.1, 0.2], rng=rng)


def test_events_and_worst_case(rng):
    assert isinstance(BestOfN().select([0.1, 0.9]).event, NonPrivateEvent)
    ev = PrivBoN(2.0).select([0.1, 0.9], rng=rng).event
    assert isinstance(ev, NoisyArgmaxEvent) and ev.epsilon == 2.0
    m = PrivITP(0.1, sigma_x=2.0, sigma_z=0.5)
    wc = m.worst_case_event(8)  # before any score is seen
    for _ in range(50):
        s = m.select(rng.uniform(0, 1, 8), rng=rng, pool_b_scores=rng.uniform(0, 1, 8))
        assert isinstance(s.event, ExPostEvent)
        assert s.event.epsilon_realized <= wc.epsilon_max == s.event.epsilon_max
        assert s.event.delta == 1e-6
        lo, hi = m.interval
        assert lo <= s.diagnostics["lambda_tilde"] <= hi
        assert "lambda_hat" not in s.diagnostics  # the clean λ̂ is private
        d = s.event.details
        assert d["epsilon1"] == pytest.approx(m.accountant.epsilon1) and d["rho1"] == pytest.approx(0.125)
        if s.index == FALLBACK:
            assert d["t"] == -1 and d["epsilon2"] == pytest.approx(
                float(m.accountant.epsilon2(-1, 8, d["lambda_tilde"]))
            )


def test_sigma_reg_reports_smaller_epsilon():
    m = PrivBoN(4.0, sensitivity=1.0, sigma_reg=1.0)  # 2Δ/ε = 0.5 < σ_reg = 1
    assert m.scale == 1.0 and m.epsilon_effective == pytest.approx(2.0)
    assert m.event.epsilon == pytest.approx(2.0)
    m2 = PrivBoN(1.0, sensitivity=1.0, sigma_reg=0.1)  # privacy noise dominates
    assert m2.scale == 2.0 and m2.event.epsilon == 1.0


@pytest.mark.parametrize("sel", SELECTORS, ids=lambda s: s.name)
def test_batch_equals_single_with_same_seed(sel, seed):
    a = np.random.default_rng(seed + 1).uniform(0, 1, (1, 9))
    b = np.random.default_rng(seed + 2).uniform(0, 1, (1, 9))
    single = sel.select(a[0], rng=np.random.default_rng(seed), pool_b_scores=b[0])
    batch = sel.select_batch(a, rng=np.random.default_rng(seed), pool_b_scores=b)
    assert batch.indices[0] == single.index
    assert batch.events[0] == single.event


def test_same_seed_same_output_different_seed_differs():
    a, b = np.full((200, 6), 0.5), np.full((200, 6), 0.5)
    m = PrivITP(0.1, sigma_x=0.5, sigma_z=0.5)
    x = m.select_batch(a, rng=np.random.default_rng(1), pool_b_scores=b)
    y = m.select_batch(a, rng=np.random.default_rng(1), pool_b_scores=b)
    z = m.select_batch(a, rng=np.random.default_rng(2), pool_b_scores=b)
    assert np.array_equal(x.indices, y.indices) and not np.array_equal(x.indices, z.indices)


def test_secure_noise_source_runs():
    from privalign.rng import SecureNoise

    s = PrivITP(0.1, sigma_x=0.5, sigma_z=0.5).select([0.2, 0.8], rng=SecureNoise(), pool_b_scores=[0.9, 0.1])
    assert s.index in (FALLBACK, 0, 1)
    assert PrivBoN(1.0).select([0.2, 0.8], rng=SecureNoise()).index in (0, 1)


def test_privitp_parameters_are_read_only_and_shared_with_the_accountant():
    """Regression (review): σ_X, σ_Z, L, ... were plain attributes next to a separately built accountant,
    so changing one after construction made the mechanism sample with a σ the events did not account for
    and left the cached ε_max stale. They are now read-only views of the accountant."""
    m = PrivITP(0.1, sigma_x=0.5, sigma_z=0.7, L=2.0, delta=1e-5, sensitivity=0.5)
    acc = m.accountant
    assert (m.beta, m.sigma_x, m.sigma_z, m.L, m.delta, m.sensitivity, m.r_max) == (
        acc.beta,
        acc.sigma_x,
        acc.sigma_z,
        acc.L,
        acc.delta,
        acc.sensitivity,
        acc.r_max,
    )
    for name in ("beta", "sigma_x", "sigma_z", "L", "delta", "sensitivity", "r_max", "accountant"):
        with pytest.raises(AttributeError):
            setattr(m, name, 1.0)
