"""The one owner of "which routes the frontier knows": the route registry.

Each route class (:class:`~privalign.experiments.routes.base.Route`) declares its family, its methods and
their privacy kinds, its seeds key, the configuration keys that change its records, and how it fits from the
private pairs at a given ε; the frontier (:mod:`privalign.experiments.frontier`) is a recipe over this
registry and never branches on a family's name. A new route is one module: a class registered with
:func:`register` (or listed in ``_BUILTIN``).

Privacy:
  This module only looks routes up; each route class's docstring states its guarantee, privacy unit and
  neighbouring relation.
"""

from __future__ import annotations

import importlib
from typing import Any

from privalign.experiments.routes._reward import LABEL_DP, LINEAR_NONPRIVATE, LINEAR_PRIVATE, RM_KEYS, TRM
from privalign.experiments.routes.base import KIND_UNITS, PolicyRoute, Route, SelectorRoute

__all__ = [
    "KIND_UNITS",
    "LABEL_DP",
    "LINEAR_NONPRIVATE",
    "LINEAR_PRIVATE",
    "RM_KEYS",
    "TRM",
    "PolicyRoute",
    "Route",
    "SelectorRoute",
    "families",
    "fields",
    "register",
    "route_class",
    "unregister",
]

#: The built-in route families, each ``module:class`` (imported on first use).
_BUILTIN = {
    "dpo": "privalign.experiments.routes.dpo:DPORoute",
    "bon": "privalign.experiments.routes.bon:BestOfNRoute",
    "grpo": "privalign.experiments.routes.grpo:GRPORoute",
    "privbon": "privalign.experiments.routes.privbon:PrivBoNRoute",
    "props": "privalign.experiments.routes.props:PROPSRoute",
    "dpprefsyn": "privalign.experiments.routes.dpprefsyn:DPPrefSynRoute",
}
_EXTRA: dict[str, type[Route]] = {}
_LOADED: dict[str, type[Route]] = {}


def families() -> tuple[str, ...]:
    """Every family: the built-in ones, then the registered ones."""
    return tuple(_BUILTIN) + tuple(_EXTRA)


def register(cls: type[Route]) -> type[Route]:
    """Register a route class with a new ``family`` (usable as a class decorator; returns ``cls``).

    Raises:
      ValueError: the family is taken or empty, or the class declares no method.
    """
    fam = getattr(cls, "family", "")
    if not isinstance(fam, str) or not fam or fam in _BUILTIN or fam in _EXTRA:
        raise ValueError(f"A route class needs a new, non-empty 'family'. Got {fam!r} (taken: {families()}).")
    if not cls.methods or set(cls.methods.values()) - set(KIND_UNITS):
        raise ValueError(f"route {fam!r}: 'methods' must map each method to one of {tuple(KIND_UNITS)}.")
    _EXTRA[fam] = cls
    return cls


def unregister(family: str) -> None:
    """Remove a family registered with :func:`register` (built-in ones stay)."""
    _EXTRA.pop(family, None)


def route_class(family: str) -> type[Route]:
    """The route class of ``family``.

    Raises:
      KeyError: an unknown family.
    """
    if family in _EXTRA:
        return _EXTRA[family]
    if family not in _LOADED:
        module, cls = _BUILTIN[family].split(":")
        _LOADED[family] = getattr(importlib.import_module(module), cls)
    return _LOADED[family]


def fields() -> dict[str, Any]:
    """The configuration keys the built-in routes add to the experiment's schema."""
    out: dict[str, Any] = {}
    for fam in _BUILTIN:
        out.update(route_class(fam).fields)
    return out
