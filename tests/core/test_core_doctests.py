"""Every docstring example in ``src/privalign`` runs (doctests in several modules once never ran).

Modules are discovered by scanning for ``>>>``, so a new example is collected without editing this file.
"""

import doctest
import importlib
from pathlib import Path

import pytest

import privalign

SRC = Path(privalign.__file__).parent
MODULES = sorted(
    ".".join(("privalign", *p.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")
    for p in SRC.rglob("*.py")
    if ">>>" in p.read_text(encoding="utf-8")
)


def test_some_examples_are_collected():
    assert len(MODULES) >= 4, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    assert result.attempted > 0, f"{name}: no example found by doctest"
    assert result.failed == 0, (
        f"{name}: {result.failed} of {result.attempted} examples failed (run python -m doctest -v)"
    )
