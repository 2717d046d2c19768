"""The one calibration routine, ``bisect_monotone``, and the calibrations routed through it.

The routine must end on the safe side: every value it returns is a point where the feasibility test
was evaluated and held. The tests below check that on smooth thresholds, on step (grid) predicates, on
ties at the target, at the ends of the bracket, with loose tolerances and with the iteration cap hit.
"""

import math

import numpy as np
import pytest

from privalign.accounting.calibration import CalibrationLimitError, bisect_monotone
from privalign.errors import PrivacyParameterError


class Recorder:
    """A feasibility test that remembers every point it was asked about and its answer."""

    def __init__(self, ok):
        self.ok = ok
        self.calls: dict[float, bool] = {}

    def __call__(self, x: float) -> bool:
        r = bool(self.ok(x))
        self.calls[x] = r
        return r

    def returned_safely(self, x: float) -> bool:
        return self.calls.get(x) is True


THRESHOLDS = [1e-9, 3e-4, 0.5, 1.0, 1.7, 123.456, 8e5]


@pytest.mark.parametrize("t", THRESHOLDS)
@pytest.mark.parametrize("rtol", [0.0, 1e-12, 1e-4, 0.3])
def test_above_returns_smallest_feasible_within_tolerance(t, rtol):
    ok = Recorder(lambda x: x >= t)
    x = bisect_monotone(ok, 0.5, 1.0, feasible="above", rtol=rtol)
    assert ok.returned_safely(x) and x >= t
    # an infeasible point evaluated within rtol·x (or one float step) below: the bracket really closed
    below = [y for y, r in ok.calls.items() if not r]
    assert below and x - max(below) <= max(rtol * x, math.ulp(x))


@pytest.mark.parametrize("t", THRESHOLDS)
@pytest.mark.parametrize("rtol", [0.0, 1e-12, 1e-4, 0.3])
def test_below_returns_largest_feasible_within_tolerance(t, rtol):
    ok = Recorder(lambda x: x <= t)
    x = bisect_monotone(ok, 0.0, 1.0, feasible="below", rtol=rtol)
    assert ok.returned_safely(x) and x <= t
    above = [y for y, r in ok.calls.items() if not r]
    assert above and min(above) - x <= max(rtol * min(above), math.ulp(x))


@pytest.mark.parametrize("max_iter", [0, 1, 3])
@pytest.mark.parametrize("feasible", ["above", "below"])
def test_iteration_cap_still_returns_a_feasible_point(max_iter, feasible):
    t = 0.3141
    ok = Recorder((lambda x: x >= t) if feasible == "above" else (lambda x: x <= t))
    x = bisect_monotone(ok, 0.0 if feasible == "below" else 0.01, 1.0, feasible=feasible, max_iter=max_iter)
    assert ok.returned_safely(x)
    assert (x >= t) if feasible == "above" else (x <= t)


@pytest.mark.parametrize("step", [0.25, 0.1, 1e-3])
def test_grid_valued_cost_ties_at_the_target_count_as_feasible(step):
    """A cost rounded up to a grid (as accountants round ε up): cost ≤ target holds from the tie on."""
    target = 0.5

    def cost(sigma):  # non-increasing step function of σ
        return math.ceil((1.0 / sigma) / step) * step

    ok = Recorder(lambda s: cost(s) <= target)
    x = bisect_monotone(ok, 0.1, 1.0, feasible="above", rtol=0.0)
    assert ok.returned_safely(x) and cost(x) <= target
    # the exact threshold of the step function is σ = 1/target = 2 (cost there ties with the target)
    assert x == pytest.approx(2.0, rel=1e-12) and x >= 2.0


def test_grid_valued_budget_below():
    """A budget x whose accounted cost is rounded to a grid: the largest x whose cost ties the target."""

    def cost(x):  # rounded up to quarters
        return math.ceil(4 * x) / 4

    ok = Recorder(lambda x: cost(x) <= 1.25)
    x = bisect_monotone(ok, 0.0, 1.0, feasible="below")
    assert ok.returned_safely(x) and cost(x) <= 1.25 and x == 1.25


def test_plateau_of_ties_returns_its_edge():
    """ok is a flat True plateau from 2 on: the result is the plateau's lower edge, not a point inside."""
    ok = Recorder(lambda x: max(1.0 / x, 0.5) <= 0.5)
    x = bisect_monotone(ok, 0.25, 1.0, feasible="above")
    assert ok.returned_safely(x) and x == 2.0


class TestBoundaries:
    def test_threshold_at_hi(self):
        ok = Recorder(lambda x: x >= 1.0)
        x = bisect_monotone(ok, 0.5, 1.0, feasible="above")
        assert x == 1.0 and ok.returned_safely(x)

    def test_threshold_at_lo_above(self):
        """lo itself feasible: the routine moves down rather than trusting the bracket."""
        ok = Recorder(lambda x: x >= 0.5)
        x = bisect_monotone(ok, 0.5, 1.0, feasible="above")
        assert x == 0.5 and ok.returned_safely(x)

    def test_everything_feasible_from_zero(self):
        ok = Recorder(lambda x: True)
        assert bisect_monotone(ok, 0.0, 1.0, feasible="above") == 0.0
        assert ok.returned_safely(0.0)

    def test_lo_feasible_far_below(self):
        ok = Recorder(lambda x: x >= 1e-7)
        x = bisect_monotone(ok, 0.5, 1.0, feasible="above", rtol=1e-9)
        assert ok.returned_safely(x) and 1e-7 <= x <= 1e-7 * (1 + 1e-8)

    def test_threshold_at_lo_below(self):
        ok = Recorder(lambda x: x <= 0.0)
        x = bisect_monotone(ok, 0.0, 1.0, feasible="below")
        assert x == 0.0 and ok.returned_safely(x)

    def test_no_feasible_point_below(self):
        with pytest.raises(CalibrationLimitError):
            bisect_monotone(lambda x: x < 0.0, 0.0, 1.0, feasible="below")

    def test_limit_above(self):
        with pytest.raises(CalibrationLimitError, match="no feasible point up to"):
            bisect_monotone(lambda x: x >= 1e9, 0.5, 1.0, feasible="above", limit=1e6)

    def test_limit_below(self):
        with pytest.raises(CalibrationLimitError, match="extends past"):
            bisect_monotone(lambda x: True, 0.0, 1.0, feasible="below", limit=1e6)

    def test_limit_error_is_a_parameter_error(self):
        assert issubclass(CalibrationLimitError, PrivacyParameterError)

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"lo": 1.0, "hi": 1.0},
            {"lo": -1.0, "hi": 1.0},
            {"lo": 0.0, "hi": math.nan},
            {"feasible": "left"},
            {"grow": 1.0},
            {"rtol": -0.1},
            {"max_iter": -1},
        ],
    )
    def test_bad_arguments(self, kwargs):
        args = {"lo": 0.0, "hi": 1.0, "feasible": "above"} | kwargs
        with pytest.raises(PrivacyParameterError):
            bisect_monotone(lambda x: x >= 0.5, **args)


def test_random_monotone_step_functions():
    """Random non-decreasing step costs on random grids: the answer is feasible and at a step edge."""
    rng = np.random.default_rng(20261201)
    for _ in range(200):
        edges = np.sort(rng.uniform(0.0, 10.0, size=rng.integers(1, 8)))
        target = int(rng.integers(0, len(edges) + 1))

        def cost(x, edges=edges):
            return int(np.searchsorted(edges, x, side="right"))  # ties at an edge take the higher step

        ok = Recorder(lambda x, target=target, cost=cost: cost(x) <= target)
        if target == len(edges):  # feasible everywhere: the bracket search must give up, not guess
            with pytest.raises(CalibrationLimitError):
                bisect_monotone(ok, 0.0, 1.0, feasible="below", limit=1e3)
            continue
        x = bisect_monotone(ok, 0.0, 1.0, feasible="below", limit=1e3)
        assert ok.returned_safely(x) and cost(x) <= target
        assert cost(math.nextafter(x, math.inf)) > target  # x is the last feasible float


# --------------------------------------------------------------------------------------------------
# The calibrations routed through the routine keep their values (taken from the hand-written bisections
# they replaced) within their own tolerance, and stay on the safe side.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eps", "delta", "old"),
    [(0.5, 1e-5, 7.031826675637371), (1.0, 1e-6, 4.224678889346475), (0.05, 0.1, 3.2876727451740173)],
)
def test_gaussian_from_epsilon_delta_regression(eps, delta, old):
    from privalign.accounting.conversions import gaussian_delta
    from privalign.mechanisms.additive import GaussianMechanism

    sigma = GaussianMechanism.from_epsilon_delta(eps, delta, 1.0).sigma
    assert sigma == pytest.approx(old, rel=1e-10)
    assert gaussian_delta(sigma, eps) <= delta


@pytest.mark.parametrize(
    ("s", "eps", "delta", "old"),
    [(1, 1.0, 1e-5, 3.0), (16, 4.0, 0.0, 12.0), (200, 1.0, 1e-5, 214.30895569710628)],
)
def test_calibrate_peeling_regression(s, eps, delta, old):
    from privalign.accounting.peeling import calibrate_peeling, peeling_epsilon

    nm = calibrate_peeling(s, eps, delta)
    assert nm == pytest.approx(old, rel=1e-10)
    e, d = peeling_epsilon(s, nm, delta)
    assert e <= eps and d <= delta


@pytest.mark.parametrize(
    ("eps", "delta", "old"), [(1.0, 1e-5, 0.030556595197629148), (8.0, 1e-3, 1.8487425437163318)]
)
def test_approx_dp_to_zcdp_regression(eps, delta, old):
    from privalign.accounting.conversions import approx_dp_to_zcdp, zcdp_to_approx_dp

    rho = approx_dp_to_zcdp(eps, delta)
    assert rho == pytest.approx(old, rel=1e-10)
    assert zcdp_to_approx_dp(rho, delta) <= eps


@pytest.mark.parametrize(
    ("nm", "delta", "old"),
    [(1.0, 1e-5, 4.377178095685849), (5.0, 1e-3, 0.45392015574586253), (50.0, 0.5, 0.0)],
)
def test_gaussian_epsilon_regression(nm, delta, old):
    from privalign.accounting.conversions import gaussian_delta, gaussian_epsilon

    eps = gaussian_epsilon(nm, delta)
    assert eps == pytest.approx(old, rel=1e-10, abs=1e-300)
    assert gaussian_delta(nm, eps) <= delta


def test_gaussian_epsilon_unreachable_is_infinite():
    from privalign.accounting.conversions import gaussian_epsilon

    assert gaussian_epsilon(1e-4, 1e-300) == math.inf


@pytest.mark.parametrize(
    ("eps", "delta", "n", "beta", "old"),
    [(1.0, 1e-5, 4, 1.0, 5.39013671875), (0.5, 1e-5, 2, 2.0, 9.58056640625)],
)
def test_calibrate_privitp_sigma_regression(eps, delta, n, beta, old):
    from privalign.accounting.expost import PrivITPAccountant, calibrate_privitp_sigma

    sigma = calibrate_privitp_sigma(eps, delta, n, beta=beta)
    assert sigma == pytest.approx(old, rel=2e-4)  # the calibration's own rtol is 1e-4
    acc = PrivITPAccountant(
        beta=beta, r_max=1.0, sensitivity=1.0, sigma_x=sigma, sigma_z=sigma, L=3.0, delta=delta
    )
    assert acc.epsilon_max(n) <= eps


@pytest.mark.parametrize(
    ("eps", "delta", "T", "old"),
    [(1.0, 1e-5, 10, 0.09999999999999999), (4.0, 1e-6, 100, 0.06591782227372259)],
)
def test_advanced_composition_split_regression(eps, delta, T, old):
    from privalign.estimation.iht import advanced_composition_split

    eps_i, delta_i = advanced_composition_split(eps, delta, T)
    assert eps_i == pytest.approx(old, rel=1e-10)
    assert T * delta_i <= delta


def test_calibrate_dpsgd_noise_regression():
    from privalign.estimation.baselines import calibrate_dpsgd_noise, dpsgd_epsilon

    sigma = calibrate_dpsgd_noise(1.0, 1e-5, 0.01, 100)
    assert sigma == pytest.approx(0.95693359375, rel=2e-3)  # the calibration's own tol is 1e-3
    assert dpsgd_epsilon(sigma, 0.01, 100, 1e-5) <= 1.0
