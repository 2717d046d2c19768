"""DP-PCA and DP k-means (privalign.mechanisms.clustering): calibration, events, clipping and that they
learn on easy data (utility checks with fixed seeds; the privacy audits are in tests/audit)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privalign.accounting.accountant import ZCDPAccountant
from privalign.mechanisms.clustering import DPPCA, DPKMeans, assign, clip_rows, kmeans_noise_multiplier


def test_clip_rows_bounds_each_row_and_keeps_short_ones():
    X = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    C = clip_rows(X, 1.0)
    np.testing.assert_allclose(np.linalg.norm(C, axis=1), [1.0, 0.5, 0.0])
    np.testing.assert_allclose(C[1], X[1])


def test_dp_pca_sensitivity_event_and_symmetric_release():
    p = DPPCA(2, 1.0, 1e-5, row_bound=2.0)
    assert p.sensitivity == pytest.approx(math.sqrt(2) * 4)
    assert p.event.noise_multiplier == pytest.approx(p.gaussian.sigma / p.sensitivity, rel=1e-12)
    S = p.noisy_second_moment(np.ones((5, 3)), rng=np.random.default_rng(0))
    np.testing.assert_array_equal(S, S.T)


def test_dp_pca_recovers_the_dominant_direction_at_large_n():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20_000, 6)) * np.array([1.0, 0.1, 0.1, 0.1, 0.1, 0.1])
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    V = DPPCA(1, 1.0, 1e-5).fit(X, rng=rng)
    assert V.shape == (1, 6) and abs(V[0, 0]) > 0.99


def test_kmeans_noise_multiplier_composes_to_at_most_epsilon():
    for eps, delta, r in [(1.0, 1e-5, 6), (0.25, 1e-6, 3), (4.0, 1e-3, 11)]:
        nu = kmeans_noise_multiplier(eps, delta, r)
        km = DPKMeans(3, eps, delta, iterations=r - 1)
        assert km.noise_multiplier == nu
        got = ZCDPAccountant().compose(km.event).get_epsilon(delta)
        assert got <= eps and got > 0.5 * eps  # composed in the house accountant; not wastefully loose


def test_dp_kmeans_sensitivity_and_recovery():
    assert DPKMeans(2, 1.0, 1e-5).sensitivity == pytest.approx(2.0)
    assert DPKMeans(2, 1.0, 1e-5, row_bound=0.5).sensitivity == pytest.approx(math.sqrt(2.5))
    rng = np.random.default_rng(7)
    centres = np.array([[0.8, 0.0], [-0.8, 0.0], [0.0, 0.8]])
    X = np.concatenate([c + 0.05 * rng.normal(size=(3000, 2)) for c in centres])
    out = DPKMeans(3, 2.0, 1e-5, iterations=6).fit(X, rng=rng)
    assert out["centers"].shape == (3, 2) and out["sizes"].shape == (3,)
    # each true centre has a released centre nearby (the labels are permutation-free)
    d = np.linalg.norm(centres[:, None, :] - out["centers"][None], axis=2).min(axis=1)
    assert d.max() < 0.15, d
    lab = assign(X, out["centers"])
    assert len(set(lab.tolist())) == 3
