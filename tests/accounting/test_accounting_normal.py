"""``privalign.accounting.normal`` (Φ, log Φ, erfc, erfcx without scipy) against a 50-digit mpmath oracle
and against scipy, on grids, ties, the interval boundaries, ±0, ±∞, NaN and the extreme tails; and the
allowances of the privacy code that uses them (analytic Gaussian δ, PrivITP's ℓ1/ℓ2) checked to cover
their error, with a deliberately broken variant the one-sided check must catch.

Tolerances (no last-bit values are pinned): against mpmath, relative error ≤ 1e-14 where the value is a
normal float (observed ≤ 7e-16), and for ``log_ndtr`` absolute error ≤ 1e-14·max(1, |log Φ|); against
scipy, relative ≤ 1e-14 for |x| ≤ 5 and ≤ 5e-13 beyond (scipy's own tail error reaches 2e-13 for ``ndtr``
and 6e-14 for ``erfc``/``erfcx``: its exponent is ``−x²`` rounded, ours is split).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from scipy import special

from privalign.accounting import conversions, expost
from privalign.accounting import normal as N

TINY = np.finfo(np.float64).tiny
BOUNDARIES = [0.46875, 4.0, 26.628, 1.0, 38.6, 40.0, 30.0, 27.3]
EDGES = sorted(
    {s * v for b in BOUNDARIES for v in (b, np.nextafter(b, 0.0), np.nextafter(b, np.inf)) for s in (1, -1)}
    | {s * b * math.sqrt(2.0) for b in (0.46875, 4.0) for s in (1, -1)}
    | {0.0, 1e-300, 5e-324, -5e-324, 1e-8, -1e-8, 1e8, -1e8, 1e200, -1e200, 1e300, -1e300}
)

ORACLES = {
    "erfc": lambda v: mp.erfc(v),
    "erfcx": lambda v: mp.exp(v * v) * mp.erfc(v),
    "ndtr": mp.ncdf,
}


def _points(rng, n=600):
    return np.concatenate([np.linspace(-39.0, 39.0, 781), rng.normal(0.0, 8.0, n), EDGES])


def _oracle(name, xs):
    """mpmath at 50 digits; beyond |x| = 1e6 (where mpmath's erfc overflows) the asymptotic values, exact in
    double precision there: erfc → 0 or 2, Φ → 0 or 1, erfcx(x) → 1/(x√π) (relative error 1/(2x²)) or ∞."""
    fn = ORACLES[name]
    far = {
        "erfc": lambda v: 0.0 if v > 0 else 2.0,
        "erfcx": lambda v: 1.0 / (v * math.sqrt(math.pi)) if v > 0 else math.inf,
        "ndtr": lambda v: 1.0 if v > 0 else 0.0,
    }[name]
    with mp.workdps(50):
        return np.array([far(float(v)) if abs(v) > 1e6 else float(fn(mp.mpf(float(v)))) for v in xs])


def _rel(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.abs(a - b) / np.abs(b)
    return np.where(a == b, 0.0, r)


@pytest.mark.parametrize("name", ["erfc", "erfcx", "ndtr"])
def test_matches_mpmath(name, rng):
    xs = _points(rng)
    ex = _oracle(name, xs)
    ours = getattr(N, name)(xs)
    normal = np.isfinite(ex) & (np.abs(ex) >= TINY)
    assert _rel(ours, ex)[normal].max() <= 1e-14
    # outside the normal range: the same infinities, and subnormal or zero where the value is
    assert np.array_equal(np.isinf(ours), np.isinf(ex))
    sub = np.isfinite(ex) & ~normal
    assert np.all(np.abs(ours[sub] - ex[sub]) <= 2 * TINY)


def test_log_ndtr_matches_mpmath(rng):
    xs = np.concatenate([_points(rng), [-1e3, -1e5]])
    xs = xs[np.abs(xs) <= 1e6]
    with mp.workdps(50):
        ex = np.array([float(mp.log(mp.ncdf(mp.mpf(float(v))))) for v in xs])
    ours = N.log_ndtr(xs)
    fin = np.isfinite(ex)
    assert np.max(np.abs(ours[fin] - ex[fin]) / np.maximum(1.0, np.abs(ex[fin]))) <= 1e-14


@pytest.mark.parametrize("name", ["erfc", "erfcx", "ndtr", "log_ndtr"])
def test_agrees_with_scipy(name, rng):
    xs = np.concatenate([np.linspace(-60.0, 60.0, 24001), rng.standard_cauchy(4000) * 5, EDGES])
    ours, ref = getattr(N, name)(xs), getattr(special, name)(xs)
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    assert np.array_equal(np.isposinf(ours), np.isposinf(ref))
    assert np.array_equal(np.isneginf(ours), np.isneginf(ref))
    fin = np.isfinite(ref)
    if name == "log_ndtr":  # compared in absolute terms, scaled by max(1, |log Φ|)
        err = np.abs(ours[fin] - ref[fin]) / np.maximum(1.0, np.abs(ref[fin]))
        assert err.max() <= 1e-14
        return
    normal = fin & (np.abs(ref) >= TINY)
    core = normal & (np.abs(xs) <= 5.0)
    assert _rel(ours, ref)[core].max() <= 1e-14
    assert _rel(ours, ref)[normal].max() <= 5e-13
    assert np.all(np.abs(ours[fin & ~normal] - ref[fin & ~normal]) <= 2 * TINY)


def test_special_values():
    inf, nan = math.inf, math.nan
    assert N.erfc(inf) == 0.0 and N.erfc(-inf) == 2.0 and N.erfc(0.0) == 1.0
    assert N.erfcx(inf) == 0.0 and N.erfcx(-inf) == inf and N.erfcx(-27.0) == inf and N.erfcx(0.0) == 1.0
    assert N.ndtr(inf) == 1.0 and N.ndtr(-inf) == 0.0 and N.ndtr(0.0) == 0.5 and N.ndtr(-0.0) == 0.5
    assert N.log_ndtr(inf) == 0.0 and N.log_ndtr(-inf) == -inf
    for f in (N.erfc, N.erfcx, N.ndtr, N.log_ndtr):
        assert math.isnan(f(nan)) and np.isnan(f(np.array([nan, 0.0])))[0]


@pytest.mark.parametrize("name", ["erfc", "erfcx", "ndtr", "log_ndtr"])
def test_shapes_scalars_ties_and_blocks(name, rng):
    f = getattr(N, name)
    assert isinstance(f(0.3), np.float64) and isinstance(f(np.float64(0.3)), np.float64)
    assert (
        f(np.array(0.3)).shape == ()
        and f([[0.1, 0.2]]).shape == (1, 2)
        and f(np.empty((0, 3))).shape
        == (
            0,
            3,
        )
    )
    # an array longer than a block, with ties: equal inputs give equal outputs wherever they sit, and the
    # array path agrees with the scalar path (same arithmetic; numpy's and math's exp/log may differ by ulps)
    xs = np.repeat(rng.normal(0.0, 10.0, 300), 3 * N._BLOCK // 300 + 1)
    rng.shuffle(xs)
    out = f(xs)
    for v in np.unique(xs)[:40]:
        assert np.unique(out[xs == v]).size == 1
    sample = xs[:: N._BLOCK // 7]
    scal = np.array([f(float(v)) for v in sample])
    if name == "log_ndtr":
        assert np.max(np.abs(f(sample) - scal) / np.maximum(1.0, np.abs(scal))) <= 1e-15
    else:
        assert _rel(f(sample), scal)[np.abs(scal) >= TINY].max() <= 1e-15
    assert not np.shares_memory(f(xs), xs) and np.array_equal(xs, xs.copy())


def test_ndtr_and_log_ndtr_are_monotone():
    xs = np.linspace(-38.0, 9.0, 200001)
    assert np.all(np.diff(N.ndtr(xs)) >= 0.0)
    assert np.all(np.diff(N.log_ndtr(np.linspace(-1e4, 9.0, 200001))) >= 0.0)


# ---- the allowances of the privacy code cover these functions' error --------------------------------------


def test_gaussian_delta_terms_within_the_allowance():
    """``conversions.gaussian_delta`` inflates its first term and deflates its second by ``_TERM_RTOL``; the
    terms (``exp(log_ndtr)``, the second times ``e^ε``) must be within a tenth of it of the exact values
    wherever they are above the δ floor."""
    worst = 0.0
    with mp.workdps(60):
        for nm in (0.05, 0.3, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0):
            for eps in (0.0, 0.01, 0.5, 1.0, 3.0, 8.0, 30.0, 100.0, 500.0):
                first, second = conversions._gaussian_delta_terms(nm, eps)
                a, b = 1 / (2 * mp.mpf(nm)), mp.mpf(eps) * mp.mpf(nm)
                ex1, ex2 = mp.ncdf(a - b), mp.exp(mp.mpf(eps)) * mp.ncdf(-a - b)
                for got, ex in ((first, ex1), (second, ex2)):
                    if ex > conversions._DELTA_FLOOR and math.isfinite(got):
                        worst = max(worst, float(abs(mp.mpf(got) - ex) / ex))
    assert worst <= conversions._TERM_RTOL / 10


def test_broken_log_ndtr_is_caught_by_the_one_sided_check(monkeypatch):
    """Negative control: a ``log_ndtr`` that understates the first term by a relative 1e-9 (more than the
    allowance) makes ``gaussian_delta`` fall below the exact curve, and the one-sided comparison sees it."""

    def below(nm_list, eps_list):
        with mp.workdps(60):
            for nm in nm_list:
                for eps in eps_list:
                    a, b = 1 / (2 * mp.mpf(nm)), mp.mpf(eps) * mp.mpf(nm)
                    exact = mp.ncdf(a - b) - mp.exp(mp.mpf(eps)) * mp.ncdf(-a - b)
                    if mp.mpf(conversions.gaussian_delta(nm, eps)) < exact:
                        return True
        return False

    grid = ([0.3, 0.5, 1.0, 2.0, 5.0], [0.0, 0.5, 1.0, 3.0, 8.0])
    assert not below(*grid)
    real = N.log_ndtr
    monkeypatch.setattr(conversions, "log_ndtr", lambda x: real(x) - 1e-9)
    assert below(*grid)


def _oracle_log_ephi(c, b, s):
    with mp.workdps(60):
        c, b, s = mp.mpf(c), mp.mpf(b), mp.mpf(s)
        G = lambda z: z * mp.ncdf(z) + mp.npdf(z)
        return mp.log((s / b) * (G((c + b) / s) - G(c / s)))


def test_expost_ratios_within_the_allowance(rng):
    """``expost.phase2_worst_case`` adds ``_FP_REL``·value + ``_FP_ABS``·(n+1) to (n−1)·ℓ1 + ℓ2 for the
    floating-point error of ℓ1, ℓ2: the error of each ratio with these functions must be within a hundredth
    of ``_FP_REL``·ℓ + ``_FP_ABS``."""
    worst = 0.0
    for _ in range(60):
        r_max, lam = 1.0, rng.uniform(-0.2, 0.95)
        d, sigma, L = rng.uniform(0.05, 1.0), 10 ** rng.uniform(-1.3, 1.0), rng.uniform(1.0, 4.0)
        w = r_max + sigma * L - lam
        kw = dict(width=w, r_max=r_max, sensitivity=d, sigma_z=sigma)
        for got, pairs in (
            (expost.ell1(lam, **kw), [(lam - r_max + d, lam - r_max, w), (lam - r_max, lam - r_max + d, w)]),
            (expost.ell2(lam, **kw), [(d - lam, -lam, -w), (-lam, d - lam, -w)]),
        ):
            ex = max(
                [
                    float(_oracle_log_ephi(c1, b, sigma) - _oracle_log_ephi(c0, b, sigma))
                    for c1, c0, b in pairs
                ]
            )
            ex = max(ex, 0.0)
            worst = max(worst, abs(float(got) - ex) / (expost._FP_REL * ex + expost._FP_ABS))
    assert worst <= 0.01
