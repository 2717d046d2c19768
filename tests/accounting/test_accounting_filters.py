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
    max_examples=40, stateful_step_count=30, deadline=None, derandomize=True,
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
