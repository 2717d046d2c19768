"""The CLI's one parser of selection methods: command-line options → :class:`SelectorSpec` (``select``,
``law``, ``session``) or a sweep of curves (``simulate``).

Which methods exist and which parameters each takes are the selector classes' (the registry in
:mod:`privalign.alignment.selectors`); here live only the CLI's names for them: the flag of each parameter
that has one (PrivBoN's σ is ``--sigma-gumbel``), and ``--param NAME=VALUE`` for any other.
"""

from __future__ import annotations

import argparse
import itertools
import math
from typing import Any

from privalign._validation import parse_floats

__all__ = ["FLAGS", "flag", "parse_param_options", "selector_spec", "add_param_option"]

#: The option (argparse ``dest``) of each method parameter that has its own flag; any other parameter of a
#: registered method is given as ``--param NAME=VALUE``.
FLAGS = {
    "beta": "beta",
    "epsilon": "epsilon",
    "sigma": "sigma_gumbel",
    "sigma_reg": "sigma_reg",
    "sigma_x": "sigma_x",
    "sigma_z": "sigma_z",
    "L": "L",
    "delta": "delta",
}


def flag(dest: str) -> str:
    """``sigma_x`` → ``--sigma-x``."""
    return "--" + dest.replace("_", "-")


def add_param_option(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE" + ("S" if sweep else ""),
        help="a parameter of a registered method that has no option of its own"
        + (" (comma-separated sweep)" if sweep else "")
        + "; repeatable",
    )


def parse_param_options(items: list[str]) -> dict[str, str]:
    """``--param NAME=VALUE`` options as ``{name: text}``."""
    from privalign.errors import PrivacyParameterError

    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise PrivacyParameterError(f"argument --param: must be NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The method parameters the command line gave, by parameter name (``--param`` included)."""
    from privalign.errors import PrivacyParameterError

    given = {
        name: getattr(args, dest) for name, dest in FLAGS.items() if getattr(args, dest, None) is not None
    }
    for name, text in parse_param_options(getattr(args, "param", [])).items():
        if name in FLAGS:
            raise PrivacyParameterError(f"argument --param: {name} has its own option {flag(FLAGS[name])}")
        given[name] = text
    return given


def option_of(name: str) -> str:
    """The option a parameter is given with (``--sigma-gumbel``, or ``--param NAME``)."""
    return flag(FLAGS[name]) if name in FLAGS else f"--param {name}"


def refuse_unread(method: str, given: dict[str, Any], read: set[str]) -> None:
    """An option the method does not read is refused, not ignored: ``--method bon --epsilon 1`` would
    otherwise run plain best-of-N, with no noise, though ε = 1 was asked for."""
    from privalign.alignment.selectors import method_class, methods
    from privalign.errors import PrivacyParameterError

    private = method_class(method).private
    others = ", ".join(m for m in methods() if method_class(m).private)
    for name in given:
        if name not in read:
            opt = option_of(name)
            why = "" if private else f" ({method} adds no noise: its selection is not private)"
            raise PrivacyParameterError(
                f"argument {opt.split()[0]}: {'' if name in FLAGS else name + ' '}not used by --method "
                f"{method}{why}; drop {opt}" + ("" if private else f" or choose a private method ({others})")
            )


def selector_spec(args: argparse.Namespace, method: str, *, extra_read: tuple[str, ...] = ()) -> Any:
    """One :class:`SelectorSpec` from ``select``-style options (one value per parameter).

    A required parameter left out is named by its option; an option the method does not read is refused.
    ``extra_read``: options the command reads itself (e.g. ``sensitivity``), never refused here.
    """
    from privalign.alignment.selectors import SelectorSpec, method_class
    from privalign.errors import PrivacyParameterError

    kind = method_class(method)
    given = given_options(args)
    declared = {p.name: p for p in kind.params}
    refuse_unread(method, {k: v for k, v in given.items() if k not in extra_read}, set(declared))
    values = {}
    for name, v in given.items():
        if name in declared:
            values[name] = float(v) if isinstance(v, str) else v
    for p in kind.params:
        excluded = any(p.name in declared[g].excludes for g in values if g in declared)
        if p.required and p.name not in values and not excluded:
            raise PrivacyParameterError(
                f"The '{option_of(p.name)}' option is required for --method {method}."
            )
    return SelectorSpec.of(method, **values)


def finite_sweep(text: str, name: str, what: str, if_infinite: str = "") -> list[float]:
    """A comma-separated sweep of finite numbers: ``inf``, ``nan`` and overflowing literals (``1e400``) are
    refused naming the option and the value as typed (the range is the selector's check)."""
    from privalign.errors import PrivacyParameterError

    vals = parse_floats(text, name)
    tokens = [x.strip() for x in text.split(",") if x.strip()]
    for tok, v in zip(tokens, vals, strict=True):
        if not math.isfinite(v):
            over = (
                ""
                if tok.lstrip("+-").lower() in ("inf", "infinity") or math.isnan(v)
                else f" (overflows to {v})"
            )
            raise PrivacyParameterError(
                f"argument {flag(name)}: every value must be {what}, got {tok!r}{over} in {text!r}"
                + (f"; {if_infinite}" if v > 0 and if_infinite else "")
            )
    return vals


def product(sweeps: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the sweeps' values, in the order given."""
    names = list(sweeps)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(sweeps[n] for n in names))]
