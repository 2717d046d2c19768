"""Reading final answers out of text: the last ``\\boxed{...}`` of a MATH solution or a model's answer.

Used by the dataset loaders (the MATH reference answer) and by the verifiers in
:mod:`privalign.models.scorers` (which re-exports it), so it sits in the data layer below both.
"""

from __future__ import annotations

__all__ = ["extract_boxed"]


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces), or ``None``."""
    k = text.rfind("\\boxed")
    if k == -1:
        return None
    i = text.find("{", k)
    if i == -1:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None
