"""DPPrefSyn's private preference model (privalign.estimation.dpprefsyn): the budget composes to (ε, δ) in
the house accountant, each stage at its share; the model learns two preference populations on a toy feature
space and labels public candidates better than chance; what it keeps holds only DP outputs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from privalign.estimation.dpprefsyn import SPLIT, DPPrefSynModel


def _toy(n: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    u, v = np.eye(d)[0], np.eye(d)[1]
    grp = rng.random(n) < 0.5
    return np.where(grp[:, None], u, v) + 0.3 * rng.normal(size=(n, d)), u, v


def test_budget_split_composes_to_the_target():
    m = DPPrefSynModel(epsilon=2.0, delta=1e-5, random_state=0)
    b = m.budgets()
    assert [e for e, _ in b] == [2.0 * s for s in SPLIT] and sum(SPLIT) == 1.0
    assert sum(dl for _, dl in b) <= 1e-5


def test_fit_composes_and_labels_public_candidates_better_than_chance():
    rng = np.random.default_rng(0)
    D, u, _ = _toy(4000, 30, rng)
    m = DPPrefSynModel(epsilon=8.0, delta=1e-5, n_components=5, n_clusters=2, random_state=1).fit(D)
    eps, delta = m.guarantee_
    assert eps <= 8.0 + 1e-12 and delta <= 1e-5
    assert [type(e).__name__ for e in m.stage_events_] == [
        "GaussianEvent",
        "SelfComposedEvent",
        "SelfComposedEvent",
    ]
    assert m.theta_.shape == (2, 5) and m.weights_.sum() == pytest.approx(1.0)
    cands = [np.stack([u + 0.1 * rng.normal(size=30), -u + 0.1 * rng.normal(size=30)]) for _ in range(200)]
    lab = m.synthesize(cands, rng=np.random.default_rng(2))
    right = sum(x == (0, 1) for x in lab)
    # H0: labels no better than a coin (p = 1/2); one-sided exact binomial test at α = 0.001
    assert stats.binomtest(right, 200, 0.5, alternative="greater").pvalue < 1e-3
    assert m.synthesize([np.zeros((1, 30))], rng=rng) == [None]  # one candidate: no pair


def test_the_released_attributes_are_dp_outputs_only():
    rng = np.random.default_rng(5)
    D, _, _ = _toy(500, 10, rng)
    m = DPPrefSynModel(epsilon=4.0, delta=1e-5, n_components=3, n_clusters=2, random_state=3).fit(D)
    released = {k for k in vars(m) if k.endswith("_")}
    assert released == {
        "components_", "centers_", "sizes_", "theta_", "weights_",
        "stage_events_", "privacy_event_", "guarantee_",
    }  # fmt: skip
    # the noisy sizes are not the exact cluster counts (the exact counts are never kept)
    assert not np.allclose(m.sizes_, np.round(m.sizes_))
