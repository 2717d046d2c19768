"""Step 4: the private selection (PrivBoN, PrivITP, or BestOfN for non-private deployments)."""

from __future__ import annotations

from typing import Any

import numpy as np

from privalign.service import plan as planning

__all__ = ["select"]


def select(plan: planning.Plan, scores: np.ndarray, noise: Any) -> tuple[int, Any]:
    """Run the plan's selection on clipped scores with ``noise`` (``SecureNoise``); returns (index into
    the candidates, realized event)."""
    return planning.select(plan, scores, noise)
