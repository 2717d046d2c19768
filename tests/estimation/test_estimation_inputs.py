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
@pytest.mark.parametrize(
    "make",
    [lambda d: SampleDPIHT(delta=d, sparsity=3), lambda d: DPSGDLinear(delta=d)],
    ids=["dp-iht", "dp-sgd"],
)
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
        save_model(est, target, metadata={"data": object()})  # not JSON-serialisable
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PrivacyParameterError, match="allow-list"):  # outside the release boundary
        save_model(est, target, metadata={"heldout_accuracy": 0.5})
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PrivacyParameterError, match="fitted"):
        save_model(SampleDPIHT(), target)


# ---- the fused dense pass: the bound/finiteness scan happens inside the IHT loop ------------------------
VARIANTS = [
    ("iht-full", lambda: IHT(sparsity=3, n_iter=4)),
    ("iht-disjoint-shuffled", lambda: IHT(sparsity=3, n_iter=4, variant="disjoint", random_state=0)),
    ("iht-disjoint-contiguous", lambda: IHT(sparsity=3, n_iter=4, variant="disjoint", shuffle=False)),
    ("dp-iht-shuffled", lambda: SampleDPIHT(epsilon=1.0, sparsity=3, n_iter=4, random_state=0)),
    (
        "dp-iht-contiguous",
        lambda: SampleDPIHT(epsilon=1.0, sparsity=3, n_iter=4, shuffle=False, random_state=0),
    ),
    ("dp-iht-full", lambda: SampleDPIHT(epsilon=1.0, sparsity=3, n_iter=4, variant="full", random_state=0)),
    ("rr-iht", lambda: RRIHT(epsilon=1.0, sparsity=3, n_iter=4, random_state=0)),
]


@pytest.mark.parametrize("make", [m for _, m in VARIANTS], ids=[i for i, _ in VARIANTS])
@pytest.mark.parametrize("row", [0, 117, 199])
@pytest.mark.parametrize("bad", [1.5, np.nan, -np.inf])
def test_deferred_check_catches_any_row_and_leaves_estimator_unfitted(small, make, row, bad):
    """Whatever batch the bad row falls in (first, middle or last one read), the fit raises the same
    error as the up-front check and sets no fitted attribute."""
    X, y = small
    X = X.astype(np.float32)
    X[row, 4] = bad
    est = make()
    expected = (
        rf"'X'.*finite.*\({row}, 4\)" if not np.isfinite(bad) else r"'X'.*\[-1, 1\].*feature_bound.*1.5"
    )
    with pytest.raises(PrivacyParameterError, match=expected):
        est.fit(X, y)
    assert not hasattr(est, "coef_") and not hasattr(est, "privacy_event_")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", ["all", "slice", "index"])
@pytest.mark.parametrize("chunk_bytes", [1, 1000, 2**21])
def test_fused_gradient_matches_two_pass_gradient(dtype, rows, chunk_bytes):
    from privalign.estimation.base import btl_gradient
    from privalign.estimation.iht import fused_btl_gradient

    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, size=(301, 37)).astype(dtype)
    t = rng.random(301)
    theta = rng.standard_normal(37)
    sel = {"all": None, "slice": slice(17, 250), "index": np.sort(rng.choice(301, 120, replace=False))}[rows]
    Xs, ts = (X, t) if sel is None else (X[sel], t[sel])
    g, ok = fused_btl_gradient(X, sel, ts, theta, bound=1.0, chunk_bytes=chunk_bytes)
    assert ok
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(g, btl_gradient(Xs, ts, theta), rtol=rtol, atol=rtol * 1e-2)
    X2 = X.copy()
    first = 0 if sel is None else (sel.start if isinstance(sel, slice) else int(sel[-1]))
    X2[first, 5] = 1.25
    assert fused_btl_gradient(X2, sel, ts, theta, bound=1.0, chunk_bytes=chunk_bytes)[1] is False
    assert fused_btl_gradient(X2, sel, ts, theta, bound=1.5, chunk_bytes=chunk_bytes)[1] is True


def test_fused_gradient_is_bit_identical_for_any_thread_count_and_restores_blas_threads():
    from threadpoolctl import threadpool_info

    from privalign.estimation.iht import fused_btl_gradient

    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, size=(2000, 64)).astype(np.float32)
    t = rng.random(2000)
    theta = np.zeros(64)
    theta[[3, 9]] = [0.5, -1.0]
    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    ref, ok = fused_btl_gradient(X, None, t, theta, bound=1.0, chunk_bytes=1024, threads=1)
    assert ok
    for k in (2, 3, 8):
        g, ok = fused_btl_gradient(X, None, t, theta, bound=1.0, chunk_bytes=1024, threads=k)
        assert ok and np.array_equal(g, ref)
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before
    with pytest.raises(PrivacyParameterError, match="'threads'"):
        fused_btl_gradient(X, None, t, theta, threads=0)
