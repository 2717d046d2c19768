"""Mechanisms: validation, events built from the sampled parameters, shapes, equivalences."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from privalign.accounting.events import (
    GaussianEvent,
    LaplaceEvent,
    NoisyArgmaxEvent,
    NonPrivateEvent,
    PeelingEvent,
    RandomizedResponseEvent,
    SelfComposedEvent,
)
from privalign.accounting.peeling import calibrate_peeling, cwz_noise_multiplier, peeling_epsilon
from privalign.errors import PrivacyParameterError, PrivacyWarning
from privalign.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    NoisyArgmax,
    NoisyTopK,
    Peeling,
    RandomizedResponse,
)
from privalign.rng import SecureNoise, SeededNoise

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "make, param, value",
    [
        (lambda: NoisyArgmax(0.0, 1.0), "epsilon", "0.0"),
        (lambda: NoisyArgmax(-1.0, 1.0), "epsilon", "-1.0"),
        (lambda: NoisyArgmax(NAN, 1.0), "epsilon", "nan"),
        (lambda: NoisyArgmax(1.0, 0.0), "sensitivity", "0.0"),
        (lambda: NoisyArgmax(1.0, INF), "sensitivity", "inf"),
        (lambda: NoisyTopK(0, 1.0, 1.0), "k", "0"),
        (lambda: NoisyTopK(2, INF, 1.0), "epsilon", "inf"),
        (lambda: GaussianMechanism(0.0, 1.0), "sigma", "0.0"),
        (lambda: GaussianMechanism(NAN, 1.0), "sigma", "nan"),
        (lambda: GaussianMechanism.from_epsilon_delta(1.0, 0.0, 1.0), "delta", "0.0"),
        (lambda: GaussianMechanism.from_epsilon_delta(1.0, 1.0, 1.0), "delta", "1.0"),
        (lambda: LaplaceMechanism(-2.0, 1.0), "scale", "-2.0"),
        (lambda: LaplaceMechanism.from_epsilon(0.0, 1.0), "epsilon", "0.0"),
        (lambda: RandomizedResponse(0.0), "epsilon", "0.0"),
        (lambda: RandomizedResponse(NAN), "epsilon", "nan"),
        (lambda: Peeling(0, 1.0, 1e-5, 1.0), "sparsity", "0"),
        (lambda: Peeling(2, 1.0, 0.0, 1.0), "delta", "0.0"),
        (lambda: Peeling(2, 1.0, 1.5, 1.0), "delta", "1.5"),
        (lambda: Peeling(2, -1.0, 1e-5, 1.0), "epsilon", "-1.0"),
        (lambda: Peeling(2, 1.0, 1e-5, 1.0, "paper"), "scale", "paper"),
    ],
)
def test_invalid_parameters_are_refused_with_a_named_message(make, param, value):
    with pytest.raises(PrivacyParameterError) as exc:
        make()
    msg = str(exc.value)
    assert f"'{param}'" in msg and value in msg


@pytest.mark.parametrize(
    "call, param",
    [
        (lambda r: NoisyArgmax(1.0, 1.0)([], rng=r), "scores"),
        (lambda r: NoisyArgmax(1.0, 1.0)([1.0, NAN], rng=r), "scores"),
        (lambda r: NoisyArgmax(1.0, 1.0)([1.0, INF], rng=r), "scores"),
        (lambda r: NoisyArgmax(1.0, 1.0)(np.zeros((2, 0)), rng=r), "scores"),
        (lambda r: NoisyArgmax(1.0, 1.0)(np.zeros((2, 2, 2)), rng=r), "scores"),
        (lambda r: NoisyTopK(3, 1.0, 1.0)([1.0, 2.0], rng=r), "k"),
        (lambda r: Peeling(3, 1.0, 1e-5, 1.0)([1.0, 2.0], rng=r), "sparsity"),
        (lambda r: Peeling(1, 1.0, 1e-5, 1.0)([], rng=r), "v"),
        (lambda r: GaussianMechanism(1.0, 1.0)([NAN], rng=r), "values"),
        (lambda r: LaplaceMechanism(1.0, 1.0)([], rng=r), "values"),
        (lambda r: RandomizedResponse(1.0)([0, 2], rng=r), "bits"),
        (lambda r: RandomizedResponse(1.0)([], rng=r), "bits"),
    ],
)
def test_invalid_inputs_are_refused_at_call_time(call, param, rng):
    with pytest.raises(PrivacyParameterError, match=f"'{param}'"):
        call(rng)


def test_rng_must_be_a_generator_or_noise_source():
    with pytest.raises(TypeError, match="'rng'"):
        NoisyArgmax(1.0, 1.0)([1.0, 2.0], rng=42)


def test_mechanisms_are_frozen():
    m = NoisyArgmax(1.0, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.epsilon = 2.0  # type: ignore[misc]


def test_events_are_built_from_the_sampling_parameters():
    na = NoisyArgmax(0.5, 2.0)
    assert na.scale == pytest.approx(2 * 2.0 / 0.5)
    assert na.event == NoisyArgmaxEvent(epsilon=0.5)
    # The scale the event implies (2Δ/ε) is the one sampled with.
    assert 2 * na.sensitivity / na.event.epsilon == na.scale
    g = GaussianMechanism(3.0, 1.5)
    assert g.event == GaussianEvent(noise_multiplier=2.0) and g.rho == pytest.approx(1 / 8)
    assert GaussianMechanism.from_zcdp(0.125, 1.5).sigma == pytest.approx(3.0)
    lap = LaplaceMechanism.from_epsilon(0.25, 2.0)
    assert lap.scale == 8.0 and lap.event == LaplaceEvent(noise_multiplier=4.0)
    rr = RandomizedResponse(2.0)
    assert rr.event == RandomizedResponseEvent(epsilon=2.0, unit="label")
    assert rr.flip_probability == pytest.approx(rr.event.flip_probability)
    tk = NoisyTopK(3, 0.5, 1.0)
    assert tk.event == SelfComposedEvent(event=NoisyArgmaxEvent(epsilon=0.5), count=3)


def test_gaussian_from_epsilon_delta_is_calibrated_on_the_analytic_curve():
    from privalign.accounting.conversions import gaussian_delta

    g = GaussianMechanism.from_epsilon_delta(1.0, 1e-5, 2.0)
    assert gaussian_delta(g.noise_multiplier, 1.0) <= 1e-5
    assert gaussian_delta(g.noise_multiplier * (1 - 1e-6), 1.0) > 1e-5 * (1 - 1e-3)


def test_epsilon_inf_is_plain_argmax_and_non_private(rng):
    m = NoisyArgmax(INF, 1.0)
    assert m.scale == 0.0 and isinstance(m.event, NonPrivateEvent)
    scores = rng.random((50, 7))
    np.testing.assert_array_equal(m(scores, rng=rng), np.argmax(scores, axis=1))
    np.testing.assert_array_equal(m.probabilities([1.0, 3.0, 3.0]), [0.0, 1.0, 0.0])
    rr = RandomizedResponse(INF)
    assert rr.flip_probability == 0.0 and isinstance(rr.event, NonPrivateEvent)
    bits = rng.integers(0, 2, 100)
    np.testing.assert_array_equal(rr(bits, rng=rng), bits)


def test_probabilities_is_a_stable_softmax():
    m = NoisyArgmax(2.0, 1.0)  # scale 1
    p = m.probabilities([1000.0, 1000.0 + math.log(3.0)])
    np.testing.assert_allclose(p, [0.25, 0.75], rtol=1e-12)
    p2 = m.probabilities(np.array([[0.0, 0.0], [0.0, 1e4]]))
    np.testing.assert_allclose(p2, [[0.5, 0.5], [0.0, 1.0]], atol=1e-300)


def test_vectorized_noisy_argmax_equals_the_row_loop(seed):
    scores = np.random.default_rng(seed).random((20, 9))
    m = NoisyArgmax(1.0, 1.0)
    batch = m(scores, rng=np.random.default_rng(seed + 1))
    g = np.random.default_rng(seed + 1)
    loop = [m(row, rng=g) for row in scores]
    np.testing.assert_array_equal(batch, loop)
    assert batch.shape == (20,) and batch.dtype == np.int64
    assert isinstance(m(scores[0], rng=g), int)


def test_seeded_is_reproducible_and_generator_equals_seeded_noise(seed):
    scores = np.random.default_rng(seed).random((5, 4))
    m = NoisyArgmax(1.0, 1.0)
    a = m(scores, rng=np.random.default_rng(seed))
    b = m(scores, rng=SeededNoise(np.random.default_rng(seed)))
    np.testing.assert_array_equal(a, b)


def test_noisy_top_k_shapes_order_and_distinctness(rng):
    m = NoisyTopK(3, 1.0, 1.0)
    out = m(rng.random((40, 6)), rng=rng)
    assert out.shape == (40, 3)
    assert all(len(set(r)) == 3 for r in out.tolist())
    # With a negligible noise scale the order is the order of the scores.
    tiny = NoisyTopK(3, 700.0, 1.0)  # the largest ε allowed (EPS_MAX): a reorder has probability < e^-30
    np.testing.assert_array_equal(tiny([0.1, 0.5, 0.3, 0.9, 0.0], rng=rng), [3, 1, 2])
    sec = m([0.0, 1.0, 2.0, 3.0], rng=SecureNoise())
    assert sec.shape == (3,) and len(set(sec.tolist())) == 3


def test_additive_and_rr_shapes(rng):
    g = GaussianMechanism(1.0, 1.0)
    assert g(np.zeros((3, 4)), rng=rng).shape == (3, 4)
    assert g(0.0, rng=rng).shape == ()
    lap = LaplaceMechanism(1.0, 1.0)
    assert lap([1.0, 2.0], rng=SecureNoise()).shape == (2,)
    rr = RandomizedResponse(1.0)
    out = rr(np.array([[True, False], [False, True]]), rng=rng)
    assert out.shape == (2, 2) and set(np.unique(out)) <= {0, 1}


def test_peeling_scale_event_and_exactly_s_nonzeros(rng):
    s, eps, delta, lam = 4, 1.0, 1e-5, 0.01
    p = Peeling(s, eps, delta, lam)
    nm = calibrate_peeling(s, eps, delta)
    assert p.noise_scale == pytest.approx(nm * lam)
    e_acc, d_acc = peeling_epsilon(s, p.noise_multiplier, delta)
    assert e_acc <= eps and d_acc <= delta
    assert isinstance(p.event, PeelingEvent) and p.event.noise_multiplier == p.noise_multiplier
    assert p.event.sparsity == s
    cwz = Peeling(s, eps, delta, lam, scale="cwz")
    assert cwz.noise_scale == pytest.approx(lam * 2 * math.sqrt(3 * s * math.log(1 / delta)) / eps)
    assert cwz.noise_multiplier == pytest.approx(cwz_noise_multiplier(s, eps, delta))
    # The event of the paper's scale records the accounted cost, not the claimed (ε, δ).
    acc = peeling_epsilon(s, cwz.noise_multiplier, delta)
    assert cwz.event.target_epsilon == acc[0]
    v = rng.normal(size=(30, 12))
    out, support = p(v, rng=rng)
    assert out.shape == (30, 12) and support.shape == (30, s)
    assert np.all(np.count_nonzero(out, axis=1) == s)
    assert all(len(set(r)) == s for r in support.tolist())
    out1, sup1 = p(v[0], rng=rng)
    assert out1.shape == (12,) and np.count_nonzero(out1) == s and sup1.shape == (s,)


def test_peeling_without_noise_is_top_s_hard_thresholding(rng):
    v = rng.normal(size=(25, 10))
    p = Peeling(3, 1.0, 1e-5, 1.0)
    with pytest.warns(PrivacyWarning, match="not private"):
        out, support = p(v, rng=rng, noise=False)
    top = np.argsort(-np.abs(v), axis=1, kind="stable")[:, :3]
    expected = np.zeros_like(v)
    np.put_along_axis(expected, top, np.take_along_axis(v, top, axis=1), axis=1)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(support, top)


def test_secure_and_seeded_sources_work_for_every_mechanism(rng):
    sec = SecureNoise()
    assert isinstance(NoisyArgmax(1.0, 1.0)([0.0, 1.0, 2.0], rng=sec), int)
    assert NoisyArgmax(1.0, 1.0)(np.zeros((3, 4)), rng=sec).shape == (3,)
    out, sup = Peeling(2, 1.0, 1e-5, 1.0)(np.arange(6.0), rng=sec)
    assert np.count_nonzero(out) == 2 and sup.shape == (2,)
    assert RandomizedResponse(1.0)([0, 1], rng=sec).shape == (2,)


def test_seed_contract_same_seed_same_output_no_seed_differs(seed):
    m = NoisyArgmax(1.0, 1.0)
    scores = np.zeros((200, 50))
    a = m(scores, rng=SeededNoise(seed))
    b = m(scores, rng=SeededNoise(seed))
    np.testing.assert_array_equal(a, b)
    # Fresh OS-seeded generators (and the secure source) differ; equality of 200 uniform draws over 50
    # candidates has probability 50^-200.
    assert not np.array_equal(m(scores, rng=SeededNoise(None)), m(scores, rng=SeededNoise(None)))
    children = np.random.SeedSequence(seed).spawn(2)
    assert not np.array_equal(
        m(scores, rng=np.random.default_rng(children[0])), m(scores, rng=np.random.default_rng(children[1]))
    )
