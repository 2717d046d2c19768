"""Selecting experiment result records by their selection method.

A record names its method by the selector's display label (``"PrivITP"``: what the results JSON, the
figures and the report show). The label belongs to the selector class
(:attr:`~privalign.alignment.base.MethodBase.label`), so the experiments never spell it: they name a method
by its registered name (``"privitp"``) and these helpers compare through the registry
(:func:`privalign.alignment.selectors.label`; where an experiment writes a label, it asks the same function).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from privalign.alignment.selectors import label as method_label

__all__ = ["fixed_label", "is_method", "of_method"]


def is_method(record: Mapping[str, Any], *methods: str, key: str = "method") -> bool:
    """Whether ``record[key]`` is the display label of one of ``methods`` (registered names)."""
    return record.get(key) in {method_label(m) for m in methods}


def of_method(records: Iterable[dict], method: str, *, key: str = "method", **where: Any) -> list[dict]:
    """The records of ``method`` (a registered name; matched on ``record[key]``, its display label) whose
    fields equal ``where`` (``of_method(recs, "privitp", privacy_match="worst")``), in their order."""
    want = method_label(method)
    return [r for r in records if r.get(key) == want and all(r.get(k) == v for k, v in where.items())]


def fixed_label(method: str) -> str:
    """The display label of ``method`` (a registered name) run at one fixed noise level for every N
    (p1-scaling's ``privitp_fixed_N`` curve: ``fixed_label("privitp") == "PrivITP-fixed"``)."""
    return f"{method_label(method)}-fixed"
