"""scikit-learn compatibility of the reward estimators and the private tuning protocol."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError as SkNotFittedError
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.estimator_checks import check_estimator
from sklearn.utils.validation import check_is_fitted

from privalign.errors import PrivacyParameterError
from privalign.estimation import IHT, MLE, RRIHT, DenseRR, DPSGDLinear, SampleDPIHT
from privalign.estimation.base import NotFittedError
from privalign.estimation.iht import default_n_iter
from privalign.estimation.synthetic import make_btl
from privalign.estimation.tuning import PrivateGridSearch, expand_grid, split_validation, tune


def _all(seed=0):
    return [
        MLE(),
        IHT(sparsity=1, clip=True),
        SampleDPIHT(sparsity=1, clip=True, epsilon=8.0, random_state=seed),
        RRIHT(sparsity=1, clip=True, random_state=seed),
        DenseRR(random_state=seed),
        DPSGDLinear(epochs=1.0, random_state=seed),
    ]


#: check_estimator checks expected to fail, with the reason: all four feed labels other than the preference
#: bit y ∈ {0, 1} (three or more classes, or strings); a BTL comparison has exactly two outcomes, so the
#: estimators refuse them with "Only binary classification is supported" (a ValueError) by design.
EXPECTED_FAILED_CHECKS = {
    "check_estimators_dtypes": "multiclass labels (y ∈ {0, 1, 2}); preference labels are binary",
    "check_classifier_data_not_an_array": "multiclass labels; preference labels are binary",
    "check_classifiers_classes": "string class labels; the preference bit is 0/1",
    "check_fit2d_1feature": "multiclass labels; preference labels are binary",
}


@pytest.mark.parametrize("est", _all(), ids=lambda e: type(e).__name__)
def test_check_estimator_passes_except_the_listed_label_checks(est):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = check_estimator(est, on_fail=None, expected_failed_checks=EXPECTED_FAILED_CHECKS)
    failed = [r["check_name"] for r in res if r["status"] == "failed"]
    xfail = sorted(r["check_name"] for r in res if r["status"] == "xfail")
    assert failed == [], failed
    # Every listed failure still fails (otherwise the list is stale and must shrink).
    assert xfail == sorted(EXPECTED_FAILED_CHECKS), xfail
    assert len(res) > 40


def test_not_fitted_error_is_sklearns_and_privaligns():
    est = SampleDPIHT(sparsity=2)
    with pytest.raises(SkNotFittedError):
        est.predict_reward(np.zeros((2, 3)))
    with pytest.raises(PrivacyParameterError):
        est.predict(np.zeros((2, 3)))
    with pytest.raises(NotFittedError):
        est.score(np.zeros((2, 3)), [0, 1])
    with pytest.raises(SkNotFittedError):
        check_is_fitted(est)
    assert issubclass(NotFittedError, SkNotFittedError)


def test_clone_gridsearch_cross_val_pipeline_check_is_fitted():
    p = make_btl(1200, 40, 3, random_state=np.random.default_rng(0))
    X, y = p.X, p.y
    est = RRIHT(epsilon=4.0, sparsity=3, random_state=0)
    c = clone(est)
    assert c.get_params() == est.get_params() and not hasattr(c, "coef_")
    gs = GridSearchCV(est, {"sparsity": [1, 3, 10]}, cv=3).fit(X, y)
    assert gs.best_params_["sparsity"] in (1, 3, 10)
    scores = cross_val_score(MLE(), X, y, cv=3)
    assert scores.shape == (3,) and np.all(scores > 0.6)
    pipe = Pipeline([("identity", FunctionTransformer()), ("est", IHT(sparsity=3))]).fit(X, y)
    check_is_fitted(pipe)
    np.testing.assert_array_equal(pipe.predict(X), (pipe[-1].predict_reward(X) > 0).astype(int))
    proba = pipe.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    # The old API keeps working: coef_, predict_reward, score, privacy_event_.
    fitted = pipe[-1]
    assert fitted.coef_.shape == (40,) and np.count_nonzero(fitted.coef_) <= 3
    assert 0.0 <= fitted.score(X, y) <= 1.0 and fitted.privacy_event_.kind == "non_private"
    np.testing.assert_array_equal(fitted.classes_, [0, 1])


def test_set_params_unknown_name_names_it():
    with pytest.raises(PrivacyParameterError, match="'bogus'"):
        IHT().set_params(bogus=1)


# ----------------------------------------------------------------------------------------------------
# Defaults that learn
# ----------------------------------------------------------------------------------------------------


def test_default_n_iter_grows_with_n_and_is_capped_by_noise():
    assert default_n_iter(1000) == math.ceil(3 * math.log(1000))
    assert default_n_iter(128_000) > default_n_iter(8_000) > default_n_iter(1_000)
    # Noise cap: T ≤ 0.05·n/(2·η·c_x²·ν).
    assert default_n_iter(2000, noise_multiplier=1.88, step_size=4.0) == math.floor(0.05 * 2000 / (8 * 1.88))
    assert default_n_iter(10, noise_multiplier=100.0) == 1


def test_sample_dp_iht_default_error_falls_with_n():
    """On the rate problem (d = 200, s* = 5, ε = 8) the default T keeps learning: the mean error over 2
    replicates falls by more than 3× from n = 4k to n = 32k (the old T = ⌈ln n⌉ default floored)."""
    errs = []
    for n in (4000, 32000):
        e = []
        for r in range(2):
            p = make_btl(n, 200, 5, random_state=np.random.default_rng(r))
            est = SampleDPIHT(epsilon=8.0, sparsity=5, random_state=np.random.default_rng(100 + r)).fit(
                p.X, p.y
            )
            e.append(p.squared_error(est.coef_))
        errs.append(float(np.mean(e)))
    assert errs[1] < errs[0] / 3, errs
    assert errs[1] < 0.1, errs


def test_dpsgd_averaging_is_validated_and_default_learns():
    p = make_btl(4000, 50, 3, random_state=np.random.default_rng(1))
    with pytest.raises(PrivacyParameterError, match="averaging"):
        DPSGDLinear(averaging=1.5).fit(p.X, p.y)
    est = DPSGDLinear(epsilon=8.0, clip_norm=4.0, batch_size=512, epochs=10, random_state=0).fit(p.X, p.y)
    assert p.squared_error(est.coef_) < 0.5 * float(p.theta_star @ p.theta_star)


# ----------------------------------------------------------------------------------------------------
# Tuning protocol
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prob():
    return make_btl(3000, 60, 3, random_state=np.random.default_rng(5))


def test_grid_search_selects_on_validation_and_accounts(prob):
    g = PrivateGridSearch(
        SampleDPIHT(sparsity=3),
        {"sparsity": [1, 3], "step_size": [2.0, 4.0]},
        epsilon=8.0,
        delta=1e-5,
        random_state=0,
    ).fit(prob.X, prob.y)
    assert len(g.candidates_) == 4 and g.n_fit_ + g.n_validation_ == 3000
    assert g.n_validation_ == 600
    # Each candidate ran at ε/K, δ/K: total (8, 1e-5), and the event holds the 4 fits and the selection.
    assert all(c.kind == "parallel_composed" for c in g.privacy_event_.events[0].events)
    assert [e.target_epsilon for e in g.privacy_event_.events[0].events[0].events][:1] == [2.0]
    assert g.privacy_event_.events[1].kind == "noisy_argmax" and g.privacy_event_.events[1].epsilon == 8.0
    assert g.privacy_budget_["epsilon"] == pytest.approx(8.0) and g.privacy_budget_["delta"] == pytest.approx(
        1e-5
    )
    assert g.tuning_privacy_ == "accounted"
    np.testing.assert_array_equal(g.coef_, g.best_estimator_.coef_)
    assert g.predict_reward(prob.X).shape == (3000,)


def test_grid_search_shares_one_rr_draw_for_label_dp(prob):
    g = tune(RRIHT(sparsity=3), {"sparsity": [1, 3, 6]}, prob.X, prob.y, epsilon=2.0, random_state=1)
    assert g.shared_label_noise_
    seeds = {c.random_state for c in [g.best_estimator_]}
    assert len(seeds) == 1
    # One RR release (ε = 2), post-processed by three fits, plus the ε = 2 selection: total ε = 2.
    assert g.privacy_event_.events[0].kind == "randomized_response"
    assert g.privacy_budget_["epsilon"] == pytest.approx(2.0) and g.privacy_budget_["delta"] == 0.0


def test_grid_search_public_selection_says_so(prob):
    g = PrivateGridSearch(IHT(), {"sparsity": [1, 3]}, selection="public", random_state=0).fit(prob.X, prob.y)
    assert g.tuning_privacy_.startswith("public data")
    assert g.privacy_event_.kind == "non_private"
    assert g.best_params_ == {
        "sparsity": [1, 3][int(np.argmax([c["validation_accuracy"] for c in g.candidates_]))]
    }


def test_grid_search_never_sees_test_and_groups_stay_together(prob):
    groups = np.repeat(np.arange(300), 10)
    fit_idx, val_idx = split_validation(3000, 0.2, np.random.default_rng(0), groups)
    assert set(groups[fit_idx]).isdisjoint(set(groups[val_idx]))
    assert len(set(groups[val_idx])) == 60


def test_grid_search_refit_composes(prob):
    g = PrivateGridSearch(DenseRR(), {"alpha": [1e-3, 1e-1]}, epsilon=1.0, refit=True, random_state=0)
    g.fit(prob.X, prob.y)
    assert g.privacy_event_.kind == "composed"
    assert g.privacy_budget_["epsilon"] == pytest.approx(2.0)
    assert g.best_estimator_.coef_.shape == (60,)


@pytest.mark.parametrize(
    "grid, match",
    [
        ({}, "param_grid"),
        ([], "param_grid"),
        ({"sparsity": []}, "'sparsity'"),
        ({"bogus": [1]}, "'bogus'"),
        (None, "param_grid"),
    ],
)
def test_grid_search_bad_grids(prob, grid, match):
    with pytest.raises(PrivacyParameterError, match=match):
        PrivateGridSearch(IHT(), grid).fit(prob.X, prob.y)


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_grid_search_bad_validation_fraction(prob, frac):
    with pytest.raises(PrivacyParameterError, match="validation_fraction"):
        PrivateGridSearch(IHT(), {"sparsity": [1]}, validation_fraction=frac).fit(prob.X, prob.y)


def test_grid_search_split_with_fewer_pairs_than_batches(prob):
    est = SampleDPIHT(sparsity=2, n_iter=2000)
    with pytest.raises(
        PrivacyParameterError, match=r"validation_fraction.*0\.5.*1500 fitting pairs.*n_iter=2000"
    ):
        PrivateGridSearch(est, {"sparsity": [2]}, validation_fraction=0.5).fit(prob.X, prob.y)
    with pytest.raises(PrivacyParameterError, match="batch_size=2900"):
        PrivateGridSearch(DPSGDLinear(batch_size=2900), {"epochs": [1.0]}).fit(prob.X, prob.y)


def test_grid_search_refuses_epsilon_in_grid_with_total_epsilon(prob):
    with pytest.raises(PrivacyParameterError, match="epsilon/delta"):
        PrivateGridSearch(RRIHT(), {"epsilon": [1.0, 2.0]}, epsilon=2.0).fit(prob.X, prob.y)
    # Without a total, candidates keep their own ε and the total is their sum (no shared RR draw).
    g = PrivateGridSearch(RRIHT(sparsity=3), {"epsilon": [1.0, 2.0]}, selection_epsilon=0.5, random_state=0)
    g.fit(prob.X, prob.y)
    assert not g.shared_label_noise_ and g.privacy_budget_["epsilon"] == pytest.approx(3.0)


def test_expand_grid_list_of_dicts():
    assert expand_grid([{"a": [1, 2]}, {"b": [3]}]) == [{"a": 1}, {"a": 2}, {"b": 3}]


def test_fit_reward_tune_cli(tmp_path, capsys):
    import json

    from privalign.cli import main

    f = tmp_path / "pairs.jsonl"
    rng = np.random.default_rng(0)
    with f.open("w") as fh:
        for i in range(300):
            good, bad = (
                ("thank you kind helpful", "stupid rude idiot") if rng.random() < 0.9 else ("ok", "no")
            )
            fh.write(
                json.dumps({"prompt": f"q{i}", "chosen": f"{good} {i}", "rejected": f"{bad} {i}"}) + "\n"
            )
    out = tmp_path / "rm.json"
    rc = main(
        [
            "fit-reward",
            "--data",
            str(f),
            "--method",
            "rr-iht",
            "--epsilon",
            "4",
            "--sparsity",
            "4",
            "--tune",
            "--seed",
            "3",
            "--n-features",
            "256",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tuning"]["n_fit"] + res["tuning"]["n_validation"] == res["n_train"]
    assert res["tuning"]["privacy_budget"]["epsilon"] == pytest.approx(4.0)
    assert res["privacy_event"]["kind"] == "parallel_composed"
    assert (
        main(["fit-reward", "--data", str(f), "--method", "iht", "--tune", "--validation-fraction", "1.5"])
        == 2
    )
    assert "validation_fraction" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------
# Sparsity check pieces
# ----------------------------------------------------------------------------------------------------


def test_lexicon_features_and_harm_lexicon():
    from privalign.estimation import LexiconFeatures, feature_map_from_config, harm_lexicon

    words = harm_lexicon(8)
    assert len(words) == len(set(words)) and "sorry" in words and len(words) > 8
    fm = LexiconFeatures(words, name="harm")
    X = fm.transform(["I'm sorry, I can't help you steal.", "sure, here is how"])
    assert X.shape == (2, len(words)) and X.max() == 1.0
    assert X[0].sum() == 4 and X[1].sum() == 0  # sorry, can't, help, steal
    assert feature_map_from_config(fm.get_config()).words == words
    with pytest.raises(PrivacyParameterError, match="duplicates"):
        LexiconFeatures(["a", "a"])
    with pytest.raises(PrivacyParameterError, match="'words'"):
        LexiconFeatures([])


def test_mcnemar_exact_known_values():
    from scipy import stats

    from privalign.estimation.sparsity import mcnemar_exact

    a = np.array([1] * 10 + [0] * 2 + [1] * 50)
    b = np.array([0] * 10 + [1] * 2 + [1] * 50)
    t = mcnemar_exact(a, b)
    assert (t["a_better"], t["b_better"]) == (10, 2)
    assert t["p_value"] == pytest.approx(2 * stats.binom.cdf(2, 12, 0.5))  # 0.0386 < α = 0.05
    assert t["significant"] and t["alpha"] == 0.05
    assert mcnemar_exact(a, a)["p_value"] == 1.0
    with pytest.raises(PrivacyParameterError):
        mcnemar_exact(a, b[:-1])


def test_sparsity_curve_sees_a_sparse_signal():
    from privalign.estimation.preferences import PreferenceData
    from privalign.estimation.sparsity import sparsity_curve

    p = make_btl(3000, 100, 2, random_state=np.random.default_rng(3))
    tr = PreferenceData(X=p.X[:2400], y=p.y[:2400])
    te = PreferenceData(X=p.X[2400:], y=p.y[2400:])
    rows = sparsity_curve(tr, te, [1, 2, 50, 500])
    acc = {r["s"]: r["accuracy"] for r in rows if r["method"] == "IHT"}
    assert set(acc) == {1, 2, 50}  # s > d skipped
    mle = next(r for r in rows if r["method"] == "MLE")
    assert acc[2] >= mle["accuracy"] - 0.03  # s = s* already as good as dense


def test_dpsgd_auto_learning_rate_is_noise_aware():
    from privalign.estimation.baselines import auto_learning_rate

    assert auto_learning_rate(0.0, 256, 100) == 1.0
    assert auto_learning_rate(1.0, 1024, 200) == 1.0
    assert auto_learning_rate(16.5, 1024, 200) == pytest.approx(0.03 * 1024 / (16.5 * math.sqrt(200)))
    p = make_btl(2000, 40, 3, random_state=np.random.default_rng(2))
    est = DPSGDLinear(epsilon=1.0, learning_rate=None, clip_norm=4.0, epochs=2, random_state=0).fit(p.X, p.y)
    assert est.privacy_event_.kind == "self_composed" and np.all(np.isfinite(est.coef_))
