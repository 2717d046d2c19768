"""SolveNormalizer properties (i)–(v) of spec-inference-time §2.2, as Hypothesis property tests."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from privalign.alignment.normalizer import normalizer_residual, solve_normalizer
from privalign.errors import PrivacyParameterError

scores = st.lists(st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False), min_size=1, max_size=40)
betas = st.floats(1e-3, 2.0)
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True)


@SETTINGS
@given(scores, betas)
def test_root_residual_and_bounds(r, beta):  # (i) and (ii)
    r = np.array(r)
    lam = solve_normalizer(r, beta)
    assert abs(normalizer_residual(r, beta, lam)[0]) <= 1e-9
    n = r.size
    lower = max(r.mean() - beta, r.max() - n * beta)
    assert lower - 1e-12 <= lam <= r.max() - beta + 1e-12
    assert -beta - 1e-12 <= lam <= 1.0 - beta + 1e-12  # the public clamp interval for r in [0, 1]


@SETTINGS
@given(scores, betas, st.floats(-5, 5))
def test_translation_equivariance(r, beta, c):  # (iii)
    r = np.array(r)
    assert solve_normalizer(r + c, beta) == pytest.approx(solve_normalizer(r, beta) + c, abs=1e-9)


@SETTINGS
@given(scores, betas, st.lists(st.floats(0.0, 0.5), min_size=40, max_size=40))
def test_monotone(r, beta, bump):  # (iv)
    r = np.array(r)
    r2 = r + np.array(bump[: r.size])
    assert solve_normalizer(r, beta) <= solve_normalizer(r2, beta) + 1e-12


@SETTINGS
@given(scores, betas, st.lists(st.floats(-1.0, 1.0), min_size=40, max_size=40))
def test_one_lipschitz_linf(r, beta, move):  # (v): the phase-1 sensitivity argument of docs/privacy/privitp.md
    r = np.array(r)
    r2 = r + np.array(move[: r.size])
    d = np.max(np.abs(r2 - r))
    assert abs(solve_normalizer(r, beta) - solve_normalizer(r2, beta)) <= d + 1e-9


def test_matches_brentq_and_vectorized(rng):
    r = rng.uniform(0, 1, (50, 33))
    r[::5] = np.round(r[::5], 1)  # ties
    lam = solve_normalizer(r, 0.07)
    for i in range(r.shape[0]):
        f = lambda x, row=r[i]: np.mean(np.maximum((row - x) / 0.07, 0)) - 1
        assert lam[i] == pytest.approx(brentq(f, -10, r[i].max()), abs=1e-10)
        assert lam[i] == solve_normalizer(r[i], 0.07)


@pytest.mark.parametrize("bad,beta,match", [([], 0.1, "at least one"), ([0.1, np.nan], 0.1, "finite"),
                                            ([0.1], 0.0, "beta"), ([0.1], -1.0, "beta")])
def test_bad_input(bad, beta, match):
    with pytest.raises(PrivacyParameterError, match=match):
        solve_normalizer(bad, beta)
