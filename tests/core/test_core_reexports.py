"""Each name has one home: a module's ``__all__`` lists only what the module defines.

A module that re-exports a name defined elsewhere in privalign is a second import path to keep working (the
old home of something that moved). Package ``__init__`` files are the public facades and are exempt. The list
of known re-exports may only shrink: the test fails on a new one and on a listed one that is gone.
"""

import ast
from pathlib import Path

import privalign

SRC = Path(privalign.__file__).parent

#: (module, name) re-exports that remain: ``service/pipeline.py`` is the request path's namespace for
#: ``service/routes.py``; ``alignment/simulation.py`` keeps ``plot_results`` for its callers.
KNOWN: set[tuple[str, str]] = {
    ("alignment/simulation.py", "plot_results"),
    ("service/pipeline.py", "ServiceState"),
    ("service/pipeline.py", "Job"),
    ("service/pipeline.py", "Outcome"),
    ("service/pipeline.py", "Reserved"),
    ("service/pipeline.py", "FILTERS"),
    ("service/pipeline.py", "encode"),
    ("service/pipeline.py", "remaining_dict"),
}


def reexports(tree: ast.Module) -> set[str]:
    """Names in ``__all__`` that the module imports from privalign instead of defining."""
    defined: set[str] = set()
    imported: set[str] = set()
    listed: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    defined.add(t.id)
                    if t.id == "__all__" and node.value is not None:
                        listed = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("privalign"):
            imported |= {a.asname or a.name for a in node.names}
    return {n for n in listed if n in imported and n not in defined}


def test_no_new_reexports():
    found = {
        (str(p.relative_to(SRC)), name)
        for p in SRC.rglob("*.py")
        if p.name != "__init__.py"
        for name in reexports(ast.parse(p.read_text(encoding="utf-8")))
    }
    assert found - KNOWN == set(), (
        f"new re-exports (import from the defining module): {sorted(found - KNOWN)}"
    )
    assert KNOWN - found == set(), f"gone, remove from KNOWN: {sorted(KNOWN - found)}"


def test_the_check_finds_a_reexport():  # negative control
    tree = ast.parse(
        "from privalign.paths import package_dir\ndef own(): ...\n__all__ = ['own', 'package_dir']\n"
    )
    assert reexports(tree) == {"package_dir"}
