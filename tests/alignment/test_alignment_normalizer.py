"""SolveNormalizer properties (i)–(v) of spec-inference-time §2.2, as Hypothesis property tests.

The strategies draw continuous scores *and* the inputs that broke the pre-fix solver: scores on
a grid, many ties, all-equal vectors, scores clipped at 0 and at R_max, n up to 10⁴, and perturbations of
1e-12…1e-6. The pre-fix solver (``privalign.audit.broken.broken_solve_normalizer``) is the negative
control: Hypothesis must find a counterexample to its Lipschitz property on grid-valued scores.

Tolerances are the solver's certified bound τ = 2⁻⁴⁰·(max − min + β) (``normalizer_tolerance``), not a fudge.
"""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from privalign.accounting.expost import PrivITPAccountant, phase1_epsilon, phase1_sensitivity
from privalign.alignment.normalizer import normalizer_residual, normalizer_tolerance, solve_normalizer
from privalign.audit.broken import broken_solve_normalizer
from privalign.errors import PrivacyParameterError

R_MAX = 1.0
betas = st.one_of(st.sampled_from([0.05, 0.1, 0.2, 1e-3, 0.5, 1.0, 2.0]), st.floats(1e-3, 2.0))
SETTINGS = settings(max_examples=300, deadline=None, derandomize=True)


def _continuous():
    return st.lists(st.floats(0.0, R_MAX, allow_nan=False), min_size=1, max_size=64).map(np.array)


def _grid():
    step = st.sampled_from([0.05, 0.1, 0.2, 0.25, 0.5, 1.0 / 3.0, 1.0])

    def build(args):
        g, ks = args
        return np.clip(np.array(ks, dtype=np.float64) * g, 0.0, R_MAX)

    return st.tuples(step, st.lists(st.integers(0, 20), min_size=1, max_size=64)).map(build)


def _ties():
    values = st.lists(st.floats(0.0, R_MAX, allow_nan=False), min_size=1, max_size=3)
    return st.tuples(values, st.lists(st.integers(0, 2), min_size=1, max_size=64)).map(
        lambda a: np.array([a[0][i % len(a[0])] for i in a[1]])
    )


def _all_equal():
    return st.tuples(st.sampled_from([0.0, R_MAX, 0.3, 0.05, 0.1]), st.integers(1, 64)).map(
        lambda a: np.full(a[1], a[0])
    )


def _clipped():  # a reward model's raw scores clipped into the public range: ties at 0 and R_max
    return st.lists(st.floats(-1.0, 2.0, allow_nan=False), min_size=1, max_size=64).map(
        lambda v: np.clip(np.array(v), 0.0, R_MAX)
    )


def _large():  # n up to 10⁴, grid-valued or clipped, drawn by a seeded numpy generator
    def build(args):
        n, seed, kind = args
        g = np.random.default_rng(seed)
        if kind == 0:
            return np.round(g.uniform(0, R_MAX, n) / 0.05) * 0.05
        if kind == 1:
            return np.clip(g.normal(0.9, 0.3, n), 0.0, R_MAX)
        return g.integers(0, 2, n).astype(np.float64)  # verifier rewards

    return st.tuples(st.integers(2, 10_000), st.integers(0, 2**32 - 1), st.integers(0, 2)).map(build)


def _root_at_a_score():
    """(scores, β) on a grid with β chosen so that the root is (to rounding) one of the scores: the input
    on which the pre-fix solver failed (about 9% of these draws)."""

    def build(args):
        g, ks, pivot = args
        r = np.clip(np.array(ks, dtype=np.float64) * g, 0.0, R_MAX)
        v = r[pivot % r.size]
        beta = float(np.maximum(r - v, 0.0).sum() / r.size)
        return (r, beta) if beta > 0 else (r, 0.1)

    step = st.sampled_from([0.05, 0.1, 0.2, 0.25, 0.5, 1.0 / 3.0])
    return st.tuples(step, st.lists(st.integers(0, 20), min_size=2, max_size=64), st.integers(0, 63)).map(
        build
    )


scores = st.one_of(_continuous(), _grid(), _ties(), _all_equal(), _clipped(), _large())
perturbations = st.sampled_from([1e-12, 1e-10, 1e-9, 1e-8, 1e-6, 1e-3, 0.05, 0.5])


def _tau(r, beta):
    return float(normalizer_tolerance(np.ptp(r), beta))


def _move(r, size, seed, mode):
    g = np.random.default_rng(seed)
    if mode == 0:  # every score moved by at most `size`
        m = g.uniform(-size, size, r.size)
    elif mode == 1:  # one score moved across a tie / onto the root
        m = np.zeros(r.size)
        m[g.integers(r.size)] = size * g.choice([-1.0, 1.0])
    else:  # all scores shifted together (the Gaussian's worst case)
        m = np.full(r.size, size * g.choice([-1.0, 1.0]))
    return np.clip(r + m, 0.0, R_MAX)


def _lipschitz_excess(solver, r, beta, size, seed, mode):
    r2 = _move(r, size, seed, mode)
    d = float(np.max(np.abs(r2 - r)))
    return abs(solver(r, beta) - solver(r2, beta)) - (d + _tau(r, beta) + _tau(r2, beta))


@SETTINGS
@given(scores, betas)
def test_root_residual_and_bounds(r, beta):  # (i) and (ii)
    lam = solve_normalizer(r, beta)
    assert abs(normalizer_residual(r, beta, lam)[0]) <= max(1e-9, _tau(r, beta) / beta)
    n, tau = r.size, _tau(r, beta)
    slack = tau + 1e-13 * (1.0 + np.abs(r).max())  # the bounds themselves are computed in float
    lower = max(r.mean() - beta, r.max() - n * beta)
    assert lower - slack <= lam <= r.max() - beta + slack
    assert -beta - slack <= lam <= R_MAX - beta + slack  # the public clamp interval for r in [0, R_max]


@SETTINGS
@given(_root_at_a_score())
def test_residual_when_the_root_is_a_score(case):  # (i) on the pre-fix solver's failure inputs
    r, beta = case
    assert abs(normalizer_residual(r, beta, solve_normalizer(r, beta))[0]) <= max(1e-9, _tau(r, beta) / beta)


@SETTINGS
@given(_root_at_a_score(), perturbations, st.integers(0, 2**32 - 1), st.integers(0, 2))
def test_one_lipschitz_when_the_root_is_a_score(case, size, seed, mode):  # (v) on the same inputs
    r, beta = case
    assert _lipschitz_excess(solve_normalizer, r, beta, size, seed, mode) <= 0.0


def _exact_F_minus_1(r, beta, lam):
    b, x = Fraction(beta), Fraction(float(lam))
    return sum((max(Fraction(float(v)) - x, Fraction(0)) for v in r), Fraction(0)) / (len(r) * b) - 1


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.one_of(_continuous(), _grid(), _ties(), _all_equal(), _clipped()), betas)
def test_certificate_in_exact_arithmetic(r, beta):
    """The exact root lies in [λ̂ − τ, λ̂ + τ]: F − 1 evaluated in rational arithmetic changes sign there."""
    lam = solve_normalizer(r, beta)
    tau = max(_tau(r, beta), float(np.spacing(abs(lam))))
    assert _exact_F_minus_1(r, beta, lam - tau) >= 0 >= _exact_F_minus_1(r, beta, lam + tau)


@SETTINGS
@given(scores, betas, st.floats(-5, 5))
def test_translation_equivariance(r, beta, c):  # (iii)
    shifted = r + c
    tol = _tau(r, beta) + _tau(shifted, beta) + 4 * float(np.spacing(np.abs(shifted).max() + abs(c) + 1.0))
    assert abs(solve_normalizer(shifted, beta) - (solve_normalizer(r, beta) + c)) <= tol


@SETTINGS
@given(scores, betas, perturbations, st.integers(0, 2**32 - 1))
def test_monotone(r, beta, size, seed):  # (iv)
    r2 = np.clip(r + np.random.default_rng(seed).uniform(0, size, r.size), 0.0, R_MAX)
    assert solve_normalizer(r, beta) <= solve_normalizer(r2, beta) + _tau(r, beta) + _tau(r2, beta)


@SETTINGS
@given(scores, betas, perturbations, st.integers(0, 2**32 - 1), st.integers(0, 2))
def test_one_lipschitz_linf(r, beta, size, seed, mode):  # (v): docs/privacy/privitp.md
    assert _lipschitz_excess(solve_normalizer, r, beta, size, seed, mode) <= 0.0


def test_lipschitz_property_catches_the_pre_fix_solver():
    """Negative control: on grid-valued scores Hypothesis finds a Lipschitz violation of the old solver."""
    strategy = st.tuples(
        _root_at_a_score(), st.sampled_from([1e-12, 1e-9, 1e-6]), st.integers(0, 2**32 - 1), st.integers(0, 2)
    )
    (r, beta), size, seed, mode = find(
        strategy,
        lambda a: _lipschitz_excess(broken_solve_normalizer, a[0][0], a[0][1], *a[1:]) > 0.01,
        settings=settings(max_examples=5000, deadline=None, derandomize=True),
    )
    assert _lipschitz_excess(broken_solve_normalizer, r, beta, size, seed, mode) > 0.01
    assert _lipschitz_excess(solve_normalizer, r, beta, size, seed, mode) <= 0.0


@pytest.mark.parametrize(
    "r,beta,root",
    [
        ([1.0, 0.8, 0.9], 0.1, 0.8),  # the issue's reproduction: the root equals a score
        ([0.99, 0.79, 0.89], 0.1, 0.79),
        ([1.0, 1.0, 1.0], 0.1, 0.9),  # all equal, at R_max
        ([0.0, 0.0, 0.0, 0.0], 0.2, -0.2),  # all equal, at 0
        ([1.0, 0.0], 0.5, 0.0),  # root at the lower score
        ([1.0], 0.3, 0.7),  # n = 1
    ],
)
def test_ties_at_the_root(r, beta, root):
    assert solve_normalizer(r, beta) == pytest.approx(root, abs=1e-15)
    assert abs(normalizer_residual(r, beta, solve_normalizer(r, beta))[0]) <= 1e-12


def test_issue_reproduction_and_the_pre_fix_value():
    assert broken_solve_normalizer([1.0, 0.8, 0.9], 0.1) == pytest.approx(0.7)  # documents the defect
    assert solve_normalizer([1.0, 0.8, 0.9], 0.1) == pytest.approx(0.8, abs=1e-15)
    assert abs(solve_normalizer([1.0, 0.8 + 1e-12, 0.9], 0.1) - 0.8) <= 1e-12


def test_grid_sweep_lipschitz_fixed_vs_broken():
    """The issue's sweep: n = 2..63 on a 0.05 grid, β ∈ {0.05, 0.1, 0.2}, every score moved by ≤ 1e-9."""
    g = np.random.default_rng(0)
    worst_new = worst_old = -np.inf
    for _ in range(2000):
        n, beta = int(g.integers(2, 64)), float(g.choice([0.05, 0.1, 0.2]))
        r = np.round(g.uniform(0, 1, n) / 0.05) * 0.05
        r2 = r + g.uniform(-1e-9, 1e-9, n)
        d = np.abs(r2 - r).max()
        worst_new = max(worst_new, abs(solve_normalizer(r, beta) - solve_normalizer(r2, beta)) - d)
        worst_old = max(
            worst_old, abs(broken_solve_normalizer(r, beta) - broken_solve_normalizer(r2, beta)) - d
        )
    assert worst_new <= 2 * float(normalizer_tolerance(1.0, 0.2))
    assert worst_old > 0.05  # the pre-fix solver is caught


def test_batched_rows_equal_single_rows(rng):
    r = rng.uniform(0, 1, (60, 33))
    r[::3] = np.round(r[::3], 1)  # ties
    r[1::3] = np.clip(2 * r[1::3] - 0.5, 0, 1)  # clipped at both ends
    lam = solve_normalizer(r, 0.07)
    for i in range(r.shape[0]):
        f = lambda x, row=r[i]: np.mean(np.maximum((row - x) / 0.07, 0)) - 1
        assert lam[i] == pytest.approx(brentq(f, -10, r[i].max(), xtol=1e-14), abs=1e-10)
        assert lam[i] == solve_normalizer(r[i], 0.07)


def test_exact_fallback_far_from_zero():
    """Scores far from 0 with a small spread make τ smaller than an ulp: the exact rational root is used."""
    r = 1e12 + np.array([0.0, 0.5, 0.5, 1.0])
    lam = solve_normalizer(r, 0.1)
    assert (
        _exact_F_minus_1(r, 0.1, np.nextafter(lam, -np.inf))
        >= 0
        >= _exact_F_minus_1(r, 0.1, np.nextafter(lam, np.inf))
    )


def test_privitp_accounts_for_the_certificate():
    """Phase 1 is accounted at Δ + 2τ (the computed λ̂'s sensitivity), never at Δ."""
    acc = PrivITPAccountant(beta=0.1, r_max=1.0, sensitivity=1.0, sigma_x=2.0, sigma_z=0.5, L=3.0, delta=1e-6)
    tau = float(normalizer_tolerance(1.0, 0.1))
    assert acc.phase1_sensitivity >= 1.0 + 2 * tau
    assert acc.phase1_sensitivity == phase1_sensitivity(1.0, 1.0, 0.1)
    assert acc.epsilon1 == phase1_epsilon(acc.phase1_sensitivity, 2.0, 1e-6) >= phase1_epsilon(1.0, 2.0, 1e-6)
    assert acc.rho1 >= 1.0 / (2 * 2.0**2)


@pytest.mark.parametrize(
    "bad,beta,match",
    [
        ([], 0.1, "at least one"),
        ([0.1, np.nan], 0.1, "finite"),
        ([0.1, np.inf], 0.1, "finite"),
        ([[[0.1]]], 0.1, "1-D or 2-D"),
        ([0.1], 0.0, "beta"),
        ([0.1], -1.0, "beta"),
    ],
)
def test_bad_input(bad, beta, match):
    with pytest.raises(PrivacyParameterError, match=match):
        solve_normalizer(bad, beta)
