"""The one owner of "which reward estimators exist": the estimator registry and :func:`make_estimator`.

Each estimator class declares what it is (:class:`~privalign.estimation.base.RewardEstimator`): its one
``name`` (the class name: what configurations, records, model files and reports carry), its ``aliases``
(other accepted spellings: the CLI's ``mle``, ``iht``, ``dp-iht``, ``rr-iht``, ``rr``, ``dp-sgd``), its
``privacy_kind`` (``"label"``, ``"sample"`` or ``"none"``: what its ``privacy_event_`` protects), whether
it is ``sparse``, its display ``title``, the keyword a generic step-size option sets (``step_param``) and
its experiment parameters (``params``). Everything above this module — ``fit-reward``, the rates scans,
the experiments and the reports — asks the registry and the class instead of branching on estimator
names. A new estimator is one module: a class registered with :func:`register`.

Both spellings name the same class everywhere (``estimator_class("dp-iht")`` is
``estimator_class("SampleDPIHT")``), so the committed configurations and records of either vocabulary
keep working; a caller that writes a record keeps the spelling it was given (records and reports stay as
they were).

Privacy:
  This module only constructs estimators; each estimator's docstring states its guarantee, privacy unit
  and neighbouring relation, and its ``privacy_event_`` records them.
"""

from __future__ import annotations

import importlib
from typing import Any

from privalign._validation import check_choice
from privalign.errors import PrivacyParameterError
from privalign.estimation.base import EstimatorParam

__all__ = [
    "KINDS",
    "PRIVACY_TEXT",
    "canonical",
    "check_name",
    "classes",
    "estimator_class",
    "is_estimator",
    "kind_of",
    "experiment_estimator",
    "experiment_params",
    "make_estimator",
    "names",
    "privacy_kind",
    "privacy_text",
    "register",
    "short_name",
    "spellings",
    "unregister",
]

#: The privacy kinds an estimator declares: what its event protects.
KINDS = ("none", "label", "sample")

#: The built-in estimators, ``module:class``, in the order the CLI and the scans list them (imported on
#: first use). DPTransformerRM declares no privacy kind (its ``privacy`` parameter chooses one): it is
#: resolved by name (model files) but is not one of :func:`names`.
_BUILTIN = (
    "privalign.estimation.baselines:MLE",
    "privalign.estimation.iht:IHT",
    "privalign.estimation.iht:SampleDPIHT",
    "privalign.estimation.iht:RRIHT",
    "privalign.estimation.baselines:DenseRR",
    "privalign.estimation.baselines:DPSGDLinear",
    "privalign.estimation.transformer:DPTransformerRM",
)
#: Classes registered at run time (:func:`register`), by name, in registration order.
_EXTRA: dict[str, Any] = {}
_LOADED: list[Any] = []


def _builtin() -> list[Any]:
    if not _LOADED:
        for spec in _BUILTIN:
            module, cls = spec.split(":")
            _LOADED.append(getattr(importlib.import_module(module), cls))
    return _LOADED


def _classes() -> list[Any]:
    return [*_builtin(), *_EXTRA.values()]


def _spellings_of(cls: Any) -> tuple[str, ...]:
    return (cls.name, *cls.aliases)


def _check_declaration(cls: type) -> None:
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise PrivacyParameterError(f"An estimator class needs a non-empty 'name'. Got {name!r} on {cls!r}.")
    kind = getattr(cls, "privacy_kind", None)
    if kind not in KINDS:
        raise PrivacyParameterError(
            f"The 'privacy_kind' of estimator {name!r} must be one of {list(KINDS)} (what its privacy_event_ "
            f"protects). Got {kind!r} instead."
        )
    for p in getattr(cls, "params", ()):
        if not isinstance(p, EstimatorParam):
            raise PrivacyParameterError(
                f"The 'params' of estimator {name!r} must be EstimatorParam declarations. Got {p!r}."
            )


def register(cls: Any) -> Any:
    """Register an estimator class (a :class:`~privalign.estimation.base.RewardEstimator` subclass with a new
    ``name``, new ``aliases`` and a ``privacy_kind``): :func:`make_estimator`, ``fit-reward``, the rates
    scans and the experiments then accept it under any of its spellings. Usable as a class decorator;
    returns ``cls``.

    Raises:
      PrivacyParameterError: a spelling is taken, the name is empty, the kind is not one of ``KINDS``, or an
        experiment parameter disagrees with another class's declaration of the same key.
    """
    _check_declaration(cls)
    taken = set(spellings(every=True))
    clash = [s for s in _spellings_of(cls) if s in taken]
    if clash:
        raise PrivacyParameterError(
            f"An estimator class needs a new name and new aliases. Got {clash[0]!r} (taken: {sorted(taken)})."
        )
    _EXTRA[cls.name] = cls
    try:
        experiment_params()  # shared keys must agree
    except PrivacyParameterError:
        del _EXTRA[cls.name]
        raise
    return cls


def unregister(name: str) -> None:
    """Remove a class registered with :func:`register` (built-in ones stay)."""
    _EXTRA.pop(name, None)


def classes() -> tuple[Any, ...]:
    """Every registered estimator class, DPTransformerRM included (what a model file may name)."""
    return tuple(_classes())


def spellings(*, every: bool = False) -> tuple[str, ...]:
    """Every accepted spelling of the estimators of :func:`names` (each name, then its aliases);
    ``every=True`` adds the classes without a privacy kind (DPTransformerRM)."""
    return tuple(s for cls in _classes() if every or cls.privacy_kind is not None for s in _spellings_of(cls))


def check_name(name: Any, param: str = "method") -> str:
    """The one check of an estimator name: returns ``name`` (as given) if it is a spelling of
    :func:`spellings`.

    Raises:
      PrivacyParameterError: ``The '<param>' parameter must be one of [...]. Got <name> instead.``
    """
    return check_choice(name, param, spellings())


def estimator_class(name: str) -> Any:
    """The estimator class of ``name`` (its name or an alias; DPTransformerRM included)."""
    for cls in _classes():
        if name in _spellings_of(cls):
            return cls
    check_name(name)  # raises, naming the spellings
    raise AssertionError  # pragma: no cover


def canonical(name: str) -> str:
    """The class's one name for ``name`` (``"dp-iht"`` → ``"SampleDPIHT"``)."""
    return str(estimator_class(name).name)


def is_estimator(value: object, name: str) -> bool:
    """Whether ``value`` (a record's ``method``, any spelling) names the estimator ``name``
    (``is_estimator("dp-iht", "SampleDPIHT")``); False for a value the registry does not know (a reference
    row such as ``"Oracle (judge)"``)."""
    if not isinstance(value, str) or value not in spellings(every=True):
        return False
    return canonical(value) == canonical(name)


def kind_of(value: object) -> str | None:
    """:func:`privacy_kind` of ``value``, or None for a value the registry does not know."""
    if not isinstance(value, str) or value not in spellings():
        return None
    return privacy_kind(value)


def privacy_kind(name: str) -> str:
    """What ``name``'s event protects: ``"label"``, ``"sample"`` or ``"none"``."""
    kind = estimator_class(check_name(name)).privacy_kind
    return str(kind)


#: What each privacy kind protects, as the experiments' records and figures say it.
PRIVACY_TEXT = {"none": "non-private", "sample": "sample-DP (ε, δ)", "label": "label-DP ε"}


def privacy_text(name: str) -> str:
    """What ``name``'s event protects, in the experiments' words (``privacy_text("RRIHT") == "label-DP ε"``).

    Raises:
      PrivacyParameterError: unknown name (the message lists the spellings).
    """
    return PRIVACY_TEXT[privacy_kind(name)]


def names(kind: str | None = None) -> tuple[str, ...]:
    """The estimators' names (the classes' ``name``), in registration order; ``kind`` keeps those of one
    privacy kind (``"none"``, ``"label"``, ``"sample"``)."""
    if kind is not None:
        check_choice(kind, "kind", KINDS)
    return tuple(
        c.name for c in _classes() if c.privacy_kind is not None and (kind is None or c.privacy_kind == kind)
    )


def short_name(name: str) -> str:
    """The short spelling of ``name`` (its class's first alias, e.g. ``dp-iht``; the name if it has none)."""
    cls = estimator_class(name)
    return str((*cls.aliases, cls.name)[0])


def make_estimator(name: str, **params: Any) -> Any:
    """Build the estimator ``name`` (any spelling) with the given constructor parameters.

    A keyword the class does not take is ignored (one call can serve several estimators, e.g. ``epsilon``
    for MLE); a value is checked by the estimator's ``fit``, as scikit-learn does.

    Raises:
      PrivacyParameterError: unknown name (the message lists the spellings).
    """
    cls = estimator_class(check_name(name))
    known = set(cls._get_param_names())
    return cls(**{k: v for k, v in params.items() if k in known})


def experiment_params() -> dict[str, EstimatorParam]:
    """Every estimator's experiment parameters, by configuration key, in registration order (a key shared
    by several classes appears once).

    Raises:
      PrivacyParameterError: two classes declare one key differently.
    """
    out: dict[str, EstimatorParam] = {}
    for cls in _classes():
        for p in cls.params:
            seen = out.setdefault(p.key, p)
            if (seen.type, seen.default, seen.help, seen.low) != (p.type, p.default, p.help, p.low):
                raise PrivacyParameterError(
                    f"The experiment parameter {p.key!r} of estimator {cls.name!r} disagrees with another "
                    f"estimator's declaration: {p!r} vs {seen!r}."
                )
    return out


def experiment_estimator(
    name: str,
    config: dict[str, Any],
    *,
    n_train: int | None = None,
    **params: Any,
) -> Any:
    """The estimator ``name`` with its experiment parameters read from ``config`` (a validated experiment
    configuration holding the keys of :func:`experiment_params`) and ``params`` (``epsilon``, ``delta``,
    ``sparsity``, ``feature_bound``, ``clip``, ``random_state``: passed where the class takes them).
    ``n_train`` (public) caps the parameters declared ``at_most_n``."""
    cls = estimator_class(check_name(name))
    from_config = {p.name: p.value(config, n_train) for p in cls.params}
    return make_estimator(name, **params, **from_config)
