"""PrivITP accounting: closed forms vs a 60-digit mpmath oracle, the spec's reference values, the
structure of ε2 (linear in t, independent of n, fallback n·ℓ1) and the worst case over λ̃."""

import math

import mpmath as mp
import numpy as np
import pytest

from privalign.accounting.expost import (
    PrivITPAccountant,
    ell1,
    ell2,
    epsilon2,
    log_expected_phi,
    phase1_epsilon,
    phase1_rho,
    phase2_worst_case,
)


def _oracle_log_ephi(c, b, s):
    with mp.workdps(60):
        c, b, s = mp.mpf(c), mp.mpf(b), mp.mpf(s)
        G = lambda z: z * mp.ncdf(z) + mp.npdf(z)
        if b == 0:
            return mp.log(mp.ncdf(c / s))
        return mp.log((s / b) * (G((c + b) / s) - G(c / s)))


def test_log_expected_phi_matches_mpmath(rng):
    worst = 0.0
    for _ in range(400):
        c = rng.uniform(-40, 40)
        b = rng.choice([-1.0, 1.0]) * 10 ** rng.uniform(-5, 2)
        s = 10 ** rng.uniform(-1, 1)
        o = float(_oracle_log_ephi(c, b, s))
        worst = max(worst, abs(float(log_expected_phi(c, b, s)) - o) / max(1.0, abs(o)))
    assert worst < 1e-8


@pytest.mark.parametrize("lam,sigma", [(-0.05, 0.25), (0.3, 0.5), (0.9, 1.0), (0.5, 3.0)])
def test_ell_match_mpmath(lam, sigma):
    r_max, d, L = 1.0, 0.7, 3.0
    w = r_max + sigma * L - lam
    o1 = _oracle_log_ephi(lam - r_max + d, w, sigma) - _oracle_log_ephi(lam - r_max, w, sigma)
    o2 = _oracle_log_ephi(d - lam, -w, sigma) - _oracle_log_ephi(-lam, -w, sigma)
    assert float(ell1(lam, width=w, r_max=r_max, sensitivity=d, sigma_z=sigma)) == pytest.approx(float(o1), rel=1e-8)
    assert float(ell2(lam, width=w, r_max=r_max, sensitivity=d, sigma_z=sigma)) == pytest.approx(float(o2), rel=1e-8)


def test_spec_reference_values():
    # spec §2.4 table (authors' formula: λ = 0.5, R_max = 2, Δ = 4, W = R_max − λ), computed without the
    # min(Δ, R_max) refinement, and the K3 example (ℓ2 0.348 vs 0.367).
    for s, l1, l2 in ((1.0, 1.40, 2.06), (10.0, 0.29, 0.30)):
        a = log_expected_phi(0.5 - 2 + 4, 1.5, s) - log_expected_phi(0.5 - 2, 1.5, s)
        b = log_expected_phi(4 - 0.5, -1.5, s) - log_expected_phi(-0.5, -1.5, s)
        assert round(float(a), 2) == l1 and round(float(b), 2) == l2
    kw = dict(r_max=1.0, sensitivity=0.1, sigma_z=0.5)
    assert float(ell2(0.5, width=0.5, **kw)) == pytest.approx(0.348, abs=1e-3)
    assert float(ell2(0.5, width=0.5 + 1.5, **kw)) == pytest.approx(0.367, abs=1e-3)


def test_phase1_reference_values():
    # spec §2.4: analytic ε1 at δ = 1e-6 for Δ/σ_X = 0.25, 0.5, 1, 2 and ρ1; never the authors' Δ/σ_X
    for ratio, e in ((0.25, 1.06), (0.5, 2.25), (1.0, 4.89), (2.0, 11.00)):
        assert round(phase1_epsilon(1.0, 1.0 / ratio, 1e-6), 2) == e
        assert phase1_epsilon(1.0, 1.0 / ratio, 1e-6) > ratio
        assert phase1_rho(1.0, 1.0 / ratio) == pytest.approx(ratio**2 / 2)


def test_epsilon2_linear_in_t_independent_of_n_and_fallback():
    kw = dict(width=2.2, r_max=1.0, sensitivity=1.0, sigma_z=0.4)
    l1, l2 = float(ell1(0.3, **kw)), float(ell2(0.3, **kw))
    t = np.arange(1, 9)
    e = epsilon2(t, 8, 0.3, **kw)
    assert np.allclose(e, (t - 1) * l1 + l2)
    assert np.allclose(epsilon2(t, 1000, 0.3, **kw), e)  # independent of n
    assert float(epsilon2(-1, 8, 0.3, **kw)) == pytest.approx(8 * l1)  # fallback n·ℓ1 (defect K8)


def test_worst_case_dominates_fine_grid_and_realized():
    kw = dict(beta=0.05, r_max=1.0, sensitivity=1.0, sigma_z=0.5, L=3.0)
    for n in (1, 4, 16, 64):
        sup, _ = phase2_worst_case(n, **kw)
        grid = np.linspace(-0.05, 0.95, 40001)
        w = 1.0 + 0.5 * 3.0 - grid
        f = np.maximum((n - 1) * ell1(grid, width=w, r_max=1, sensitivity=1, sigma_z=0.5)
                       + ell2(grid, width=w, r_max=1, sensitivity=1, sigma_z=0.5),
                       n * ell1(grid, width=w, r_max=1, sensitivity=1, sigma_z=0.5))
        assert sup >= f.max()
        assert sup <= f.max() * 1.01 + 1e-9  # and not absurdly loose


def test_coarse_grid_underestimates_is_caught():
    """A 3-point grid (a 'broken accountant') under-reports the worst case at some n: the realized loss at
    the true argmax exceeds its claim, which the filter would refuse to settle (ReservationError)."""
    kw = dict(beta=0.05, r_max=1.0, sensitivity=1.0, sigma_z=0.5, L=3.0)
    found = False
    for n in (2, 3, 4, 6, 8):
        grid = np.linspace(-0.05, 0.95, 3)
        w = 1.0 + 1.5 - grid
        coarse = np.max(np.maximum((n - 1) * ell1(grid, width=w, r_max=1, sensitivity=1, sigma_z=0.5)
                                   + ell2(grid, width=w, r_max=1, sensitivity=1, sigma_z=0.5),
                                   n * ell1(grid, width=w, r_max=1, sensitivity=1, sigma_z=0.5)))
        sup, arg = phase2_worst_case(n, **kw)
        found |= coarse < sup - 1e-3
    assert found


def test_accountant_realized_never_exceeds_max():
    acc = PrivITPAccountant(beta=0.05, r_max=1.0, sensitivity=1.0, sigma_x=2.0, sigma_z=0.5, L=3.0, delta=1e-6)
    lam = np.linspace(-0.05, 0.95, 101)
    for t in (-1, 1, 5, 16):
        assert np.all(acc.realized(np.full(lam.shape, t), 16, lam) <= acc.epsilon_max(16))
    assert acc.epsilon1 == pytest.approx(phase1_epsilon(1.0, 2.0, 1e-6))
    assert not math.isclose(acc.epsilon1, 1.0 / 2.0)  # not the authors' Δ/σ_X (K4)


def test_calibrate_privitp_sigma():
    from privalign.accounting.expost import calibrate_privitp_sigma

    s = calibrate_privitp_sigma(20.0, 1e-6, 16, beta=0.05)
    acc = lambda x: PrivITPAccountant(beta=0.05, r_max=1.0, sensitivity=1.0, sigma_x=x, sigma_z=x, L=3.0,
                                      delta=1e-6).epsilon_max(16)
    assert acc(s) <= 20.0 < acc(0.99 * s)
