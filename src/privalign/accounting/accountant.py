"""Privacy accountants: turn a ledger of :mod:`privalign.accounting.events` into a guarantee.

Four accountants share one contract (tested by one suite, ``tests/accounting/test_accounting_contract.py``):

* ``supports(event)`` says whether every (nested) sub-event is understood;
* ``compose(event, count=1)`` is **transactional**: the increment is computed first (which may raise
  :class:`~privalign.errors.UnsupportedEventError` naming the offending sub-event and its path), then the
  state and the ledger are updated together; on any error nothing changes;
* ``count`` semantics are exact: ``compose(e, k)``, ``compose(SelfComposedEvent(event=e, count=k))`` and
  ``k`` separate ``compose(e)`` give *bit-identical* results, because costs are kept as exact rationals
  (``fractions.Fraction``: every float is an exact dyadic rational) and rounded **up** only when a float
  is returned (``get_epsilon``/``get_rho``...). Sums therefore never round down;
* the first composed event fixes the ledger's privacy ``unit`` and ``relation``; a later event with a
  different unit or relation is refused (a sum over different units has no meaning);
* ``NonPrivateEvent`` makes ε = ∞.

Accountants:

* :class:`PureDPAccountant` — basic composition of pure ε-DP (Dwork & Roth 2014, Thm. 3.16).
* :class:`ZCDPAccountant` — additive composition of ρ-zCDP (Bun & Steinke 2016, arXiv 1605.02065v1,
  Lemma 1.7 — *theorem number unverified*), conversion to (ε, δ) by
  :func:`~privalign.accounting.conversions.zcdp_to_approx_dp`.
* :class:`ApproxDPAccountant` — basic composition of (ε, δ)-DP (Dwork & Roth 2014, Thm. 3.16).
* :class:`~privalign.accounting.rdp.RDPAccountant` — RDP / PLD over ``dp_accounting`` (in ``rdp.py``).

Per-event costs used by the accountants and the filters (:func:`pure_cost`, :func:`zcdp_cost`,
:func:`approx_cost`) are documented in ``docs/privacy/accounting.md``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Literal

from privalign._validation import check_int, check_real
from privalign.accounting.conversions import fraction_to_float_up, zcdp_to_approx_dp
from privalign.accounting.events import (
    ApproxDPEvent,
    ExPostEvent,
    GaussianEvent,
    LaplaceEvent,
    NoisyArgmaxEvent,
    NonPrivateEvent,
    PeelingEvent,
    PoissonSampledEvent,
    PrivacyEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    ZCDPEvent,
    fold_event,
)
from privalign.errors import UnsupportedEventError

__all__ = [
    "Accountant",
    "PureDPAccountant",
    "ZCDPAccountant",
    "ApproxDPAccountant",
    "pure_cost",
    "zcdp_cost",
    "approx_cost",
]

INF = math.inf
Cost = Fraction | float  # a Fraction, or float('inf')


# ------------------------------------------------------------------------------------------------
# Exact arithmetic helpers
# ------------------------------------------------------------------------------------------------

_MAX_DENOMINATOR_BITS = 4096
_CAP_BITS = 2048


def _cap(q: Cost) -> Cost:
    """Keep exact rationals small: if the denominator explodes (many distinct non-dyadic costs), round
    *up* to a multiple of 2**-2048 (a change far below any float's resolution, and never downwards)."""
    if isinstance(q, Fraction) and q.denominator.bit_length() > _MAX_DENOMINATOR_BITS:
        scaled = -((-q.numerator << _CAP_BITS) // q.denominator)  # ceil(q · 2**CAP)
        return Fraction(scaled, 1 << _CAP_BITS)
    return q


def _f(x: float) -> Cost:
    return INF if math.isinf(x) else Fraction(x)


def _mul(count: int, c: Cost) -> Cost:
    return Fraction(0) if count == 0 else _cap(count * c)


def _add(a: Cost, b: Cost) -> Cost:
    return _cap(a + b)


def _unsupported(event: PrivacyEvent, path: str, currency: str, hint: str = "") -> UnsupportedEventError:
    where = "" if path == "event" else f" at {path}"
    msg = f"Cannot account {event!r}{where} in {currency}: unsupported event kind {event.kind!r}."
    if hint:
        msg += " " + hint
    return UnsupportedEventError(msg)


# ------------------------------------------------------------------------------------------------
# Per-event costs (exact rationals). ``path`` names the sub-event in error messages.
# ------------------------------------------------------------------------------------------------


_ZERO: Cost = Fraction(0)


def _max_cost(parts: list[Cost], *_: object) -> Cost:
    return max(parts, default=Fraction(0))


def pure_cost(
    event: PrivacyEvent, *, ex_post: Literal["max", "realized"] = "max", path: str = "event"
) -> Cost:
    """The pure-ε cost of ``event`` (exact rational, or ``inf``).

    NoisyArgmax/PureDP/RR → ε; Laplace → 1/nm; Peeling → 3s/nm (s report-noisy-max rounds at 2/nm each,
    plus the Laplace release of s coordinates with ℓ1 sensitivity s·λ at scale nm·λ → s/nm; see
    ``docs/privacy/peeling_accounting.md``); ApproxDP with δ = 0 → ε; ExPost with δ = 0 → ε_max
    (``ex_post="max"``) or ε_realized (``ex_post="realized"``, for filters only); NonPrivate → ∞;
    Composed → sum; SelfComposed → count × cost; ParallelComposed → max.

    Raises:
      UnsupportedEventError: for Gaussian, zCDP, Poisson-sampled, δ > 0 events (naming the sub-event).
    """
    return fold_event(
        event,
        lambda e, where: _pure_leaf(e, where, ex_post),
        zero=_ZERO,
        add=_add,
        times=_mul,
        worst=_max_cost,
        path=path,
    )


def _pure_leaf(event: PrivacyEvent, path: str, ex_post: Literal["max", "realized"]) -> Cost:
    if isinstance(event, NonPrivateEvent):
        return INF
    if isinstance(event, PureDPEvent | NoisyArgmaxEvent | RandomizedResponseEvent):
        return _f(event.epsilon)
    if isinstance(event, LaplaceEvent):
        return 1 / Fraction(event.noise_multiplier)
    if isinstance(event, PeelingEvent):
        return 3 * Fraction(event.sparsity) / Fraction(event.noise_multiplier)
    if isinstance(event, ApproxDPEvent) and event.delta == 0.0:
        return _f(event.epsilon)
    if isinstance(event, ExPostEvent) and event.delta == 0.0:
        return _f(event.epsilon_max if ex_post == "max" else event.epsilon_realized)
    hint = {
        GaussianEvent: "A Gaussian mechanism is not pure-DP; use ZCDPAccountant or RDPAccountant.",
        ZCDPEvent: "zCDP does not imply pure DP; use ZCDPAccountant.",
        PoissonSampledEvent: "Use RDPAccountant for Poisson-sampled events.",
        ApproxDPEvent: "An (ε, δ) event with δ > 0 is not pure-DP; use ApproxDPAccountant.",
        ExPostEvent: "An ex-post event with δ > 0 is not pure-DP; use ApproxDPAccountant or ExPostFilter.",
    }.get(type(event), "")
    raise _unsupported(event, path, "pure ε-DP", hint)


def zcdp_cost(event: PrivacyEvent, *, path: str = "event") -> Cost:
    """The ρ-zCDP cost of ``event`` (exact rational, or ``inf``).

    ZCDP → ρ; NoisyArgmax → ε²/8 (bounded range, Cesar & Rogers 2021, arXiv 2004.07223v2, Lemma 3.2 —
    *theorem number unverified*); Gaussian → 1/(2nm²) (Bun & Steinke 2016, Prop. 1.6); pure ε events
    (PureDP, RR, Laplace at ε = 1/nm, ApproxDP/ExPost with δ = 0 at ε / ε_max) → ε²/2 (Bun & Steinke 2016,
    Prop. 1.4); Peeling → s·(2/nm)²/2 + s·(1/nm)²/2 = 5s/(2nm²) (2s pure sub-mechanisms, each converted,
    then composed); Composed → sum; SelfComposed → count ×; ParallelComposed → max; NonPrivate → ∞.

    Raises:
      UnsupportedEventError: for δ > 0 events and Poisson-sampled events.
    """
    return fold_event(event, _zcdp_leaf, zero=_ZERO, add=_add, times=_mul, worst=_max_cost, path=path)


def _half_square(eps: float) -> Cost:
    """ε²/2, the zCDP of a pure ε-DP mechanism (∞ stays ∞)."""
    return INF if math.isinf(eps) else Fraction(eps) ** 2 / 2


def _zcdp_leaf(event: PrivacyEvent, path: str) -> Cost:
    if isinstance(event, NonPrivateEvent):
        return INF
    if isinstance(event, ZCDPEvent):
        return _f(event.rho)
    if isinstance(event, NoisyArgmaxEvent):
        eps = Fraction(event.epsilon)
        return eps * eps / 8
    if isinstance(event, GaussianEvent | LaplaceEvent):
        nm = Fraction(event.noise_multiplier)
        return 1 / (2 * nm * nm)
    if isinstance(event, PureDPEvent | RandomizedResponseEvent):
        return _half_square(event.epsilon)
    if isinstance(event, ApproxDPEvent) and event.delta == 0.0:
        return _half_square(event.epsilon)
    if isinstance(event, ExPostEvent) and event.delta == 0.0:
        return _half_square(event.epsilon_max)
    if isinstance(event, PeelingEvent):
        nm = Fraction(event.noise_multiplier)
        return 5 * Fraction(event.sparsity) / (2 * nm * nm)
    hint = {
        ApproxDPEvent: "(ε, δ)-DP with δ > 0 does not imply zCDP; use ApproxDPAccountant.",
        ExPostEvent: "Ex-post events with δ > 0 are accounted by ApproxDPAccountant / ExPostFilter.",
        PoissonSampledEvent: "Use RDPAccountant for Poisson-sampled events.",
    }.get(type(event), "")
    raise _unsupported(event, path, "zCDP", hint)


Pair = tuple[Cost, Cost]


def _add_pair(a: Pair, b: Pair) -> Pair:
    return _add(a[0], b[0]), _add(a[1], b[1])


def _mul_pair(count: int, c: Pair) -> Pair:
    return _mul(count, c[0]), _mul(count, c[1])


def _max_pair(parts: list[Pair], *_: object) -> Pair:
    return _max_cost([p[0] for p in parts]), _max_cost([p[1] for p in parts])


def approx_cost(
    event: PrivacyEvent,
    *,
    ex_post: Literal["max", "realized"] = "max",
    allow_approx: bool = True,
    path: str = "event",
) -> tuple[Cost, Cost]:
    """The (ε, δ) cost of ``event`` under basic composition (exact rationals).

    ApproxDP → (ε, δ) (refused when ``allow_approx=False``: the ex-post filter does not accept
    event-form steps yet, because it would have to settle them at exactly their reserved ε; see
    ``docs/privacy/filters.md``); ExPost → (ε_max, δ) or, for filters settling,
    (ε_realized, δ); pure events → (pure cost, 0); NonPrivate → (∞, 0); Composed → coordinate-wise sum;
    SelfComposed → count ×; ParallelComposed → coordinate-wise max.

    Raises:
      UnsupportedEventError: Gaussian (which δ?), zCDP, Poisson-sampled events.
    """
    return fold_event(
        event,
        lambda e, where: _approx_leaf(e, where, ex_post, allow_approx),
        zero=(_ZERO, _ZERO),
        add=_add_pair,
        times=_mul_pair,
        worst=_max_pair,
        path=path,
    )


def _approx_leaf(
    event: PrivacyEvent, path: str, ex_post: Literal["max", "realized"], allow_approx: bool
) -> Pair:
    if isinstance(event, ApproxDPEvent) and event.delta > 0.0:
        if not allow_approx:
            raise _unsupported(
                event,
                path,
                "the ex-post filter",
                "An event-form (ε, δ) guarantee does not bound the privacy loss pointwise; "
                "account it with ApproxDPAccountant.",
            )
        return _f(event.epsilon), Fraction(event.delta)
    if isinstance(event, ExPostEvent):
        eps = event.epsilon_max if ex_post == "max" else event.epsilon_realized
        return _f(eps), Fraction(event.delta)
    if isinstance(event, GaussianEvent):
        raise _unsupported(
            event,
            path,
            "basic (ε, δ) composition",
            "Choose δ explicitly: ApproxDPEvent(epsilon=gaussian_epsilon(nm, delta), delta=delta), "
            "or use ZCDPAccountant / RDPAccountant.",
        )
    if isinstance(event, ZCDPEvent):
        raise _unsupported(
            event, path, "basic (ε, δ) composition", "Use ZCDPAccountant, or convert with zcdp_to_approx_dp."
        )
    if isinstance(event, PoissonSampledEvent):
        raise _unsupported(event, path, "basic (ε, δ) composition", "Use RDPAccountant.")
    return _pure_leaf(event, path, ex_post), Fraction(0)


# ------------------------------------------------------------------------------------------------
# Accountants
# ------------------------------------------------------------------------------------------------


class Accountant(ABC):
    """Base class: a transactional ledger of privacy events.

    Subclasses implement ``_increment(event)`` (pure: returns the cost of one occurrence or raises
    :class:`UnsupportedEventError`), ``_commit(increment, count)`` (must not raise) and the getters.
    """

    #: Human-readable currency name used in messages.
    currency: str = "abstract"

    def __init__(self) -> None:
        self._ledger: list[tuple[PrivacyEvent, int]] = []
        self._unit: str | None = None
        self._relation: str | None = None

    # -- contract ----------------------------------------------------------------------------------
    @property
    def ledger(self) -> tuple[tuple[PrivacyEvent, int], ...]:
        """Every composed ``(event, count)`` in order (an immutable snapshot)."""
        return tuple(self._ledger)

    @property
    def unit(self) -> str | None:
        """The privacy unit fixed by the first composed event (``None`` while empty)."""
        return self._unit

    @property
    def relation(self) -> str | None:
        """The neighbouring relation fixed by the first composed event (``None`` while empty)."""
        return self._relation

    def supports(self, event: PrivacyEvent) -> bool:
        """Whether ``event`` (with every nested sub-event) can be accounted here."""
        if not isinstance(event, PrivacyEvent):
            return False
        try:
            self._increment(event)
        except UnsupportedEventError:
            return False
        return True

    def compose(self, event: PrivacyEvent, count: int = 1) -> Accountant:
        """Account ``count`` adaptive repetitions of ``event``; returns ``self``.

        Transactional: validation and the cost computation happen first; on any error the state and the
        ledger are unchanged.

        Args:
          event: The event to compose.
          count: Number of repetitions, ``count >= 0``.

        Returns:
          ``self``, so calls can be chained.

        Raises:
          TypeError: ``event`` is not a :class:`PrivacyEvent` or ``count`` not an int.
          PrivacyParameterError: ``count < 0``.
          UnsupportedEventError: ``event`` or a nested sub-event cannot be accounted here, or its
            ``unit``/``relation`` differ from the ledger's.
        """
        if not isinstance(event, PrivacyEvent):
            raise TypeError(
                f"The 'event' parameter must be a PrivacyEvent. Got {type(event).__name__} instead."
            )
        count = check_int(count, "count", low=0)
        if self._unit is not None and (event.unit, event.relation) != (self._unit, self._relation):
            raise UnsupportedEventError(
                f"{type(self).__name__} holds a ledger for unit={self._unit!r}, relation={self._relation!r}; "
                f"cannot compose {event!r} with unit={event.unit!r}, relation={event.relation!r}. "
                "Use one accountant per privacy unit and neighbouring relation."
            )
        increment = self._increment(event)
        self._commit(increment, count)
        self._ledger.append((event, count))
        if self._unit is None:
            self._unit, self._relation = event.unit, event.relation
        return self

    @abstractmethod
    def _increment(self, event: PrivacyEvent):  # pragma: no cover - abstract
        ...

    @abstractmethod
    def _commit(self, increment, count: int) -> None:  # pragma: no cover - abstract
        ...

    @abstractmethod
    def get_epsilon(self, delta: float = 0.0) -> float:
        """The smallest ε this accountant can certify at ``delta`` (``inf`` if none)."""

    @abstractmethod
    def get_delta(self, epsilon: float) -> float:
        """The smallest δ this accountant can certify at ``epsilon`` (1.0 if none)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(events={len(self._ledger)})"


def _check_query_delta(delta: float) -> float:
    return check_real(delta, "delta", low=0.0, high=1.0, closed="left")


def _check_query_epsilon(epsilon: float) -> float:
    return check_real(epsilon, "epsilon", low=0.0, closed="left")


class PureDPAccountant(Accountant):
    """Basic composition of pure ε-DP: ε_total = Σ count_i · ε_i (exact, rounded up on output).

    Privacy:
      Adaptive sequential composition of ε_i-DP mechanisms is (Σ ε_i)-DP for the unit and relation of
      the ledger. Parallel-composed events cost the max of their parts (disjoint, data-independent
      partition).

    References:
      Dwork & Roth 2014, "The Algorithmic Foundations of Differential Privacy", Theorem 3.16 (basic
      composition; the adaptive version is their Theorem 3.20 with δ' = 0).
    """

    currency = "pure ε-DP"

    def __init__(self) -> None:
        super().__init__()
        self._total: Cost = Fraction(0)

    def _increment(self, event: PrivacyEvent) -> Cost:
        return pure_cost(event)

    def _commit(self, increment: Cost, count: int) -> None:
        self._total = _add(self._total, _mul(count, increment))

    def get_epsilon(self, delta: float = 0.0) -> float:
        """Total ε (independent of ``delta`` ∈ [0, 1), which is validated)."""
        _check_query_delta(delta)
        return fraction_to_float_up(self._total)

    def get_delta(self, epsilon: float) -> float:
        """δ(ε) for an ε_total-DP mechanism: 0 if ε ≥ ε_total, else (e^{ε_tot} − e^ε)/(1 + e^{ε_tot}).

        Every ε_tot-DP mechanism is a post-processing of binary randomized response with parameter ε_tot
        (Kairouz, Oh & Viswanath 2015, arXiv 1311.0776 — *theorem number unverified*), whose hockey-stick
        divergence at ε is the expression above.
        """
        epsilon = _check_query_epsilon(epsilon)
        total = fraction_to_float_up(self._total)
        if math.isinf(total):
            return 1.0
        if epsilon >= total:
            return 0.0
        d = -math.expm1(epsilon - total) / (1.0 + math.exp(-total))
        return min(1.0, d * (1 + 1e-12) + 1e-300)


class ZCDPAccountant(Accountant):
    """Additive composition of ρ-zCDP; conversion to (ε, δ) by
    :func:`~privalign.accounting.conversions.zcdp_to_approx_dp` (CKS20, never worse than BS16).

    Privacy:
      Adaptive composition of ρ_i-zCDP mechanisms is (Σ ρ_i)-zCDP; NoisyArgmax costs ε²/8 (bounded range),
      Gaussian 1/(2nm²), pure ε events ε²/2, Peeling 5s/(2nm²). See :func:`zcdp_cost`.

    References:
      Bun & Steinke 2016, arXiv 1605.02065v1 (Prop. 1.3, 1.4, 1.6; composition Lemma 1.7 — *theorem
      number unverified*); Cesar & Rogers 2021, arXiv 2004.07223 (bounded range ⇒ ε²/8-zCDP);
      Canonne, Kamath & Steinke 2020, arXiv 2004.00010 (Prop. 12 in v4).
    """

    currency = "zCDP"

    def __init__(self) -> None:
        super().__init__()
        self._rho: Cost = Fraction(0)

    def _increment(self, event: PrivacyEvent) -> Cost:
        return zcdp_cost(event)

    def _commit(self, increment: Cost, count: int) -> None:
        self._rho = _add(self._rho, _mul(count, increment))

    def get_rho(self) -> float:
        """Total ρ, rounded up."""
        return fraction_to_float_up(self._rho)

    def get_epsilon(self, delta: float = 0.0) -> float:
        """ε at ``delta``: 0 if ρ = 0; ∞ at δ = 0 when ρ > 0; else ``zcdp_to_approx_dp(ρ, δ)``."""
        delta = _check_query_delta(delta)
        rho = self.get_rho()
        if rho == 0.0:
            return 0.0
        if delta == 0.0 or math.isinf(rho):
            return math.inf
        return zcdp_to_approx_dp(rho, delta)

    def get_delta(self, epsilon: float) -> float:
        """δ at ``epsilon``: the smallest of the CKS20 bound (minimised over the order α, any α is valid),
        the BS16 bound exp(−(ε − ρ)²/(4ρ)) (ε ≥ ρ) and the total-variation bound sqrt(1 − e^{−ρ})
        (Bretagnolle–Huber with KL ≤ ρ, as in dp_accounting's ``compute_delta``); rounded up."""
        epsilon = _check_query_epsilon(epsilon)
        rho = self.get_rho()
        if rho == 0.0:
            return 0.0
        if math.isinf(rho):
            return 1.0
        best = 0.0  # log δ ≤ 0 always valid (δ = 1)
        # δ(ε) ≤ δ(0) = TV ≤ sqrt(1 − e^{−KL}) with KL ≤ ρ (Bretagnolle–Huber; the α → 1 limit of ρα).
        best = min(best, 0.5 * math.log(-math.expm1(-rho)))
        if epsilon >= rho:
            best = min(best, -((epsilon - rho) ** 2) / (4.0 * rho))

        def log_delta(alpha: float) -> float:
            return (alpha - 1.0) * (alpha * rho - epsilon + math.log1p(-1.0 / alpha)) - math.log(alpha)

        from scipy import optimize

        guess = max(1.0 + 1e-6, (epsilon + rho) / (2.0 * rho))
        res = optimize.minimize_scalar(
            lambda la: log_delta(1.0 + math.exp(la)),
            bounds=(math.log(1e-6), math.log(max(guess * 100.0, 2.0))),
            method="bounded",
        )
        for alpha in (1.0 + math.exp(float(res.x)), guess):
            if alpha > 1.0:
                best = min(best, log_delta(alpha))
        return min(1.0, math.exp(best) * (1 + 1e-9) + 1e-300)


class ApproxDPAccountant(Accountant):
    """Basic composition of (ε, δ)-DP: (Σ ε_i, Σ δ_i).

    What each event costs (see :func:`approx_cost`): ApproxDP → (ε, δ); pure events → (ε, 0);
    ExPost → (ε_max, δ) — the *worst case*: an ex-post bound ε_max holding with probability ≥ 1 − δ
    implies (ε_max, δ)-DP ex ante, whereas summing realized ex-post losses in an accountant would not be
    an ex-ante guarantee (use :class:`~privalign.accounting.filters.ExPostFilter` for that). Gaussian and
    zCDP events are refused: the caller must choose δ explicitly (wrap them in an ``ApproxDPEvent`` built
    with :func:`~privalign.accounting.conversions.gaussian_epsilon`), or use ZCDP/RDP accountants.

    ``get_epsilon(delta)`` returns ε_total if ``delta ≥ δ_total`` and ∞ otherwise; ``get_delta(epsilon)``
    returns δ_total if ``epsilon ≥ ε_total`` and 1 otherwise.

    References:
      Dwork & Roth 2014, Theorem 3.16 (basic composition, adaptive).
    """

    currency = "basic (ε, δ)"

    def __init__(self) -> None:
        super().__init__()
        self._eps: Cost = Fraction(0)
        self._delta: Cost = Fraction(0)

    def _increment(self, event: PrivacyEvent) -> tuple[Cost, Cost]:
        return approx_cost(event)

    def _commit(self, increment: tuple[Cost, Cost], count: int) -> None:
        self._eps = _add(self._eps, _mul(count, increment[0]))
        self._delta = _add(self._delta, _mul(count, increment[1]))

    def get_total(self) -> tuple[float, float]:
        """(ε_total, δ_total), both rounded up."""
        return fraction_to_float_up(self._eps), fraction_to_float_up(self._delta)

    def get_epsilon(self, delta: float = 0.0) -> float:
        delta = _check_query_delta(delta)
        eps, d = self.get_total()
        return eps if delta >= d else math.inf

    def get_delta(self, epsilon: float) -> float:
        epsilon = _check_query_epsilon(epsilon)
        eps, d = self.get_total()
        return min(1.0, d) if epsilon >= eps else 1.0
