"""Privacy filters: no sequence of reserve/settle/cancel (Hypothesis state machine, and 8 threads) lets
settled + outstanding exceed a principal's limit; realized ≤ reserved; fail-closed rules; bad input."""

from __future__ import annotations

import random
import threading
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from privalign.accounting import (
    ExPostEvent,
    ExPostFilter,
    GaussianEvent,
    InMemoryBudgetStore,
    NoisyArgmaxEvent,
    PureDPEvent,
    PureDPFilter,
    Reservation,
    ZCDPFilter,
    zcdp_to_approx_dp,
)
from privalign.errors import BudgetExhaustedError, PrivacyParameterError, ReservationError

EPS_UNIT = Fraction(1, 64)
DELTA_UNIT = Fraction(1, 2**30)
BUDGET = (1.0, float(32 * DELTA_UNIT))
LIMITS = {"bob": 0.5}
PRINCIPALS = ["alice", "bob", "carol"]


class FilterMachine(RuleBasedStateMachine):
    """Model-based test: the filter's decisions and totals must equal an exact rational model."""

    reservations = Bundle("reservations")

    def __init__(self) -> None:
        super().__init__()
        self.f = ExPostFilter(*BUDGET, limits=LIMITS)
        self.spent = {p: [Fraction(0), Fraction(0)] for p in PRINCIPALS}
        self.out = {p: [Fraction(0), Fraction(0)] for p in PRINCIPALS}
        self.closed: set[str] = set()

    def limit(self, p):
        return (Fraction(LIMITS.get(p, BUDGET[0])), Fraction(BUDGET[1]))

    @rule(target=reservations, p=st.sampled_from(PRINCIPALS), k=st.integers(0, 40), m=st.integers(0, 12))
    def reserve(self, p, k, m):
        cost = (k * EPS_UNIT, m * DELTA_UNIT)
        event = ExPostEvent(epsilon_realized=0.0, epsilon_max=float(cost[0]), delta=float(cost[1]))
        lim = self.limit(p)
        fits = all(self.spent[p][i] + self.out[p][i] + cost[i] <= lim[i] for i in range(2))
        before = (self.f.spent(p), self.f.remaining(p))
        try:
            res = self.f.reserve(p, event)
        except BudgetExhaustedError as exc:
            assert not fits
            assert set(exc.remaining) == {"epsilon", "delta"}
            assert (self.f.spent(p), self.f.remaining(p)) == before
            return None
        assert fits
        for i in range(2):
            self.out[p][i] += cost[i]
        return res

    @rule(res=consumes(reservations), frac=st.integers(0, 64))
    def settle(self, res, frac):
        if res is None:
            return
        p = res.principal
        eps_max = Fraction(res.cost[0])
        realized = ExPostEvent(
            epsilon_realized=float(eps_max * frac / 64),
            epsilon_max=float(eps_max),
            delta=res.cost[1],
        )
        self.f.settle(res, realized)
        self.out[p][0] -= eps_max
        self.out[p][1] -= Fraction(res.cost[1])
        self.spent[p][0] += eps_max * frac / 64
        self.spent[p][1] += Fraction(res.cost[1])
        self.closed.add(res.id)
        with pytest.raises(ReservationError, match="already settled"):
            self.f.settle(res, realized)
        with pytest.raises(ReservationError, match="already settled"):
            self.f.cancel(res)

    @rule(res=consumes(reservations))
    def cancel(self, res):
        if res is None:
            return
        self.f.cancel(res)
        self.out[res.principal][0] -= Fraction(res.cost[0])
        self.out[res.principal][1] -= Fraction(res.cost[1])
        self.closed.add(res.id)

    @rule(res=reservations)
    def settle_too_much_is_refused(self, res):
        if res is None or res.id in self.closed:
            return
        before = self.f.spent(res.principal)
        bigger = ExPostEvent(
            epsilon_realized=res.cost[0] + 1 / 64, epsilon_max=res.cost[0] + 1 / 64, delta=res.cost[1]
        )
        with pytest.raises(ReservationError, match="exceeds the reservation"):
            self.f.settle(res, bigger)
        assert self.f.spent(res.principal) == before

    @invariant()
    def totals_match_model_and_never_exceed_limit(self):
        for p in PRINCIPALS:
            (s_e, s_d), (o_e, o_d) = self.f.store.totals(p)
            assert (Fraction(s_e), Fraction(s_d)) == tuple(self.spent[p])
            assert (Fraction(o_e), Fraction(o_d)) == tuple(self.out[p])
            lim = self.limit(p)
            assert Fraction(s_e) + Fraction(o_e) <= lim[0]
            assert Fraction(s_d) + Fraction(o_d) <= lim[1]


TestFilterMachine = FilterMachine.TestCase
TestFilterMachine.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def test_eight_threads_never_overshoot(seed):
    f = PureDPFilter(1.0)
    stop = threading.Event()
    violations: list = []
    settled_total: list[Fraction] = []
    lock = threading.Lock()

    def monitor():
        while not stop.is_set():
            (s, _), (o, _) = f.store.totals("u")
            if Fraction(s) + Fraction(o) > 1:
                violations.append((s, o))

    def worker(i):
        r = random.Random(seed * 100 + i)
        mine = Fraction(0)
        for _ in range(300):
            k = r.randint(1, 8)
            try:
                res = f.reserve("u", NoisyArgmaxEvent(epsilon=k / 64))
            except BudgetExhaustedError:
                continue
            if r.random() < 0.5:
                j = r.randint(0, k)
                if j == 0:
                    f.cancel(res)
                else:
                    f.settle(res, NoisyArgmaxEvent(epsilon=j / 64))
                    mine += Fraction(j, 64)
            # else: left outstanding (a "crash"): stays charged forever
        with lock:
            settled_total.append(mine)

    mon = threading.Thread(target=monitor)
    mon.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    mon.join()
    assert not violations
    (s, _), (o, _) = f.store.totals("u")
    assert Fraction(s) == sum(settled_total)
    assert Fraction(s) + Fraction(o) <= 1


def test_concurrent_reservations_grant_exactly_the_budget():
    f = PureDPFilter(1.0)
    granted: list[int] = []

    def worker():
        n = 0
        for _ in range(20):
            try:
                f.reserve("u", PureDPEvent(epsilon=1 / 64))
                n += 1
            except BudgetExhaustedError:
                pass
        granted.append(n)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 64
    assert f.remaining("u")["epsilon"] == 0.0


def test_crash_between_reserve_and_settle_stays_charged():
    f = ExPostFilter(1.0, 1e-5)
    f.reserve("u", ExPostEvent(epsilon_realized=0.1, epsilon_max=0.75, delta=1e-6))  # never settled
    assert f.spent("u")["epsilon"] == 0.75
    with pytest.raises(BudgetExhaustedError) as info:
        f.reserve("u", ExPostEvent(epsilon_realized=0.1, epsilon_max=0.5, delta=1e-6))
    assert info.value.remaining["epsilon"] == 0.25


def test_ex_post_settles_realized_and_releases_the_rest():
    f = ExPostFilter(1.0, 1e-5)
    ev = ExPostEvent(epsilon_realized=0.125, epsilon_max=0.75, delta=1e-6)
    f.settle(f.reserve("u", ev), ev)
    assert f.spent("u")["epsilon"] == 0.125
    assert f.remaining("u")["epsilon"] == 0.875


def test_per_principal_limits_and_independence():
    f = PureDPFilter(1.0, limits={"small": 0.25})
    f.reserve("big", PureDPEvent(epsilon=0.5))
    with pytest.raises(BudgetExhaustedError):
        f.reserve("small", PureDPEvent(epsilon=0.5))
    assert f.limit_for("small") == (0.25, 0.0)
    assert f.remaining("other")["epsilon"] == 1.0


def test_zcdp_filter_from_epsilon_delta():
    f = ZCDPFilter.from_epsilon_delta(1.0, 1e-6)
    assert zcdp_to_approx_dp(f.budget[0], 1e-6) <= 1.0
    assert f.target == (1.0, 1e-6)
    n = 0
    while True:
        try:
            f.reserve("u", NoisyArgmaxEvent(epsilon=0.1))
            n += 1
        except BudgetExhaustedError:
            break
    # n PrivBoN queries at ε = 0.1 fit; n·0.1²/8 ≤ ρ < (n+1)·0.1²/8
    assert n * 0.01 / 8 <= f.budget[0] < (n + 1) * 0.01 / 8 * (1 + 1e-12)
    assert f.cost(GaussianEvent(noise_multiplier=2.0)) == (0.125, 0.0)


def test_bad_input_names_parameter_and_value():
    with pytest.raises(PrivacyParameterError, match=r"'epsilon'.*0\.0"):
        PureDPFilter(0.0)
    with pytest.raises(PrivacyParameterError, match=r"'rho'.*nan"):
        ZCDPFilter(float("nan"))
    with pytest.raises(PrivacyParameterError, match=r"'delta'.*1\.5"):
        ExPostFilter(1.0, 1.5)
    with pytest.raises(PrivacyParameterError, match=r"'epsilon'.*inf"):
        ExPostFilter(float("inf"), 1e-5)
    f = PureDPFilter(1.0)
    with pytest.raises(PrivacyParameterError, match="'principal'"):
        f.reserve("", PureDPEvent(epsilon=0.1))
    with pytest.raises(TypeError, match="'event'"):
        f.reserve("u", 0.1)
    with pytest.raises(TypeError, match="'reservation'"):
        f.settle("abc", PureDPEvent(epsilon=0.1))
    forged = Reservation(id="nope", principal="u", worst_case=PureDPEvent(epsilon=0.1), cost=(0.1, 0.0))
    with pytest.raises(ReservationError, match="unknown"):
        f.settle(forged, PureDPEvent(epsilon=0.1))
    with pytest.raises(ReservationError, match="unknown"):
        f.cancel(forged)
    with pytest.raises(TypeError, match="'store'"):
        PureDPFilter(1.0, store=object())
    assert f.spent("u")["epsilon"] == 0.0


def test_forged_reservation_cannot_raise_the_settled_cost():
    """The store checks the realized cost against what *it* reserved, not the Reservation object."""
    store = InMemoryBudgetStore()
    f = PureDPFilter(1.0, store=store)
    res = f.reserve("u", PureDPEvent(epsilon=0.1))
    forged = Reservation(id=res.id, principal="u", worst_case=res.worst_case, cost=(0.9, 0.0))
    with pytest.raises(ReservationError, match="exceeds"):
        f.settle(forged, PureDPEvent(epsilon=0.5))
    f.settle(res, PureDPEvent(epsilon=0.1))


class _ForgetsOutstanding(InMemoryBudgetStore):
    """Deliberately broken store (negative control): checks only the *settled* total, not the outstanding
    reservations, like a loop that runs first and checks the budget afterwards."""

    def try_reserve(self, principal, cost, limit):
        (s_e, s_d), _ = self.totals(principal)
        if s_e + cost[0] > limit[0] or s_d + cost[1] > limit[1]:
            raise BudgetExhaustedError("over", remaining={})
        with self._lock:
            rid = f"r{len(self._open) + len(self._closed)}"
            self._open[rid] = (principal, (Fraction(cost[0]), Fraction(cost[1])))
            res = self._reserved.setdefault(principal, [Fraction(0), Fraction(0)])
            res[0] += Fraction(cost[0])
            res[1] += Fraction(cost[1])
            self._spent.setdefault(principal, [Fraction(0), Fraction(0)])
        return rid


@pytest.mark.parametrize("store_cls", [InMemoryBudgetStore, _ForgetsOutstanding])
def test_overshoot_check_catches_a_store_that_forgets_outstanding(store_cls):
    f = PureDPFilter(1.0, store=store_cls())
    for _ in range(2):
        try:
            f.reserve("u", PureDPEvent(epsilon=0.75))
        except BudgetExhaustedError:
            pass
    (s, _), (o, _) = f.store.totals("u")
    overshoot = Fraction(s) + Fraction(o) > 1
    assert overshoot == (store_cls is _ForgetsOutstanding)


# ------------------------------------------------------------------------------------------------
# The ExPostFilter theorem (docs/privacy/filters.md): event-form steps, pointwise ex-post steps and
# PrivITP-like "event-form then pointwise" steps, chosen adaptively and stopped by the real filter,
# give an (ε, δ)-DP transcript in the event form. Checked exactly on finite mechanisms.
# ------------------------------------------------------------------------------------------------

import math  # noqa: E402

import numpy as np  # noqa: E402
from hypothesis import given  # noqa: E402

_K = 3  # output alphabet of each phase
_STEPS = 3  # filter queries attempted


def _hockey(p, q, eps):
    """∫ (p − e^ε q)₊ for finite distributions (ε may be an array, pointwise)."""
    return float(np.sum(np.maximum(p - np.exp(eps) * q, 0.0)))


def _mechanism(seed, i, hist):
    """A random step chosen adaptively: a function of (seed, step, prefix) only, never of the data.

    Returns (pA_D, pA_D', εA, δA, pB_D[a], pB_D'[a], εB[a, b]) — phase A event-form (ε, δ) with δ the
    exact hockey-stick divergence (the tightest event-form δ for this ordered pair), phase B pointwise
    ex-post given a. Either phase may be trivial (a point mass under both datasets).
    """
    code = 0
    for a, b in hist:
        code = code * (_K * _K + 1) + a * _K + b + 1
    rng = np.random.default_rng([seed, i, code])
    kind = rng.integers(3)  # 0 event-form only, 1 pointwise only, 2 both (PrivITP-like)
    s = rng.uniform(0.2, 1.5)

    def pair():
        p = rng.dirichlet(np.full(_K, 2.0))
        q = p * np.exp(rng.uniform(-s, s, _K))
        return p, q / q.sum()

    point = np.eye(_K)[0]
    if kind in (0, 2):
        pa, qa = pair()
        eps_a = float(rng.uniform(0.0, s))
        delta_a = _hockey(pa, qa, eps_a)
    else:
        pa = qa = point
        eps_a, delta_a = 0.0, 0.0
    pb, qb = np.empty((_K, _K)), np.empty((_K, _K))
    for a in range(_K):
        if kind in (1, 2):
            pb[a], qb[a] = pair()
        else:
            pb[a] = qb[a] = point
    ratio = np.divide(pb, qb, out=np.ones_like(pb), where=pb > 0)  # point masses: 1/1 and 0/0 → 1
    eps_b = np.maximum(np.log(ratio), 0.0)
    return pa, qa, eps_a, delta_a, pb, qb, eps_b


def _transcripts(seed, budget, *, charge_delta=True):
    """Enumerate every transcript of the adaptive interaction with a real ExPostFilter (replayed per
    branch). Returns a list of (probability under D, under D', Σ δ charged, Σ ε charged) per transcript."""
    out = []

    def replay(hist):
        f = ExPostFilter(*budget)
        for i, (a, b) in enumerate(hist):
            pa, qa, ea, da, pb, qb, eb = _mechanism(seed, i, hist[:i])
            worst = ExPostEvent(
                epsilon_realized=ea + float(eb.max()),
                epsilon_max=ea + float(eb.max()),
                delta=da if charge_delta else 0.0,
            )
            r = f.reserve("u", worst)
            f.settle(
                r,
                ExPostEvent(
                    epsilon_realized=ea + float(eb[a, b]),
                    epsilon_max=ea + float(eb.max()),
                    delta=da if charge_delta else 0.0,
                ),
            )
        return f

    def walk(hist, pd, pd2, dsum, esum):
        i = len(hist)
        if i == _STEPS:
            out.append((pd, pd2, dsum, esum))
            return
        pa, qa, ea, da, pb, qb, eb = _mechanism(seed, i, hist)
        f = replay(hist)
        worst = ExPostEvent(
            epsilon_realized=ea + float(eb.max()),
            epsilon_max=ea + float(eb.max()),
            delta=da if charge_delta else 0.0,
        )
        try:
            f.reserve("u", worst)
        except BudgetExhaustedError:
            out.append((pd, pd2, dsum, esum))  # stopped: the stop is a function of the transcript
            return
        for a in range(_K):
            for b in range(_K):
                walk(
                    hist + ((a, b),),
                    pd * pa[a] * pb[a, b],
                    pd2 * qa[a] * qb[a, b],
                    dsum + da,
                    esum + ea + float(eb[a, b]),
                )

    walk((), 1.0, 1.0, 0.0, 0.0)
    return out


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), eps_b=st.floats(0.5, 4.0), delta_b=st.floats(0.0, 0.4))
def test_expost_filter_theorem_exact_on_finite_adaptive_mechanisms(seed, eps_b, delta_b):
    leaves = _transcripts(seed, (eps_b, delta_b))
    pd = np.array([x[0] for x in leaves])
    pd2 = np.array([x[1] for x in leaves])
    assert math.isclose(pd.sum(), 1.0) and math.isclose(pd2.sum(), 1.0)
    expected_delta = float(sum(x[0] * x[2] for x in leaves))
    eps_used = max(x[3] for x in leaves)  # the largest Σ ε_i(o_i) over transcripts
    assert eps_used <= eps_b * (1 + 1e-12)
    assert expected_delta <= delta_b * (1 + 1e-12) + 1e-15
    # event-form (ε, δ) for the ordered pair: sup_E P_D(E) − e^ε P_D′(E) = hockey-stick divergence.
    # The proof gives it at the budget and, more sharply, at the largest realized Σ ε_i(o_i).
    assert _hockey(pd, pd2, eps_b) <= expected_delta + 1e-12
    assert _hockey(pd, pd2, eps_used) <= expected_delta + 1e-12
    # Sharpest form (proof steps 5-6): the transcript itself satisfies (DC) with ε(o) = Σ ε_i(o_i).
    eps_leaf = np.array([x[3] for x in leaves])
    assert _hockey(pd, pd2, eps_leaf) <= expected_delta + 1e-12


def test_theorem_check_has_power_when_delta_is_not_charged():
    """Negative control: charging event-form steps δ = 0 (a broken accountant) is caught, both at the
    budget and in the sharp per-transcript form."""
    worst_budget = worst_sharp = 0.0
    for seed in range(40):
        leaves = _transcripts(seed, (2.0, 0.0), charge_delta=False)
        pd = np.array([x[0] for x in leaves])
        pd2 = np.array([x[1] for x in leaves])
        worst_budget = max(worst_budget, _hockey(pd, pd2, 2.0))
        worst_sharp = max(worst_sharp, _hockey(pd, pd2, np.array([x[3] for x in leaves])))
    assert worst_budget > 1e-3  # "(2, 0)-DP" is false although the broken filter charged δ = 0
    assert worst_sharp > 1e-2


def test_privitp_phase1_is_event_form_not_privacy_loss_form():
    """The reviewer's example (Δ/σ_X = 1, δ = 1e-6): the analytic-Gaussian ε1 satisfies the event form
    (hockey stick = δ) but the privacy loss L ~ N(1/2, 1) exceeds it with probability > δ; the
    privacy-loss form would need ε = 1/2 + Φ⁻¹(1 − δ)."""
    from scipy.stats import norm

    from privalign.accounting.conversions import gaussian_epsilon

    delta = 1e-6
    e1 = gaussian_epsilon(1.0, delta)
    assert abs(e1 - 4.8866) < 1e-3
    hockey = norm.cdf(0.5 - e1) - math.exp(e1) * norm.cdf(-0.5 - e1)
    assert hockey <= delta * (1 + 1e-9)
    assert norm.sf(e1 - 0.5) > 5 * delta
    assert abs(0.5 + norm.isf(delta) - 5.2534) < 1e-3


def test_expost_filter_never_refunds_delta():
    f = ExPostFilter(1.0, 1e-5)
    r = f.reserve("u", ExPostEvent(epsilon_realized=0.5, epsilon_max=0.5, delta=1e-6))
    f.settle(r, ExPostEvent(epsilon_realized=0.25, epsilon_max=0.5, delta=0.0))
    spent = f.spent("u")
    assert spent["epsilon"] == 0.25  # realized ε is refunded
    assert spent["delta"] == 1e-6  # δ is charged at the reserved value
    # a realized δ above the reservation is still refused, and changes nothing
    r2 = f.reserve("u", ExPostEvent(epsilon_realized=0.1, epsilon_max=0.1, delta=1e-7))
    with pytest.raises(ReservationError, match="exceeds the reservation"):
        f.settle(r2, ExPostEvent(epsilon_realized=0.1, epsilon_max=0.1, delta=2e-7))
    assert f.spent("u")["settled_delta"] == 1e-6
