"""The standard normal CDF and its tails in numpy: ``ndtr`` (Φ), ``log_ndtr`` (log Φ), ``erfc``, ``erfcx``.

PrivITP's laws (``alignment/laws.py``, the engine's rejection table) and its accounting (``expost.py``, the
analytic Gaussian mechanism in ``conversions.py``) need only these four functions. They are computed here
so that a ``privalign simulate`` run does not import ``scipy.special`` (≈ 0.25 s of CPU at every cold start:
its array-API layer loads ``numpy.f2py``, ``numpy.testing`` and ``numpy.ma``).

**Method.** W. J. Cody's rational Chebyshev approximations (W. J. Cody, "Rational Chebyshev approximations
for the error function", Math. Comp. 23 (1969) 631-637; the coefficients and interval split of his routine
CALERF, Netlib ``specfun``, public domain), on three intervals of ``y = |x|``: ``y ≤ 0.46875`` (erf),
``0.46875 < y ≤ 4`` and ``y > 4`` (erfcx, from which erfc). ``exp(−y²)`` is evaluated as
``exp(−u²)·exp(−(y − u)(y + u))`` with ``u`` = y rounded down to a multiple of 1/16, so that the exponent
carries no rounding error of ``y²`` (Cody's device). Negative arguments by reflection:
``erfc(−y) = 2 − erfc(y)``, ``erfcx(−y) = 2·exp(y²) − erfcx(y)``.

With ``t = x/√2``: ``Φ(x) = ½ + ½·erf(t)`` for ``|t| ≤ 0.46875``; ``1 − ½·erfc(t)`` above; below,
``½·erfcx(−t)·exp(−x²/2)`` with the exponent split on ``x`` itself, so that the rounding of ``t`` does not
enter it (scipy's ``½·erfc(−t)`` loses a relative ``x²·1e-16`` there). ``log Φ(x) = log(½·erfcx(−t)) − t²``
for ``x < −1`` and ``log1p(−½·erfc(t))`` otherwise (scipy's formula for real arguments). Arrays are
evaluated in blocks; a 0-d input takes a scalar path (Python floats, ``math``) with the same arithmetic.

**Accuracy** (``tests/accounting/test_accounting_normal.py``): against a 50-digit mpmath oracle, relative
error of ``erfc``, ``erfcx``, ``ndtr`` ≤ 1e-14 wherever the value is a normal float (observed ≤ 7e-16), and
absolute error of ``log_ndtr`` ≤ 1e-14·max(1, |log Φ|); against scipy, within 1e-14 for |x| ≤ 5 and 5e-13
beyond (scipy's own tail error). The privacy code that uses them keeps its own allowances for
floating-point error, larger than these bounds: ``conversions._TERM_RTOL`` (2e-12 relative on each term of
the analytic Gaussian δ, inflating the first and deflating the second) and ``expost._FP_REL``/``_FP_ABS``
(1e-8 relative and 1e-9 absolute on the certified phase-2 worst case). The tests check that these
functions' error is within a tenth (δ terms) and a hundredth (ℓ1, ℓ2) of those allowances, and that a
``log_ndtr`` understating a term beyond the allowance is caught by the one-sided δ check.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["erfc", "erfcx", "ndtr", "log_ndtr"]

# Cody's CALERF coefficients, as (leading numerator coefficient, numerator, denominator) of the form
# ``(((a·v + p0)·v + p1)·v + … + pk) / (((v + q0)·v + q1)·v + … + qk)``.
# erf(x) = x·R(x²) on |x| ≤ 0.46875:
_A = (
    1.85777706184603153e-1,
    (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02, 3.20937758913846947e03),
    (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03),
)
# erfcx(y) = R(y) on 0.46875 < y ≤ 4:
_C = (
    2.15311535474403846e-8,
    (
        5.64188496988670089e-1,
        8.88314979438837594e00,
        6.61191906371416295e01,
        2.98635138197400131e02,
        8.81952221241769090e02,
        1.71204761263407058e03,
        2.05107837782607147e03,
        1.23033935479799725e03,
    ),
    (
        1.57449261107098347e01,
        1.17693950891312499e02,
        5.37181101862009858e02,
        1.62138957456669019e03,
        3.29079923573345963e03,
        4.36261909014324716e03,
        3.43936767414372164e03,
        1.23033935480374942e03,
    ),
)
# erfcx(y) = (1/√π − z·R(z))/y, z = 1/y², on y > 4:
_P = (
    1.63153871373020978e-2,
    (
        3.05326634961232344e-1,
        3.60344899949804439e-1,
        1.25781726111229246e-1,
        1.60837851487422766e-2,
        6.58749161529837803e-4,
    ),
    (
        2.56852019228982242e00,
        1.87295284992346047e00,
        5.27905102951428412e-1,
        6.05183413124413191e-2,
        2.33520497626869185e-3,
    ),
)
_INV_SQRT_PI = 5.6418958354775628695e-1
_THRESH = 0.46875
_SQRT1_2 = math.sqrt(0.5)
#: erfcx(x) = 2·exp(x²) − erfcx(−x) overflows below x = −26.6287; clamping |x| here keeps ∞ out of the split
_ERFCX_INF = 27.0
#: erfc(y) is 0 in double precision for y ≥ 27.3, and Φ(−y) for y ≥ 38.6: clamping there keeps ∞ out of
#: the exponent split
_ERFC_ZERO, _NDTR_ZERO = 30.0, 40.0
#: arrays are evaluated in blocks of this many elements (the temporaries stay in cache)
_BLOCK = 1 << 14


def _columns(coefs):
    lead, num, den = coefs
    return lead, [np.array([[a], [b]]) for a, b in zip(num, den, strict=True)]


_A_COLS, _C_COLS, _P_COLS = _columns(_A), _columns(_C), _columns(_P)


# ---------------------------------------------------------------- scalars (Python floats, math)
def _ratio_s(v: float, coefs) -> float:
    lead, num, den = coefs
    n, d = lead * v, v
    for a, b in zip(num[:-1], den[:-1], strict=True):
        n = (n + a) * v
        d = (d + b) * v
    return (n + num[-1]) / (d + den[-1])


def _erf_small_s(x: float) -> float:
    return x * _ratio_s(x * x, _A)


def _erfcx_pos_s(y: float) -> float:
    """erfcx(y) for y > 0.46875 (NaN stays NaN)."""
    if not y > 4.0:
        return _ratio_s(y, _C)
    if math.isinf(y):
        return 0.0
    z = 1.0 / (y * y)  # 0 once y² overflows: erfcx(y) = 1/(y√π) there
    return (_INV_SQRT_PI - z * _ratio_s(z, _P)) / y


def _exp_sq_s(y: float, scale: float) -> float:
    """exp(scale·y²) for finite y ≥ 0, y² split at y rounded down to a multiple of 1/16 (Cody's device)."""
    u = math.trunc(y * 16.0) / 16.0
    return math.exp(scale * (u * u)) * math.exp(scale * ((y - u) * (y + u)))


def _erfc_s(x: float) -> float:
    y = abs(x)
    if y <= _THRESH:
        return 1.0 - _erf_small_s(x)
    if math.isnan(y):
        return y
    y = min(y, _ERFC_ZERO)
    e = _exp_sq_s(y, -1.0) * _erfcx_pos_s(y)
    return 2.0 - e if x < 0.0 else e


def _erfcx_s(x: float) -> float:
    y = abs(x)
    if y <= _THRESH:
        return math.exp(x * x) * (1.0 - _erf_small_s(x))
    v = _erfcx_pos_s(y)
    if not x < 0.0:
        return v
    try:
        e = _exp_sq_s(min(y, _ERFCX_INF), 1.0)
    except OverflowError:
        return math.inf
    return (e + e) - v


def _ndtr_s(x: float) -> float:
    t = x * _SQRT1_2
    if abs(t) <= _THRESH:
        return 0.5 + 0.5 * _erf_small_s(t)
    if math.isnan(x):
        return x
    a = min(abs(x), _NDTR_ZERO)
    e = 0.5 * _erfcx_pos_s(a * _SQRT1_2) * _exp_sq_s(a, -0.5)
    return 1.0 - e if x > 0.0 else e


def _log_ndtr_s(x: float) -> float:
    t = x * _SQRT1_2
    if x < -1.0:
        v = _erfcx_pos_s(-t)
        tt = t * t
        return -math.inf if v == 0.0 or math.isinf(tt) else math.log(0.5 * v) - tt
    return math.log1p(-0.5 * _erfc_s(t))


# ---------------------------------------------------------------- arrays (numpy, flat blocks)
def _ratio(v: np.ndarray, cols) -> np.ndarray:
    """The scalar ``_ratio_s`` on an array: numerator and denominator as the two rows of one array (the
    same operations in the same order)."""
    lead, steps = cols
    acc = np.empty((2, v.size))
    np.multiply(v, lead, out=acc[0])
    acc[1] = v
    for col in steps[:-1]:
        acc += col
        acc *= v
    acc += steps[-1]
    return np.divide(acc[0], acc[1], out=acc[0])


def _erf_small(x: np.ndarray) -> np.ndarray:
    return x * _ratio(x * x, _A_COLS)


def _erfcx_pos(y: np.ndarray) -> np.ndarray:
    """erfcx(y) for y > 0.46875 (NaN stays NaN; ∞ gives 0)."""
    big = y > 4.0
    if not big.any():
        return _ratio(y, _C_COLS)
    out = np.empty_like(y)
    mid = ~big
    out[mid] = _ratio(y[mid], _C_COLS)
    yb = y[big]
    with np.errstate(over="ignore"):
        z = 1.0 / (yb * yb)  # 0 once y² overflows: erfcx(y) = 1/(y√π) there
    out[big] = (_INV_SQRT_PI - z * _ratio(z, _P_COLS)) / yb
    return out


def _exp_sq(y: np.ndarray, scale: float) -> np.ndarray:
    """:func:`_exp_sq_s` on an array."""
    u = np.trunc(y * 16.0)
    u /= 16.0
    with np.errstate(under="ignore"):
        return np.exp(scale * (u * u)) * np.exp(scale * ((y - u) * (y + u)))


def _erfc_block(x: np.ndarray) -> np.ndarray:
    y = np.abs(x)
    out = np.empty_like(x)
    small = y <= _THRESH
    out[small] = 1.0 - _erf_small(x[small])
    rest = ~small
    if rest.any():
        yr = np.minimum(y[rest], _ERFC_ZERO)
        e = _exp_sq(yr, -1.0) * _erfcx_pos(yr)
        out[rest] = np.where(x[rest] < 0.0, 2.0 - e, e)
    return out


def _erfcx_block(x: np.ndarray) -> np.ndarray:
    y = np.abs(x)
    out = np.empty_like(x)
    small = y <= _THRESH
    xs = x[small]
    out[small] = np.exp(xs * xs) * (1.0 - _erf_small(xs))
    rest = ~small
    if rest.any():
        yr = y[rest]
        v = _erfcx_pos(yr)
        neg = x[rest] < 0.0
        if neg.any():
            with np.errstate(over="ignore"):
                e = _exp_sq(np.minimum(yr[neg], _ERFCX_INF), 1.0)
                v[neg] = (e + e) - v[neg]
        out[rest] = v
    return out


def _ndtr_block(x: np.ndarray) -> np.ndarray:
    t = x * _SQRT1_2
    out = np.empty_like(x)
    small = np.abs(t) <= _THRESH
    out[small] = 0.5 + 0.5 * _erf_small(t[small])
    rest = ~small
    if rest.any():
        xr = x[rest]
        a = np.minimum(np.abs(xr), _NDTR_ZERO)
        e = _erfcx_pos(a * _SQRT1_2)
        e *= _exp_sq(a, -0.5)
        e *= 0.5
        out[rest] = np.where(xr > 0.0, 1.0 - e, e)
    return out


def _log_ndtr_block(x: np.ndarray) -> np.ndarray:
    t = x * _SQRT1_2
    out = np.empty_like(t)
    left = x < -1.0
    if left.any():
        tl = t[left]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out[left] = np.log(0.5 * _erfcx_pos(-tl)) - tl * tl
    right = ~left
    out[right] = np.log1p(-0.5 * _erfc_block(t[right]))
    return out


def _apply(block, scalar, x: ArrayLike) -> np.ndarray | np.float64:
    """``scalar`` on a 0-d input (a numpy float64 back, as scipy's ufuncs give), ``block`` on each block of
    an array's flattened copy (the input's shape back)."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 0:
        return np.float64(scalar(float(arr)))
    flat = arr.reshape(-1)
    out = np.empty(flat.size)
    for i in range(0, flat.size, _BLOCK):
        out[i : i + _BLOCK] = block(flat[i : i + _BLOCK])
    return out.reshape(arr.shape)


def erfc(x: ArrayLike) -> np.ndarray | np.float64:
    """Complementary error function ``1 − erf(x)`` (elementwise)."""
    return _apply(_erfc_block, _erfc_s, x)


def erfcx(x: ArrayLike) -> np.ndarray | np.float64:
    """Scaled complementary error function ``exp(x²)·erfc(x)`` (elementwise; ``+∞`` below −26.6287)."""
    return _apply(_erfcx_block, _erfcx_s, x)


def ndtr(x: ArrayLike) -> np.ndarray | np.float64:
    """Standard normal CDF ``Φ(x)`` (elementwise)."""
    return _apply(_ndtr_block, _ndtr_s, x)


def log_ndtr(x: ArrayLike) -> np.ndarray | np.float64:
    """``log Φ(x)`` (elementwise), accurate in both tails (``−∞`` at ``x = −∞``)."""
    return _apply(_log_ndtr_block, _log_ndtr_s, x)
