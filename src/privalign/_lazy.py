"""Lazy package exports (PEP 562), written once for the sub-packages that use them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public name ``n`` lives in submodule ``names[n]``.

    The submodule is imported on first access and the value cached in the package's namespace, so that
    importing one submodule (e.g. by ``privalign simulate``) does not import all of them; the public names are
    unchanged.
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        pkg = importlib.import_module(package)
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(pkg, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(public))

    return __getattr__, __dir__
