"""Bad input: clear errors naming the parameter and the value; nothing written on failure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from privalign.errors import PrivacyParameterError
from privalign.estimation import IHT, MLE, RRIHT, DenseRR, DPSGDLinear, SampleDPIHT, make_btl, save_model
from privalign.estimation.preferences import PreferenceData

ALL = [
    lambda **k: IHT(sparsity=3, n_iter=3, **k),
    lambda **k: SampleDPIHT(epsilon=1.0, sparsity=3, n_iter=3, random_state=0, **k),
    lambda **k: RRIHT(epsilon=1.0, sparsity=3, n_iter=3, random_state=0, **k),
]
IDS = ["iht", "dp-iht", "rr-iht"]


@pytest.fixture(scope="module")
def small():
    p = make_btl(200, 20, 3, random_state=0)
    return np.asarray(p.X), p.y


@pytest.mark.parametrize("make", ALL, ids=IDS)
@pytest.mark.parametrize("bad,label", [(2.0, "2.0"), (-1.0, "-1.0"), (0.5, "0.5")])
def test_labels_outside_0_1(small, make, bad, label):
    X, y = small
    y = y.copy()
    y[7] = bad
    with pytest.raises(PrivacyParameterError, match=r"'y'.*\{0, 1\}.*index 7"):
        make().fit(X, y)


@pytest.mark.parametrize("make", ALL, ids=IDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features(small, make, bad):
    X, y = small
    X = X.copy()
    X[3, 4] = bad
    with pytest.raises(PrivacyParameterError, match=r"'X'.*finite.*\(3, 4\)"):
        make().fit(X, y)


def test_non_finite_sparse_features(small):
    X, y = small
    Xs = sp.csr_matrix(X)
    Xs.data[5] = np.nan
    with pytest.raises(PrivacyParameterError, match=r"'X'.*finite"):
        IHT(sparsity=3).fit(Xs, y)


@pytest.mark.parametrize("make", ALL, ids=IDS)
def test_mismatched_lengths(small, make):
    X, y = small
    with pytest.raises(PrivacyParameterError, match=r"'y'.*one label per row of X \(200\).*199"):
        make().fit(X, y[:-1])


@pytest.mark.parametrize("make", ALL, ids=IDS)
@pytest.mark.parametrize("s", [0, -2, 21])
def test_sparsity_out_of_range(small, make, s):
    X, y = small
    est = make().set_params(sparsity=s)
    with pytest.raises(PrivacyParameterError, match=rf"'sparsity'.*Got {s}"):
        est.fit(X, y)


@pytest.mark.parametrize("eps", [0.0, -1.0, math.nan])
@pytest.mark.parametrize(
    "make",
    [
        lambda e: SampleDPIHT(epsilon=e, sparsity=3),
        lambda e: RRIHT(epsilon=e, sparsity=3),
        lambda e: DenseRR(epsilon=e),
        lambda e: DPSGDLinear(epsilon=e),
    ],
    ids=["dp-iht", "rr-iht", "dense-rr", "dp-sgd"],
)
def test_invalid_epsilon(small, make, eps):
    X, y = small
    with pytest.raises(PrivacyParameterError, match=r"'epsilon'"):
        make(eps).fit(X, y)


@pytest.mark.parametrize("delta", [0.0, 1.0, 1.5, -1e-5])
@pytest.mark.parametrize("make", [lambda d: SampleDPIHT(delta=d, sparsity=3), lambda d: DPSGDLinear(delta=d)], ids=["dp-iht", "dp-sgd"])
def test_invalid_delta(small, make, delta):
    X, y = small
    with pytest.raises(PrivacyParameterError, match=r"'delta'"):
        make(delta).fit(X, y)


def test_epsilon_wrong_type(small):
    X, y = small
    with pytest.raises(TypeError, match=r"'epsilon'"):
        SampleDPIHT(epsilon="1", sparsity=3).fit(X, y)


@pytest.mark.parametrize("make", ALL, ids=IDS)
def test_feature_bound_violation_names_value_and_clip_is_opt_in(small, make):
    X, y = small
    X = X.copy()
    X[2, 1] = 1.75
    with pytest.raises(PrivacyParameterError, match=r"'X'.*\[-1, 1\].*feature_bound.*clip=True.*1.75"):
        make().fit(X, y)
    X_before = X.copy()
    est = make(clip=True).fit(X, y)
    assert np.array_equal(X, X_before)  # the caller's matrix is not modified
    assert np.isfinite(est.coef_).all()


def test_feature_bound_violation_sparse(small):
    X, y = small
    Xs = sp.csr_matrix(X * 3.0)
    with pytest.raises(PrivacyParameterError, match=r"feature_bound"):
        SampleDPIHT(sparsity=3).fit(Xs, y)
    SampleDPIHT(sparsity=3, clip=True, random_state=0).fit(Xs, y)


def test_dense_baselines_check_declared_bound(small):
    X, y = small
    with pytest.raises(PrivacyParameterError, match=r"feature_bound"):
        DPSGDLinear(feature_bound=0.5).fit(X, y)
    with pytest.raises(PrivacyParameterError, match=r"feature_bound"):
        MLE(feature_bound=0.5).fit(X, y)


def test_disjoint_batches_need_enough_samples():
    p = make_btl(5, 10, 2, random_state=0)
    with pytest.raises(PrivacyParameterError, match=r"'n_iter'.*n=5"):
        SampleDPIHT(sparsity=2, n_iter=6).fit(p.X, p.y)


def test_unfitted_and_wrong_width(small):
    X, y = small
    with pytest.raises(PrivacyParameterError, match="not fitted"):
        IHT().predict_reward(X)
    est = IHT(sparsity=3, n_iter=2).fit(X, y)
    with pytest.raises(PrivacyParameterError, match=r"20 columns"):
        est.predict_reward(X[:, :5])


def test_unknown_param():
    with pytest.raises(PrivacyParameterError, match="Invalid parameter 'epsilonn'"):
        SampleDPIHT().set_params(epsilonn=1.0)


def test_preference_data_validation():
    with pytest.raises(PrivacyParameterError, match=r"'y'.*index 1"):
        PreferenceData(X=np.zeros((3, 2)), y=[0, 3, 1])
    with pytest.raises(PrivacyParameterError, match=r"'prompt_ids'"):
        PreferenceData(X=np.zeros((3, 2)), y=[0, 1, 1], prompt_ids=[1, 2])


def test_failed_save_leaves_no_file(tmp_path, small):
    X, y = small
    est = SampleDPIHT(sparsity=3, n_iter=2, random_state=np.random.default_rng(0)).fit(X, y)
    target = tmp_path / "model.json"
    with pytest.raises(PrivacyParameterError, match="JSON"):
        save_model(est, target)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PrivacyParameterError, match="fitted"):
        save_model(SampleDPIHT(), target)
