"""Privacy events: immutable, validated values that describe what a mechanism cost.

An event says *which mechanism ran at which parameters*; an accountant turns events into guarantees
(ε, (ε, δ), ρ). Events are validated at construction (an invalid event cannot exist) and round-trip
through ``to_dict``/``from_dict`` with a ``"kind"`` tag (golden JSON in ``tests/golden/events.json``).

Compatibility contract (after dp_accounting's ``dp_event.py``): the meaning of an existing kind or
field never changes; new mechanisms get new kinds.

Every event carries the privacy ``unit`` it protects (``"record"``, ``"sample"``, ``"label"``,
``"user"``) and the neighbouring ``relation`` (``"replace_one"`` or ``"add_remove_one"``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from privalign._validation import check_choice, check_int, check_real
from privalign.errors import PrivacyParameterError

__all__ = [
    "PrivacyEvent",
    "NonPrivateEvent",
    "PureDPEvent",
    "ApproxDPEvent",
    "ZCDPEvent",
    "ExPostEvent",
    "NoisyArgmaxEvent",
    "GaussianEvent",
    "LaplaceEvent",
    "RandomizedResponseEvent",
    "PeelingEvent",
    "PoissonSampledEvent",
    "ComposedEvent",
    "SelfComposedEvent",
    "ParallelComposedEvent",
    "event_from_dict",
    "fold_event",
    "UNITS",
    "RELATIONS",
]

UNITS = ("record", "sample", "label", "user")
RELATIONS = ("replace_one", "add_remove_one")

_REGISTRY: dict[str, type[PrivacyEvent]] = {}


@dataclass(frozen=True, kw_only=True)
class PrivacyEvent:
    """Base class. Subclasses set ``kind`` and validate their fields in ``_validate``."""

    kind: ClassVar[str] = "abstract"
    unit: str = "record"
    relation: str = "replace_one"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        k = cls.__dict__.get("kind")
        if k and k != "abstract":
            if k in _REGISTRY:
                raise RuntimeError(f"duplicate event kind {k!r}")
            _REGISTRY[k] = cls

    def __post_init__(self) -> None:
        check_choice(self.unit, "unit", UNITS)
        check_choice(self.relation, "relation", RELATIONS)
        self._validate()

    def _validate(self) -> None:  # pragma: no cover - overridden
        pass

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict with a ``kind`` tag; nested events are dicts too."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, PrivacyEvent):
                v = v.to_dict()
            elif isinstance(v, tuple) and v and isinstance(v[0], PrivacyEvent):
                v = [e.to_dict() for e in v]
            elif isinstance(v, float) and math.isinf(v):
                v = "inf"
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyEvent:
        """Inverse of :meth:`to_dict`; validates, and checks the kind matches ``cls`` if not the base."""
        ev = event_from_dict(data)
        if cls is not PrivacyEvent and not isinstance(ev, cls):
            raise PrivacyParameterError(
                f"Expected an event of kind {cls.kind!r}. Got kind {data.get('kind')!r} instead."
            )
        return ev


def event_from_dict(data: dict[str, Any]) -> PrivacyEvent:
    """Rebuild any event from its ``to_dict`` form."""
    if not isinstance(data, dict) or "kind" not in data:
        raise PrivacyParameterError(f"An event dict must have a 'kind' key. Got {data!r} instead.")
    kind = data["kind"]
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise PrivacyParameterError(
            f"The 'kind' of an event must be one of {sorted(_REGISTRY)}. Got {kind!r} instead."
        )
    kwargs: dict[str, Any] = {}
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key == "kind":
            continue
        if key not in names:
            raise PrivacyParameterError(
                f"Unknown field {key!r} for event kind {kind!r}; expected {sorted(names)}."
            )
        if key == "event":
            value = event_from_dict(value)
        elif key == "events":
            value = tuple(event_from_dict(v) for v in value)
        elif value == "inf":
            value = math.inf
        kwargs[key] = value
    return cls(**kwargs)


# ------------------------------------------------------------------------------------------------
# Generic guarantees
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NonPrivateEvent(PrivacyEvent):
    """A release with no privacy guarantee (e.g. plain Best-of-N). Every accountant returns ∞."""

    kind: ClassVar[str] = "non_private"

    def _validate(self) -> None:
        pass


@dataclass(frozen=True, kw_only=True)
class PureDPEvent(PrivacyEvent):
    """A mechanism that is ε-DP (pure)."""

    kind: ClassVar[str] = "pure_dp"
    epsilon: float

    def _validate(self) -> None:
        check_real(self.epsilon, "epsilon", low=0.0, closed="left")


@dataclass(frozen=True, kw_only=True)
class ApproxDPEvent(PrivacyEvent):
    """A mechanism that is (ε, δ)-DP (event form: Pr[M(D)∈E] ≤ e^ε Pr[M(D')∈E] + δ)."""

    kind: ClassVar[str] = "approx_dp"
    epsilon: float
    delta: float

    def _validate(self) -> None:
        check_real(self.epsilon, "epsilon", low=0.0, closed="left")
        check_real(self.delta, "delta", low=0.0, high=1.0, closed="left")


@dataclass(frozen=True, kw_only=True)
class ZCDPEvent(PrivacyEvent):
    """A mechanism that is ρ-zCDP (Bun & Steinke 2016, arXiv 1605.02065)."""

    kind: ClassVar[str] = "zcdp"
    rho: float

    def _validate(self) -> None:
        check_real(self.rho, "rho", low=0.0, closed="left")


@dataclass(frozen=True, kw_only=True)
class ExPostEvent(PrivacyEvent):
    """An ex-post private release: realized loss ``epsilon_realized`` (a function of the output),
    never above the data-independent ``epsilon_max``; ``delta`` is the probability (over the
    mechanism's own randomness) that the realized bound fails (0 for pure ex-post DP).

    ``epsilon_max`` is what a filter reserves before the mechanism runs; ``epsilon_realized`` is what it
    settles afterwards. ``details`` keeps diagnostics (e.g. PrivITP's λ̃ and stopping time) and is not
    used by accountants.
    """

    kind: ClassVar[str] = "ex_post"
    epsilon_realized: float
    epsilon_max: float
    delta: float = 0.0
    details: dict = field(default_factory=dict, compare=False, hash=False)

    def _validate(self) -> None:
        check_real(self.epsilon_realized, "epsilon_realized", low=0.0, closed="left")
        check_real(self.epsilon_max, "epsilon_max", low=0.0, closed="left")
        check_real(self.delta, "delta", low=0.0, high=1.0, closed="left")
        if self.epsilon_realized > self.epsilon_max:
            raise PrivacyParameterError(
                f"The 'epsilon_realized' parameter must be at most epsilon_max={self.epsilon_max!r}. "
                f"Got {self.epsilon_realized!r} instead."
            )
        if not isinstance(self.details, dict):
            raise TypeError(
                f"The 'details' parameter must be a dict. Got {type(self.details).__name__} instead."
            )


# ------------------------------------------------------------------------------------------------
# Mechanism-specific events (accountants may know tighter bounds for these)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NoisyArgmaxEvent(PrivacyEvent):
    """Gumbel noisy-argmax at scale 2Δ/ε (PrivBoN): the exponential mechanism, hence ε-DP
    (McSherry & Talwar 2007), ε-bounded-range (Durfee & Rogers 2019) and ε²/8-zCDP
    (Cesar & Rogers 2021, arXiv 2004.07223)."""

    kind: ClassVar[str] = "noisy_argmax"
    epsilon: float

    def _validate(self) -> None:
        check_real(self.epsilon, "epsilon", low=0.0, closed="neither")


@dataclass(frozen=True, kw_only=True)
class GaussianEvent(PrivacyEvent):
    """The Gaussian mechanism with ``noise_multiplier`` = σ / Δ₂ (noise std over ℓ2 sensitivity).

    ρ = 1/(2·noise_multiplier²)-zCDP (Bun & Steinke 2016, Prop. 1.6); exact (ε, δ) curve by
    Balle & Wang 2018, Thm. 8.
    """

    kind: ClassVar[str] = "gaussian"
    noise_multiplier: float

    def _validate(self) -> None:
        check_real(self.noise_multiplier, "noise_multiplier", low=0.0, closed="neither")


@dataclass(frozen=True, kw_only=True)
class LaplaceEvent(PrivacyEvent):
    """The Laplace mechanism with ``noise_multiplier`` = b / Δ₁: (1/noise_multiplier)-DP."""

    kind: ClassVar[str] = "laplace"
    noise_multiplier: float

    def _validate(self) -> None:
        check_real(self.noise_multiplier, "noise_multiplier", low=0.0, closed="neither")


@dataclass(frozen=True, kw_only=True)
class RandomizedResponseEvent(PrivacyEvent):
    """Binary randomized response, keep with prob. e^ε/(1+e^ε): ε-DP for the bit (Warner 1965)."""

    kind: ClassVar[str] = "randomized_response"
    epsilon: float

    def _validate(self) -> None:
        check_real(self.epsilon, "epsilon", low=0.0, closed="neither")

    @property
    def flip_probability(self) -> float:
        return 1.0 / (1.0 + math.exp(self.epsilon))


@dataclass(frozen=True, kw_only=True)
class PeelingEvent(PrivacyEvent):
    """Peeling top-s (Cai, Wang & Zhang 2021): ``sparsity`` rounds of Laplace report-noisy-max plus a
    Laplace release of the ``sparsity`` selected coordinates, all at Laplace scale
    ``noise_multiplier`` × λ (λ = ℓ∞ sensitivity of the input vector).

    ``target_epsilon``/``target_delta`` record the (ε, δ) the scale was calibrated for (informative);
    accountants compute the cost from ``sparsity`` and ``noise_multiplier`` (spec §4 option (b)).
    """

    kind: ClassVar[str] = "peeling"
    sparsity: int
    noise_multiplier: float
    target_epsilon: float | None = None
    target_delta: float | None = None

    def _validate(self) -> None:
        check_int(self.sparsity, "sparsity", low=1)
        check_real(self.noise_multiplier, "noise_multiplier", low=0.0, closed="neither")
        if self.target_epsilon is not None:
            check_real(self.target_epsilon, "target_epsilon", low=0.0)
        if self.target_delta is not None:
            check_real(self.target_delta, "target_delta", low=0.0, high=1.0)


@dataclass(frozen=True, kw_only=True)
class PoissonSampledEvent(PrivacyEvent):
    """``event`` applied to a Poisson subsample with inclusion probability ``sampling_probability``."""

    kind: ClassVar[str] = "poisson_sampled"
    sampling_probability: float
    event: PrivacyEvent

    def _validate(self) -> None:
        check_real(self.sampling_probability, "sampling_probability", low=0.0, high=1.0, closed="right")
        if not isinstance(self.event, PrivacyEvent):
            raise TypeError(
                f"The 'event' parameter must be a PrivacyEvent. Got {type(self.event).__name__} instead."
            )


# ------------------------------------------------------------------------------------------------
# Composition
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ComposedEvent(PrivacyEvent):
    """Sequential (adaptive) composition of ``events``, all on the same data."""

    kind: ClassVar[str] = "composed"
    events: tuple[PrivacyEvent, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))
        super().__post_init__()

    def _validate(self) -> None:
        for i, e in enumerate(self.events):
            if not isinstance(e, PrivacyEvent):
                raise TypeError(
                    f"The 'events[{i}]' parameter must be a PrivacyEvent. Got {type(e).__name__} instead."
                )


@dataclass(frozen=True, kw_only=True)
class SelfComposedEvent(PrivacyEvent):
    """``count`` adaptive repetitions of ``event`` on the same data."""

    kind: ClassVar[str] = "self_composed"
    event: PrivacyEvent
    count: int

    def _validate(self) -> None:
        if not isinstance(self.event, PrivacyEvent):
            raise TypeError(
                f"The 'event' parameter must be a PrivacyEvent. Got {type(self.event).__name__} instead."
            )
        check_int(self.count, "count", low=0)


@dataclass(frozen=True, kw_only=True)
class ParallelComposedEvent(PrivacyEvent):
    """``events`` run on *disjoint* parts of the data, each part chosen independently of the data
    (e.g. Sample-DP IHT's batches). Under replace-one, the cost is the maximum of the parts' costs
    (parallel composition; adaptive choice of later mechanisms is allowed because each record is
    touched by exactly one of them)."""

    kind: ClassVar[str] = "parallel_composed"
    events: tuple[PrivacyEvent, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))
        super().__post_init__()

    def _validate(self) -> None:
        for i, e in enumerate(self.events):
            if not isinstance(e, PrivacyEvent):
                raise TypeError(
                    f"The 'events[{i}]' parameter must be a PrivacyEvent. Got {type(e).__name__} instead."
                )


_T = TypeVar("_T")


def fold_event(
    event: PrivacyEvent,
    leaf: Callable[[PrivacyEvent, str], _T],
    *,
    zero: _T,
    add: Callable[[_T, _T], _T],
    times: Callable[[int, _T], _T],
    worst: Callable[[list[_T], ParallelComposedEvent, str], _T],
    path: str = "event",
) -> _T:
    """The one walk over composed events: fold ``event`` into a cost, leaf by leaf.

    Every accountant's cost is defined by the same three composition rules, so they live here once:

    * ``ComposedEvent`` (sequential): ``add`` over the parts' costs, starting from ``zero``;
    * ``SelfComposedEvent``: ``times(count, cost of the inner event)``;
    * ``ParallelComposedEvent`` (disjoint parts): ``worst(parts' costs, event, path)`` — the maximum for
      basic composition; the RDP adapter merges identical parts instead.

    Any other event is a leaf, costed by ``leaf(event, path)``. ``path`` names the sub-event
    (``event.events[2].event``) so that an unsupported leaf can be reported where it sits.

    Args:
      event: the event to cost.
      leaf: the cost of one non-composite event (raises for unsupported kinds).
      zero: the cost of nothing (the start of a sequential sum).
      add: sequential composition of two costs.
      times: ``count`` sequential repetitions of one cost.
      worst: the cost of parallel parts, given their costs, the event and its path.
      path: the name of ``event`` in messages.

    Returns:
      The folded cost.
    """

    def walk(ev: PrivacyEvent, where: str) -> _T:
        if isinstance(ev, ComposedEvent):
            total = zero
            for i, e in enumerate(ev.events):
                total = add(total, walk(e, f"{where}.events[{i}]"))
            return total
        if isinstance(ev, SelfComposedEvent):
            return times(ev.count, walk(ev.event, f"{where}.event"))
        if isinstance(ev, ParallelComposedEvent):
            return worst([walk(e, f"{where}.events[{i}]") for i, e in enumerate(ev.events)], ev, where)
        return leaf(ev, where)

    return walk(event, path)
