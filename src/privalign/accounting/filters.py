"""Privacy filters: per-principal budgets with reserve → settle (spec-inference-time §3.2).

Pattern::

    res = filter.reserve(principal, worst_case_event)   # BudgetExhaustedError BEFORE data is touched
    out = mechanism(...)                                 # touches data
    filter.settle(res, realized_event)                   # charge the realized cost ≤ the reservation
    # or filter.cancel(res) if the mechanism never ran

Fail-closed rules:

* ``reserve`` refuses when ``spent + outstanding + cost > limit`` in any coordinate; the check and the
  reservation are one atomic step of the :class:`BudgetStore`; a refusal changes nothing.
* an outstanding reservation is charged at its reserved cost until settled or cancelled, so a crash
  between ``reserve`` and ``settle`` leaves the worst case charged;
* ``settle`` checks realized ≤ reserved in every coordinate (else :class:`ReservationError`, nothing
  changes); settling or cancelling twice, or an unknown reservation, is a :class:`ReservationError`.

Costs are tuples ``(primary, delta)`` of floats rounded **up** from exact rationals; the in-memory store
adds them as exact rationals (``fractions.Fraction``), so no sum is ever rounded down.

Theorems (which filter is valid under fully adaptive choice of queries *and* privacy parameters):

* :class:`PureDPFilter` — Σ ε_i ≤ ε ⇒ ε-DP. Rogers, Roth, Ullman & Vadhan 2016, "Privacy Odometers and
  Filters: Pay-as-you-Go Composition", arXiv 1605.08294 (their filter for pure DP — *theorem number
  unverified*); the direct proof is in ``docs/privacy/filters.md``.
* :class:`ZCDPFilter` — Σ ρ_i ≤ ρ ⇒ ρ-zCDP. Feldman & Zrnic 2021, "Individual Privacy Accounting via a
  Rényi Filter", arXiv 2008.11193 (Rényi filter, applied at every order α with ε_i(α) = ρ_i·α), and
  Whitehouse, Ramdas, Rogers & Wu 2023, arXiv 2203.05481 — *theorem numbers unverified*.
* :class:`ExPostFilter` — Σ realized ε_i ≤ ε and Σ δ_i ≤ δ ⇒ (ε, δ)-DP (event form) for mechanisms
  satisfying the *decomposition condition*: for every history and ordered neighbouring pair,
  ``∫ (p_D(o) − e^{ε_i(o)}·p_D′(o))₊ ≤ δ_i`` with ε_i(·) ≤ ε_max a function of the output and of the
  transcript only, ε_max and δ_i fixed before the mechanism runs. Implied by the privacy-loss form of
  ex-post DP, by event-form (ε_i, δ_i)-DP (constant ε_i), and by PrivITP's event-form Gaussian phase 1
  followed by its pointwise ex-post phase 2. The proof (split each step's density into a part dominated
  by e^{ε_i(o)}·p_D′ plus an excess of mass ≤ δ_i, expand the product by the first step that uses its
  excess; Dwork & Roth 2014 basic-composition proof and Kasiviswanathan & Smith 2014 — *lemma numbers
  unverified*) is written out in ``docs/privacy/filters.md``. Related results: Lebensold, Precup & Balle
  2024, arXiv 2402.06137 (a filter for pure ex-post DP); Rogers, Samorodnitsky, Wu & Ramdas 2023, arXiv
  2306.13824 (filters mixing DP and ex-post private mechanisms) — *theorem numbers unverified*.
"""

from __future__ import annotations

import math
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, runtime_checkable

from privalign._validation import check_real
from privalign.accounting.accountant import Cost, approx_cost, pure_cost, zcdp_cost
from privalign.accounting.conversions import approx_dp_to_zcdp, fraction_to_float_up
from privalign.accounting.events import PrivacyEvent
from privalign.errors import BudgetExhaustedError, PrivacyParameterError, ReservationError

__all__ = [
    "Reservation",
    "BudgetStore",
    "InMemoryBudgetStore",
    "PrivacyFilter",
    "PureDPFilter",
    "ZCDPFilter",
    "ExPostFilter",
]

CostTuple = tuple[float, float]


@dataclass(frozen=True)
class Reservation:
    """A granted reservation: what was reserved for whom.

    Attributes:
      id: The store's reservation id.
      principal: Whose budget it is charged to.
      worst_case: The worst-case event that was reserved.
      cost: The reserved cost ``(primary, delta)`` in the filter's currency.
    """

    id: str
    principal: str
    worst_case: PrivacyEvent
    cost: CostTuple


@runtime_checkable
class BudgetStore(Protocol):
    """Storage of per-principal budgets. Four operations; implementations must make ``try_reserve``
    atomic (check and reserve in one transaction, e.g. ``SELECT ... FOR UPDATE`` or ``BEGIN IMMEDIATE``)
    and must round sums **up** (or use exact/NUMERIC arithmetic).

    * ``try_reserve(principal, cost, limit) -> str``: if ``spent + outstanding + cost ≤ limit`` in every
      coordinate, record an outstanding reservation and return its id; else raise
      :class:`BudgetExhaustedError` (``remaining`` = ``{"primary": ..., "delta": ...}``) and change nothing.
    * ``settle(reservation_id, cost)``: move the reservation from outstanding to spent at ``cost`` (the
      caller has checked ``cost ≤`` the reserved cost); raise :class:`ReservationError` if the id is
      unknown or already settled/cancelled.
    * ``cancel(reservation_id)``: drop an outstanding reservation; same errors as ``settle``.
    * ``totals(principal) -> (spent, reserved)``: the principal's spent and outstanding totals.
    """

    def try_reserve(self, principal: str, cost: CostTuple, limit: CostTuple) -> str: ...

    def settle(self, reservation_id: str, cost: CostTuple) -> None: ...

    def cancel(self, reservation_id: str) -> None: ...

    def totals(self, principal: str) -> tuple[CostTuple, CostTuple]: ...


def _float_down(q: Cost) -> float:
    """The largest float ≤ ``q`` (``inf`` stays ``inf``), for "remaining" figures."""
    if isinstance(q, float):
        return q
    f = float(q)
    if Fraction(f) > q:
        f = math.nextafter(f, -math.inf)
    return f


def _fr(x: float) -> Cost:
    return math.inf if math.isinf(x) else Fraction(x)


class InMemoryBudgetStore:
    """Thread-safe in-memory :class:`BudgetStore` (one lock; exact rational sums)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent: dict[str, list[Cost]] = {}
        self._reserved: dict[str, list[Cost]] = {}
        self._open: dict[str, tuple[str, tuple[Cost, Cost]]] = {}
        self._closed: set[str] = set()

    def try_reserve(self, principal: str, cost: CostTuple, limit: CostTuple) -> str:
        c = (_fr(cost[0]), _fr(cost[1]))
        lim = (_fr(limit[0]), _fr(limit[1]))
        with self._lock:
            spent = self._spent.get(principal, [Fraction(0), Fraction(0)])
            res = self._reserved.get(principal, [Fraction(0), Fraction(0)])
            charged = [spent[i] + res[i] for i in range(2)]
            if any(charged[i] + c[i] > lim[i] for i in range(2)):
                remaining = {
                    "primary": _float_down(max(lim[0] - charged[0], Fraction(0))),
                    "delta": _float_down(max(lim[1] - charged[1], Fraction(0))),
                }
                raise BudgetExhaustedError(
                    f"Reserving cost {cost} for principal {principal!r} would exceed its limit {limit} "
                    f"(already charged: spent {tuple(float(x) for x in spent)}, outstanding "
                    f"{tuple(float(x) for x in res)}). Nothing was charged.",
                    remaining=remaining,
                )
            rid = uuid.uuid4().hex
            self._reserved[principal] = [res[0] + c[0], res[1] + c[1]]
            self._spent.setdefault(principal, [Fraction(0), Fraction(0)])
            self._open[rid] = (principal, c)
            return rid

    def _close(self, reservation_id: str) -> tuple[str, tuple[Cost, Cost]]:
        if reservation_id not in self._open:
            state = "already settled or cancelled" if reservation_id in self._closed else "unknown"
            raise ReservationError(f"Reservation {reservation_id!r} is {state}; nothing was changed.")
        principal, c = self._open.pop(reservation_id)
        self._closed.add(reservation_id)
        res = self._reserved[principal]
        self._reserved[principal] = [res[0] - c[0], res[1] - c[1]]
        return principal, c

    def settle(self, reservation_id: str, cost: CostTuple) -> None:
        c = (_fr(cost[0]), _fr(cost[1]))
        with self._lock:
            if reservation_id in self._open:
                reserved = self._open[reservation_id][1]
                if c[0] > reserved[0] or c[1] > reserved[1]:
                    raise ReservationError(
                        f"Realized cost {cost} exceeds the reserved cost of {reservation_id!r}; nothing was "
                        "changed."
                    )
            principal, _ = self._close(reservation_id)
            sp = self._spent[principal]
            self._spent[principal] = [sp[0] + c[0], sp[1] + c[1]]

    def cancel(self, reservation_id: str) -> None:
        with self._lock:
            self._close(reservation_id)

    def totals(self, principal: str) -> tuple[CostTuple, CostTuple]:
        with self._lock:
            sp = self._spent.get(principal, [Fraction(0), Fraction(0)])
            rs = self._reserved.get(principal, [Fraction(0), Fraction(0)])
            return (
                (fraction_to_float_up(sp[0]), fraction_to_float_up(sp[1])),
                (fraction_to_float_up(rs[0]), fraction_to_float_up(rs[1])),
            )


class PrivacyFilter(ABC):
    """A per-principal privacy budget valid under fully adaptive composition (see module docstring).

    Args:
      budget: The default limit ``(primary, delta)`` of every principal (set by subclasses).
      store: A :class:`BudgetStore`; default a fresh :class:`InMemoryBudgetStore`.
      limits: Optional per-principal overrides ``{principal: primary}`` (or ``(primary, delta)``); any
        ``Mapping`` works, so a service can pass a database-backed view.
    """

    #: names of the two cost coordinates, for ``spent``/``remaining`` dicts.
    names: tuple[str, str] = ("epsilon", "delta")

    def __init__(
        self,
        budget: CostTuple,
        *,
        store: BudgetStore | None = None,
        limits: Mapping[str, float | CostTuple] | None = None,
    ) -> None:
        self._budget = budget
        self._store: BudgetStore = InMemoryBudgetStore() if store is None else store
        if not isinstance(self._store, BudgetStore):
            raise TypeError(
                f"The 'store' parameter must implement BudgetStore. Got {type(store).__name__} instead."
            )
        self._limits = limits if limits is not None else {}

    @property
    def budget(self) -> CostTuple:
        """The default per-principal limit ``(primary, delta)``."""
        return self._budget

    @property
    def store(self) -> BudgetStore:
        return self._store

    # -- currency -------------------------------------------------------------------------------------
    @abstractmethod
    def _cost(self, event: PrivacyEvent, *, realized: bool) -> tuple[Cost, Cost]:
        """Exact cost of ``event`` (worst case when ``realized`` is False)."""

    def cost(self, event: PrivacyEvent, *, realized: bool = False) -> CostTuple:
        """The cost tuple of ``event`` in this filter's currency, rounded up.

        Raises:
          TypeError: not a PrivacyEvent.
          UnsupportedEventError: the event (or a nested sub-event, named in the message) is not supported.
        """
        if not isinstance(event, PrivacyEvent):
            raise TypeError(
                f"The 'event' parameter must be a PrivacyEvent. Got {type(event).__name__} instead."
            )
        p, d = self._cost(event, realized=realized)
        return fraction_to_float_up(p), fraction_to_float_up(d)

    def limit_for(self, principal: str) -> CostTuple:
        """The limit of ``principal``: its override in ``limits`` if any, else the default budget."""
        v = self._limits.get(principal) if hasattr(self._limits, "get") else None
        if v is None:
            return self._budget
        if isinstance(v, tuple | list):
            return (float(v[0]), float(v[1]))
        return (float(v), self._budget[1])

    @staticmethod
    def _check_principal(principal: str) -> str:
        if not isinstance(principal, str) or not principal:
            raise PrivacyParameterError(
                f"The 'principal' parameter must be a non-empty str. Got {principal!r} instead."
            )
        return principal

    # -- reserve / settle / cancel ----------------------------------------------------------------------
    def reserve(self, principal: str, worst_case: PrivacyEvent) -> Reservation:
        """Reserve the worst-case cost of a mechanism *before* it touches data.

        Args:
          principal: Whose budget (a user id, an API key).
          worst_case: A data-independent worst-case event for the mechanism about to run.

        Returns:
          A :class:`Reservation` to pass to :meth:`settle` or :meth:`cancel`.

        Raises:
          BudgetExhaustedError: the reservation would exceed the principal's limit (``remaining`` says
            what is left); nothing was charged.
          UnsupportedEventError: the event cannot be costed by this filter; nothing was charged.
        """
        principal = self._check_principal(principal)
        cost = self.cost(worst_case, realized=False)
        limit = self.limit_for(principal)
        if math.isinf(cost[0]) or math.isinf(cost[1]):
            # A non-private event never fits a finite budget; refuse without asking the store.
            raise BudgetExhaustedError(
                f"{type(self).__name__}: {worst_case!r} has no finite privacy cost and can never be reserved "
                f"for principal {principal!r}. Nothing was charged.",
                remaining=self.remaining(principal),
            )
        try:
            rid = self._store.try_reserve(principal, cost, limit)
        except BudgetExhaustedError as exc:
            rem = exc.remaining
            named = {self.names[0]: rem.get("primary", 0.0), self.names[1]: rem.get("delta", 0.0)}
            raise BudgetExhaustedError(
                f"{type(self).__name__}: reserving {self.names[0]}={cost[0]!r}, {self.names[1]}={cost[1]!r} "
                f"for principal {principal!r} would exceed its budget {self.names[0]}={limit[0]!r}, "
                f"{self.names[1]}={limit[1]!r}; remaining {named}. Nothing was charged. "
                f"Use remaining('{principal}') to see what is left.",
                remaining=named,
            ) from exc
        return Reservation(id=rid, principal=principal, worst_case=worst_case, cost=cost)

    def settle(self, reservation: Reservation, realized: PrivacyEvent) -> None:
        """Charge the realized cost of a reservation whose mechanism ran.

        Raises:
          ReservationError: realized cost above the reservation in some coordinate, or the reservation was
            already settled/cancelled or is unknown; nothing changes.
          UnsupportedEventError: the realized event cannot be costed; nothing changes.
        """
        cost = self.charge(reservation, realized)  # checks the types first
        self._store.settle(reservation.id, cost)

    def charge(self, reservation: Reservation, realized: PrivacyEvent) -> CostTuple:
        """The cost to charge for a reservation whose mechanism ran, without writing anything (pure: no
        store access). :meth:`settle` is ``store.settle(reservation.id, charge(reservation, realized))``;
        a caller that writes the ledger itself (the service) calls this and then its store.

        Returns:
          The cost tuple (rounded up), checked ≤ the reserved cost in every coordinate.

        Raises:
          ReservationError: realized cost above the reservation in some coordinate.
          UnsupportedEventError: the realized event cannot be costed.
        """
        if not isinstance(reservation, Reservation):
            raise TypeError(
                f"The 'reservation' parameter must be a Reservation. Got {type(reservation).__name__} "
                "instead."
            )
        cost = self.cost(realized, realized=True)
        if cost[0] > reservation.cost[0] or cost[1] > reservation.cost[1]:
            raise ReservationError(
                f"The realized cost {self.names[0]}={cost[0]!r}, {self.names[1]}={cost[1]!r} of {realized!r} "
                f"exceeds the reservation {reservation.id!r} ({self.names[0]}={reservation.cost[0]!r}, "
                f"{self.names[1]}={reservation.cost[1]!r}); nothing was changed."
            )
        return self._settled_cost(reservation, cost)

    def _settled_cost(self, reservation: Reservation, realized_cost: CostTuple) -> CostTuple:
        """The cost actually charged on settling (default: the realized cost, already checked ≤ reserved)."""
        return realized_cost

    def cancel(self, reservation: Reservation) -> None:
        """Release a reservation whose mechanism never ran (did not touch data).

        Raises:
          ReservationError: already settled/cancelled or unknown.
        """
        if not isinstance(reservation, Reservation):
            raise TypeError(
                f"The 'reservation' parameter must be a Reservation. Got {type(reservation).__name__} "
                "instead."
            )
        self._store.cancel(reservation.id)

    # -- queries ------------------------------------------------------------------------------------------
    def spent(self, principal: str) -> dict[str, float]:
        """Settled cost plus outstanding reservations (what is charged now), by coordinate name; also
        ``"settled_*"`` and ``"outstanding_*"`` entries."""
        principal = self._check_principal(principal)
        sp, rs = self._store.totals(principal)
        out = {}
        for i, n in enumerate(self.names):
            out[n] = (
                fraction_to_float_up(Fraction(sp[i]) + Fraction(rs[i]))
                if math.isfinite(sp[i] + rs[i])
                else math.inf
            )
            out[f"settled_{n}"] = sp[i]
            out[f"outstanding_{n}"] = rs[i]
        return out

    def remaining(self, principal: str) -> dict[str, float]:
        """What ``principal`` can still reserve, by coordinate name (never negative; rounded down)."""
        principal = self._check_principal(principal)
        sp, rs = self._store.totals(principal)
        limit = self.limit_for(principal)
        out = {}
        for i, n in enumerate(self.names):
            left = (
                Fraction(limit[i]) - Fraction(sp[i]) - Fraction(rs[i]) if math.isfinite(sp[i] + rs[i]) else -1
            )
            out[n] = _float_down(max(left, Fraction(0)))
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(budget={self._budget})"


class PureDPFilter(PrivacyFilter):
    """Pure ε-DP filter: a principal's settled + outstanding ε never exceeds ``epsilon``.

    Costs: :func:`~privalign.accounting.accountant.pure_cost` (NoisyArgmax ε, Laplace 1/nm, RR ε,
    Peeling 3s/nm, PureDP ε, ex-post/approx events with δ = 0 at their worst case ε).

    Privacy:
      Unit: the principal (every query of one user charges that user's budget). Guarantee: ε-DP for each
      principal under fully adaptive choice of queries and ε_i.

    References:
      Rogers, Roth, Ullman & Vadhan 2016, arXiv 1605.08294 (privacy filters) — theorem number unverified.
    """

    names = ("epsilon", "delta")

    def __init__(self, epsilon: float, *, store: BudgetStore | None = None, limits=None) -> None:
        epsilon = check_real(epsilon, "epsilon", low=0.0, closed="neither")
        super().__init__((epsilon, 0.0), store=store, limits=limits)

    def _cost(self, event: PrivacyEvent, *, realized: bool) -> tuple[Cost, Cost]:
        return pure_cost(event, ex_post="max"), Fraction(0)


class ZCDPFilter(PrivacyFilter):
    """ρ-zCDP filter: settled + outstanding ρ never exceeds ``rho``.

    Costs: :func:`~privalign.accounting.accountant.zcdp_cost` (NoisyArgmax ε²/8, Gaussian 1/(2nm²), pure ε
    events ε²/2, ...). Use :meth:`from_epsilon_delta` to budget in (ε, δ): the largest ρ whose conversion
    (:func:`~privalign.accounting.conversions.zcdp_to_approx_dp`) is ≤ ε at δ.

    Privacy:
      Guarantee: ρ-zCDP per principal under full adaptivity (hence (ε, δ)-DP via the conversion).

    References:
      Feldman & Zrnic 2021, arXiv 2008.11193; Whitehouse, Ramdas, Rogers & Wu 2023, arXiv 2203.05481 —
      theorem numbers unverified.
    """

    names = ("rho", "delta")

    def __init__(self, rho: float, *, store: BudgetStore | None = None, limits=None) -> None:
        rho = check_real(rho, "rho", low=0.0, closed="neither")
        super().__init__((rho, 0.0), store=store, limits=limits)
        self.target: tuple[float, float] | None = None

    @classmethod
    def from_epsilon_delta(
        cls, epsilon: float, delta: float, *, store: BudgetStore | None = None, limits=None
    ) -> ZCDPFilter:
        """A filter whose ρ budget guarantees (ε, δ)-DP (ρ rounded down)."""
        rho = approx_dp_to_zcdp(epsilon, delta)
        if rho <= 0.0:
            raise PrivacyParameterError(
                f"The 'epsilon' parameter is too small for delta={delta!r}: no positive rho. Got {epsilon!r} "
                "instead."
            )
        f = cls(rho, store=store, limits=limits)
        f.target = (float(epsilon), float(delta))
        return f

    def _cost(self, event: PrivacyEvent, *, realized: bool) -> tuple[Cost, Cost]:
        return zcdp_cost(event), Fraction(0)


class ExPostFilter(PrivacyFilter):
    """(ε, δ) filter that charges ex-post mechanisms their *realized* loss.

    Costs: ``ExPostEvent`` reserves ``(epsilon_max, delta)`` and settles ``(epsilon_realized, δ_reserved)``;
    pure events (NoisyArgmax, PureDP, Laplace, RR, Peeling at 3s/nm) cost ``(ε, 0)``; δ sums. **δ is
    never refunded**: settling charges the *reserved* δ even if the realized event states a smaller one
    (the proof needs each δ_i fixed before mechanism i runs; a δ read off the output is not). Event-form
    ``ApproxDPEvent`` with δ > 0 is still refused (fail closed). The argument in ``docs/privacy/filters.md``
    would cover it (at constant ε, basic composition), but it is not enabled: see that page.

    Privacy:
      Guarantee: (ε, δ)-DP per principal (event form), provided every ex-post mechanism satisfies the
      *decomposition condition* of ``docs/privacy/filters.md``: for every history and ordered neighbouring
      pair, ``∫ (p_D(o) − e^{ε_i(o)} p_D′(o))₊ dν(o) ≤ δ_i``, with ε_i(·) ≤ ε_max a function of the released
      output and the transcript only, and ε_max, δ_i fixed before the mechanism runs. The privacy-loss
      form of spec-inference-time §1.3 implies it; so does an event-form (ε_i, δ_i) guarantee (constant
      ε_i), and so does PrivITP's "event-form Gaussian phase 1 (ε1, δ) then pointwise ex-post phase 2
      ε2(t; λ̃)" — which is *not* of the privacy-loss form. See ``docs/privacy/filters.md`` (proof) and
      ``LIMITATIONS.md``.

    References:
      Lebensold, Precup & Balle 2024, arXiv 2402.06137 (pure ex-post filter); Rogers, Samorodnitsky,
      Wu & Ramdas 2023, arXiv 2306.13824; Rogers, Roth, Ullman & Vadhan 2016, arXiv 1605.08294 —
      theorem numbers unverified.
    """

    names = ("epsilon", "delta")

    def __init__(
        self, epsilon: float, delta: float, *, store: BudgetStore | None = None, limits=None
    ) -> None:
        epsilon = check_real(epsilon, "epsilon", low=0.0, closed="neither")
        delta = check_real(delta, "delta", low=0.0, high=1.0, closed="left")
        super().__init__((epsilon, delta), store=store, limits=limits)

    def _cost(self, event: PrivacyEvent, *, realized: bool) -> tuple[Cost, Cost]:
        return approx_cost(event, ex_post="realized" if realized else "max", allow_approx=False)

    def _settled_cost(self, reservation: Reservation, realized_cost: CostTuple) -> CostTuple:
        # Realized ε (a function of the output) is charged; δ is charged at the reserved value, never
        # less (max() keeps a forged Reservation object from lowering the charge below the realized δ;
        # the store re-checks the result against its own record).
        return realized_cost[0], max(realized_cost[1], reservation.cost[1])
