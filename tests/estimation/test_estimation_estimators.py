"""Estimator behaviour: recovery, equivalences, ε-monotonicity, sklearn rules, persistence."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from privalign.accounting.events import (
    NonPrivateEvent,
    ParallelComposedEvent,
    PeelingEvent,
    SelfComposedEvent,
)
from privalign.estimation import (
    IHT,
    MLE,
    RRIHT,
    DenseRR,
    DPSGDLinear,
    SampleDPIHT,
    load_model,
    make_btl,
    save_model,
)
from privalign.estimation.baselines import calibrate_dpsgd_noise, dpsgd_epsilon
from privalign.estimation.rates import make_estimator
from privalign.release import RELEASE_RULE


@pytest.fixture(scope="module")
def easy_problem():
    # d = 200, s* = 5, ‖θ*‖ = 3, n = 4000 uniform design: an easy, well-conditioned problem.
    return make_btl(4000, 200, 5, random_state=123)


def test_iht_recovers_support_on_easy_problem(easy_problem, seed):
    prob = make_btl(4000, 200, 5, random_state=seed)
    est = IHT(sparsity=5).fit(prob.X, prob.y)
    assert set(est.support_.tolist()) == set(prob.support.tolist())
    assert prob.squared_error(est.coef_) < 0.5  # ‖θ*‖² = 9
    assert isinstance(est.privacy_event_, NonPrivateEvent)


@pytest.mark.parametrize("variant", ["disjoint", "full"])
def test_sample_dp_iht_noise_off_equals_iht_exactly(easy_problem, variant):
    p = easy_problem
    a = SampleDPIHT(epsilon=math.inf, sparsity=5, n_iter=8, variant=variant, random_state=7).fit(p.X, p.y)
    b = IHT(sparsity=5, n_iter=8, variant=variant, random_state=7).fit(p.X, p.y)
    assert np.array_equal(a.coef_, b.coef_)
    assert isinstance(a.privacy_event_, NonPrivateEvent)


def test_rr_iht_at_infinite_epsilon_equals_iht(easy_problem):
    p = easy_problem
    a = RRIHT(epsilon=math.inf, sparsity=5, n_iter=30, random_state=3).fit(p.X, p.y)
    b = IHT(sparsity=5, n_iter=30).fit(p.X, p.y)
    assert np.array_equal(a.coef_, b.coef_)
    assert a.flip_probability_ == 0.0


def test_dense_rr_at_infinite_epsilon_equals_mle(easy_problem):
    p = easy_problem
    a = DenseRR(epsilon=math.inf, random_state=3).fit(p.X, p.y)
    b = MLE().fit(p.X, p.y)
    assert np.array_equal(a.coef_, b.coef_)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SampleDPIHT(epsilon=2.0, sparsity=5, random_state=11),
        lambda: SampleDPIHT(epsilon=2.0, sparsity=5, variant="full", n_iter=5, random_state=11),
        lambda: RRIHT(epsilon=1.0, sparsity=5, n_iter=20, random_state=11),
        lambda: DenseRR(epsilon=1.0, random_state=11),
        lambda: DPSGDLinear(epsilon=2.0, epochs=1, random_state=11),
    ],
    ids=["dp-iht", "dp-iht-full", "rr-iht", "dense-rr", "dp-sgd"],
)
def test_fit_twice_equals_fit_once(easy_problem, make):
    p = easy_problem
    est = make()
    first = est.fit(p.X, p.y).coef_.copy()
    second = est.fit(p.X, p.y).coef_
    assert np.array_equal(first, second)
    assert np.array_equal(first, make().fit(p.X, p.y).coef_)


def test_params_are_stored_unchanged_and_fit_returns_self(easy_problem):
    est = SampleDPIHT(epsilon=1.0, sparsity=5, random_state=None)
    assert est.get_params()["random_state"] is None
    assert est.fit(easy_problem.X, easy_problem.y) is est
    assert est.get_params()["random_state"] is None
    assert est.epsilon == 1.0


# α for the ε-monotonicity tests: one-sided exact Mann–Whitney U test per estimator, K = 6 seeds per ε,
# Bonferroni over the 4 private estimators: each at α/4 = 2.5e-3 (complete separation gives p = 1/924).
ALPHA_MONO = 0.01


@pytest.mark.statistical
@pytest.mark.parametrize("method", ["dp-iht", "rr-iht", "rr", "dp-sgd"])
def test_private_error_decreases_as_epsilon_grows(method):
    """One-sided exact Mann–Whitney U test that the error at ε = 8 is stochastically smaller than at
    ε = 0.5 (K = 6 paired-seed problems each), at level α/4. The test fails only if p > α/4; under the
    expected behaviour (complete separation) p = 1/924."""
    ss = np.random.SeedSequence(2024)
    errs = {0.5: [], 8.0: []}
    for child in ss.spawn(6):
        ds, es = child.spawn(2)
        prob = make_btl(3000, 100, 4, random_state=np.random.default_rng(ds))
        for eps in errs:
            est = make_estimator(method, epsilon=eps, sparsity=4, random_state=np.random.default_rng(es))
            errs[eps].append(prob.squared_error(est.fit(prob.X, prob.y).coef_))
    res = stats.mannwhitneyu(errs[8.0], errs[0.5], alternative="less", method="exact")
    assert res.pvalue <= ALPHA_MONO / 4, (
        f"{method}: errors at ε=8 {errs[8.0]} vs ε=0.5 {errs[0.5]} (p={res.pvalue:.4g})"
    )


def test_sample_dp_iht_event_and_accounted_cost(easy_problem):
    from privalign.accounting.accountant import ApproxDPAccountant
    from privalign.accounting.peeling import peeling_epsilon

    eps, delta = 2.0, 1e-6
    est = SampleDPIHT(epsilon=eps, delta=delta, sparsity=5, n_iter=6, random_state=0).fit(
        easy_problem.X, easy_problem.y
    )
    ev = est.privacy_event_
    assert isinstance(ev, ParallelComposedEvent) and ev.unit == "sample" and ev.relation == "replace_one"
    assert len(ev.events) == 6 and all(isinstance(e, PeelingEvent) for e in ev.events)
    for e in ev.events:
        e_acc, d_acc = peeling_epsilon(e.sparsity, e.noise_multiplier, delta)
        assert e_acc <= eps and d_acc <= delta
    acc = ApproxDPAccountant().compose(ev)
    assert acc.get_epsilon(delta) <= eps
    assert json.loads(json.dumps(ev.to_dict()))["kind"] == "parallel_composed"


def test_label_dp_events_name_the_label_unit(easy_problem):
    for est in (
        RRIHT(epsilon=1.0, sparsity=5, n_iter=5, random_state=0),
        DenseRR(epsilon=1.0, random_state=0),
    ):
        ev = est.fit(easy_problem.X, easy_problem.y).privacy_event_
        assert ev.kind == "randomized_response" and ev.unit == "label" and ev.relation == "replace_one"
        assert ev.epsilon == 1.0


def test_dpsgd_event_and_calibration_does_not_overshoot(easy_problem):
    est = DPSGDLinear(epsilon=2.0, delta=1e-5, batch_size=200, epochs=2, random_state=0).fit(
        easy_problem.X, easy_problem.y
    )
    ev = est.privacy_event_
    assert isinstance(ev, SelfComposedEvent) and ev.unit == "sample" and ev.relation == "replace_one"
    assert ev.count == est.steps_ == 40
    assert ev.event.kind == "poisson_sampled" and ev.event.sampling_probability == pytest.approx(0.05)
    assert ev.event.event.noise_multiplier == est.noise_multiplier_
    # No overshoot: the calibrated noise meets the target; 1% less noise does not (tightness).
    assert dpsgd_epsilon(est.noise_multiplier_, 0.05, 40, 1e-5) <= 2.0
    assert dpsgd_epsilon(est.noise_multiplier_ * 0.99, 0.05, 40, 1e-5) > 2.0


def test_dpsgd_rdp_calibration_does_not_overshoot():
    nm = calibrate_dpsgd_noise(1.0, 1e-5, 0.01, 200, accountant="rdp")
    assert dpsgd_epsilon(nm, 0.01, 200, 1e-5, accountant="rdp") <= 1.0
    # Replace-one via group privacy costs more than the PLD replace-one accounting.
    assert calibrate_dpsgd_noise(1.0, 1e-5, 0.01, 200, accountant="pld") <= nm


@pytest.mark.parametrize(
    "make",
    [
        lambda: IHT(sparsity=5, n_iter=5),
        lambda: SampleDPIHT(epsilon=1.0, sparsity=5, random_state=1),
        lambda: RRIHT(epsilon=1.0, sparsity=5, n_iter=5, random_state=1, refit=True),
        lambda: MLE(),
        lambda: DenseRR(epsilon=math.inf),
        lambda: DPSGDLinear(epsilon=1.0, epochs=1, random_state=1),
    ],
    ids=["iht", "dp-iht", "rr-iht", "mle", "dense-rr", "dp-sgd"],
)
def test_save_load_round_trip_is_lossless(tmp_path, easy_problem, make):
    p = easy_problem
    est = make().fit(p.X, p.y)
    cfg = {
        "kind": "hashed_ngram",
        "n_features": 200,
        "ngram_range": [1, 1],
        "lowercase": True,
        "use_prompt": False,
    }
    path = save_model(est, tmp_path / "m.json", feature_config=cfg, metadata={"data": "test"})
    back, fcfg, meta = load_model(path)
    assert type(back) is type(est)
    # every parameter round-trips except the seed of the privacy noise, which a release never holds
    want = est.get_params()
    if "random_state" in want:
        want["random_state"] = None
    assert back.get_params() == want
    assert np.array_equal(back.coef_, est.coef_) and back.coef_.dtype == np.float64
    assert back.privacy_event_ == est.privacy_event_
    assert fcfg == cfg and meta == {"data": "test", "release": RELEASE_RULE}
    assert np.array_equal(back.predict_reward(p.X[:50]), est.predict_reward(p.X[:50]))


def test_rr_iht_refit_uses_only_the_support(easy_problem):
    p = easy_problem
    est = RRIHT(epsilon=2.0, sparsity=5, n_iter=20, refit=True, random_state=0).fit(p.X, p.y)
    assert np.count_nonzero(est.coef_) <= 5
    assert np.linalg.norm(est.coef_) <= est.radius + 1e-12


def test_contiguous_batches_noise_off_equals_iht(easy_problem):
    p = easy_problem
    a = SampleDPIHT(epsilon=math.inf, sparsity=5, n_iter=8, shuffle=False).fit(p.X, p.y)
    b = IHT(sparsity=5, n_iter=8, variant="disjoint", shuffle=False).fit(p.X, p.y)
    assert np.array_equal(a.coef_, b.coef_)


def test_sparse_input_matches_dense_and_is_not_densified(easy_problem, monkeypatch):
    import scipy.sparse as sp

    p = easy_problem
    Xs = sp.csr_matrix(np.where(np.abs(p.X) < 0.5, 0.0, p.X))  # a genuinely sparse design
    Xd = Xs.toarray()

    def no_densify(*args, **kwargs):
        raise AssertionError("the estimator densified a sparse matrix")

    dense_ref = SampleDPIHT(epsilon=4.0, sparsity=5, random_state=5).fit(Xd, p.y).coef_
    monkeypatch.setattr(sp.csr_matrix, "toarray", no_densify)
    monkeypatch.setattr(sp.csr_matrix, "todense", no_densify)
    for make in (
        lambda: SampleDPIHT(epsilon=4.0, sparsity=5, random_state=5),
        lambda: RRIHT(epsilon=1.0, sparsity=5, n_iter=10, random_state=5),
        lambda: DPSGDLinear(epsilon=1.0, epochs=1, random_state=5),
        lambda: MLE(max_iter=20),
    ):
        est = make().fit(Xs, p.y)
        assert est.coef_.shape == (200,) and np.isfinite(est.coef_).all()
    sparse_coef = SampleDPIHT(epsilon=4.0, sparsity=5, random_state=5).fit(Xs, p.y).coef_
    np.testing.assert_allclose(sparse_coef, dense_ref, rtol=0, atol=1e-9)
