"""Inference-time alignment: BoN, ITP, PrivBoN, PrivITP, their exact laws, sessions and simulation.

Selectors share one interface: ``select(scores, *, rng, pool_b_scores=None) -> Selection``,
``select_batch(scores_2d, *, rng, pool_b_scores=None) -> BatchSelection``, ``worst_case_event(n)``
(before any score is seen) and ``law(scores, *, pool_b_scores=None) -> SelectionLaw``.
"""

from typing import TYPE_CHECKING

from privalign._lazy import lazy_exports

if TYPE_CHECKING:  # imported on first access (module __getattr__ below)
    from privalign.alignment.base import FALLBACK, BatchSelection, Selection, SelectionLaw
    from privalign.alignment.bon import BestOfN
    from privalign.alignment.itp import InferenceTimePessimism
    from privalign.alignment.normalizer import solve_normalizer
    from privalign.alignment.priv_bon import PrivBoN, privbon_epsilon, privbon_epsilon_within, privbon_scale
    from privalign.alignment.priv_itp import PrivITP
    from privalign.alignment.selectors import (
        Selector,
        SelectorSpec,
        check_method,
        make_selector,
        methods,
        pool_size,
        register,
    )

#: public name → the submodule defining it
_LAZY = {
    "FALLBACK": "base",
    "BatchSelection": "base",
    "Selection": "base",
    "SelectionLaw": "base",
    "BestOfN": "bon",
    "InferenceTimePessimism": "itp",
    "solve_normalizer": "normalizer",
    "PrivBoN": "priv_bon",
    "privbon_epsilon": "priv_bon",
    "privbon_scale": "priv_bon",
    "privbon_epsilon_within": "priv_bon",
    "PrivITP": "priv_itp",
    "Selector": "selectors",
    "SelectorSpec": "selectors",
    "methods": "selectors",
    "register": "selectors",
    "make_selector": "selectors",
    "check_method": "selectors",
    "pool_size": "selectors",
}

__all__ = [
    "FALLBACK",
    "Selection",
    "BatchSelection",
    "SelectionLaw",
    "BestOfN",
    "InferenceTimePessimism",
    "PrivBoN",
    "PrivITP",
    "privbon_scale",
    "privbon_epsilon",
    "privbon_epsilon_within",
    "solve_normalizer",
    "Selector",
    "SelectorSpec",
    "methods",
    "register",
    "make_selector",
    "check_method",
    "pool_size",
]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
