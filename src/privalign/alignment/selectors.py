"""The one owner of "which selection methods exist": the method registry, :class:`SelectorSpec` (a method
and its parameters, parsed once by each front end) and :func:`make_selector`.

Each selector class declares its method (:class:`~privalign.alignment.base.MethodBase`): the name, the
display label, whether it is private, its parameters (:class:`~privalign.alignment.base.Param`), how many
candidates one query needs and how they are laid out (:class:`~privalign.alignment.base.CandidateLayout`;
``pick`` selects from the flat list), how to build it from its parameters and, for a server, from a
budget. Everything above this module — the CLI (``select``, ``simulate``, ``session``), the sessions, the
simulation engine, the experiments and the service — asks the registry and the selector instead of
branching on method names. A new method is one module: a class registered with :func:`register`.

Privacy:
  This module only constructs selectors; each selector's docstring states its guarantee, privacy unit and
  neighbouring relation (PrivBoN: ε-DP per query; PrivITP: ex-post (ε, δ); BoN/ITP: none).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from numpy.typing import ArrayLike

from privalign._validation import check_choice, check_int
from privalign.accounting.events import PrivacyEvent
from privalign.alignment.base import BatchSelection, CandidateLayout, Selection, SelectionLaw
from privalign.errors import PrivacyParameterError

__all__ = [
    "METHODS",
    "Selector",
    "SelectorSpec",
    "check_method",
    "label",
    "make_selector",
    "method_class",
    "methods",
    "pool_size",
    "register",
    "unregister",
    "uses_two_pools",
]

#: The built-in methods, non-private first, each ``module:class`` (imported on first use: the CLI's
#: ``--help`` imports none of them).
_BUILTIN = {
    "bon": "privalign.alignment.bon:BestOfN",
    "itp": "privalign.alignment.itp:InferenceTimePessimism",
    "privbon": "privalign.alignment.priv_bon:PrivBoN",
    "privitp": "privalign.alignment.priv_itp:PrivITP",
}
#: Methods registered at run time (:func:`register`), in registration order.
_EXTRA: dict[str, type] = {}
_LOADED: dict[str, type] = {}

#: The built-in selection methods, non-private first (``methods()`` adds the registered ones).
METHODS = tuple(_BUILTIN)


@runtime_checkable
class Selector(Protocol):
    """What every inference-time selector provides (BoN, ITP, PrivBoN, PrivITP, or a registered one).

    ``worst_case_event(n)`` is data-independent (what a filter reserves before any score is read);
    ``select``/``select_batch`` return the realized event with the choice; ``law`` is the exact law;
    ``pick`` selects from a flat candidate list laid out by the class's ``layout``.
    """

    name: str
    private: bool
    layout: CandidateLayout

    def worst_case_event(self, n: int) -> PrivacyEvent: ...

    def worst_case_epsilon(self, n: int) -> float: ...

    def candidates_needed(self, n: int) -> int: ...

    def select(self, scores: ArrayLike, *, rng: Any, pool_b_scores: ArrayLike | None = None) -> Selection: ...

    def select_batch(
        self, scores: ArrayLike, *, rng: Any, pool_b_scores: ArrayLike | None = None
    ) -> BatchSelection: ...

    def law(self, scores: ArrayLike, *, pool_b_scores: ArrayLike | None = None) -> SelectionLaw: ...

    def pick(self, candidates: ArrayLike, *, rng: Any) -> Selection: ...


def methods() -> tuple[str, ...]:
    """Every method name: the built-in ones, then the registered ones."""
    return METHODS + tuple(_EXTRA)


def register(cls: type) -> type:
    """Register a selector class (a :class:`~privalign.alignment.base.MethodBase` subclass with a new
    ``name``): ``make_selector``, :class:`SelectorSpec`, the CLI, the simulation engine and the service then
    accept it. Usable as a class decorator; returns ``cls``.

    Raises:
      PrivacyParameterError: the name is taken or empty.
    """
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or name in _BUILTIN or name in _EXTRA:
        raise PrivacyParameterError(
            f"A selector class needs a new, non-empty 'name'. Got {name!r} (taken: {list(methods())})."
        )
    _EXTRA[name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a method registered with :func:`register` (built-in ones stay)."""
    _EXTRA.pop(name, None)


def check_method(method: Any, name: str = "method") -> str:
    """The one check of a method name: returns ``method`` if it is in :func:`methods`.

    Args:
      method: The name to check.
      name: Where the caller's user wrote it (``method``, ``kind``, ``privacy.allowed_methods``): the
        parameter the message names. The rest of the message is the same everywhere.

    Raises:
      PrivacyParameterError: ``The '<name>' parameter must be one of ['bon', 'itp', 'privbon', 'privitp'].
        Got <method> instead.``
    """
    return check_choice(method, name, methods())


def method_class(method: str) -> Any:
    """The selector class of ``method`` (checked by :func:`check_method`)."""
    method = check_method(method)
    if method in _EXTRA:
        return _EXTRA[method]
    if method not in _LOADED:
        module, cls = _BUILTIN[method].split(":")
        _LOADED[method] = getattr(importlib.import_module(module), cls)
    return _LOADED[method]


def label(method: str) -> str:
    """The display label of ``method``: its class's ``label`` (``"PrivITP"``), else its name. What the
    experiments' records, figures and report show; compare with it instead of spelling the label."""
    kind = method_class(method)
    return kind.label or kind.name


def uses_two_pools(method: str) -> bool:
    """Whether ``method`` needs more than one pool of ``n`` (ITP, PrivITP)."""
    return method_class(method).layout.pools > 1


def pool_size(method: str, n: int, *, fallback_candidate: bool = True) -> int:
    """Candidates one query of ``method`` consumes: ``n``, or ``2n + 1`` for the two-pool methods (phase-1
    pool A, phase-2 pool B, one fresh fallback candidate): the method's ``layout``.

    ``fallback_candidate=False`` leaves out the fallback candidate (``2n`` for the two-pool methods): the
    simulation engine credits the fallback with the prompt's base-policy mean instead of drawing one, so a
    prompt needs only the pools.
    """
    n = check_int(n, "n", low=1)
    layout = method_class(method).layout
    return layout.needed(n) if fallback_candidate else layout.pools * n


@dataclass(frozen=True)
class SelectorSpec:
    """A selection method and its parameters, as a front end parsed them (argparse, a TOML table, the
    service's ``privacy`` object); :meth:`build` makes the selector.

    ``params`` holds only what was given (``None`` values are dropped); names are checked against the
    method's declared parameters, values by the selector's constructor (:meth:`build`).
    """

    method: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, method: str, /, **params: Any) -> SelectorSpec:
        """``SelectorSpec.of("itp", beta=0.05)``.

        Raises:
          PrivacyParameterError: unknown method, or a parameter the method does not take (named).
        """
        kind = method_class(method)
        known = {p.name for p in kind.params}
        for k, v in params.items():
            if v is not None and k not in known:
                raise PrivacyParameterError(
                    f"The '{k}' parameter does not apply to method {method!r} (it takes "
                    f"{sorted(known) or 'no parameters'}). Got {v!r}."
                )
        return cls(method, tuple((k, v) for k, v in params.items() if v is not None))

    @property
    def kind(self) -> Any:
        """The method's selector class."""
        return method_class(self.method)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def get(self, name: str, default: Any = None) -> Any:
        return self.as_dict().get(name, default)

    def describe(self) -> str:
        """The method's display label for these parameters (``ITP β=0.05``)."""
        return self.kind.describe(self.as_dict())

    def resolved(self) -> dict[str, Any]:
        """The parameters with the method's defaults filled in (``default``, ``default_from``)."""
        params = self.as_dict()
        for p in self.kind.params:
            if params.get(p.name) is None:
                v = params.get(p.default_from) if p.default_from else p.default
                if v is not None:
                    params[p.name] = v
        return params

    def build(self, *, r_max: float = 1.0, sensitivity: float | None = None, clip: bool = False) -> Any:
        """The selector, on the public score range ``[0, r_max]`` with Δ_r = ``sensitivity`` (default
        ``r_max``).

        Raises:
          PrivacyParameterError: a required parameter is missing (named), or a value is out of range (the
            selector's own check).
        """
        kind = self.kind
        params = self.resolved()
        for p in kind.params:
            if p.required and params.get(p.name) is None:
                raise PrivacyParameterError(
                    f"The '{p.name}' parameter is required for method {self.method!r}. Got None instead."
                )
        return kind.from_params(params, r_max=r_max, sensitivity=sensitivity, clip=clip)


def make_selector(
    method: str | SelectorSpec,
    *,
    r_max: float = 1.0,
    sensitivity: float | None = None,
    clip: bool = False,
    **params: Any,
) -> Selector:
    """Build the selector for ``method``: a :class:`SelectorSpec`, or a name from :func:`methods` with its
    parameters as keywords.

    Args:
      method: ``bon``, ``itp``, ``privbon``, ``privitp`` (or a registered name), or a spec.
      r_max, sensitivity, clip: The public score range ``[0, r_max]``, Δ_r (default ``r_max``) and whether
        scores outside the range are clipped (instead of refused).
      params: The method's parameters (with a name: PrivBoN ``epsilon`` or ``sigma`` and ``sigma_reg``;
        ITP ``beta``; PrivITP ``beta``, ``sigma_x``, ``sigma_z`` (default ``sigma_x``), ``L``, ``delta``).
        A keyword the method does not take is ignored (one call can serve several methods); a
        :class:`SelectorSpec` refuses it instead. PrivBoN's Gumbel scale is
        :func:`~privalign.alignment.priv_bon.privbon_scale` of ε (2Δ/ε rounded up: the one ε → scale
        conversion); ``epsilon=inf`` or ``sigma=0`` gives plain BoN's law and a ``NonPrivateEvent``.

    Raises:
      PrivacyParameterError: unknown method, or a required parameter is missing (named), or a value is out
        of range (the selector's own check).
    """
    if isinstance(method, SelectorSpec):
        spec = method
    else:
        kind = method_class(method)
        known = {p.name for p in kind.params}
        spec = SelectorSpec.of(method, **{k: v for k, v in params.items() if k in known})
    return spec.build(r_max=r_max, sensitivity=sensitivity, clip=clip)
