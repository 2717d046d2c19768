"""A selection method is owned by its selector class: no module outside the selector modules branches on a
method's name.

Each selector class declares its method (name, label, parameters, candidate layout, privacy, how it picks
from a flat candidate list) and the registry in ``alignment/selectors.py`` hands it out, so the CLI, the
service, the simulation engine and the experiments ask the selector instead of comparing strings. This test
counts the comparisons and membership tests against a method name (``m == "privitp"``,
``kind in ("bon", "itp")``, ``case "privbon":``), in either vocabulary (the method names and the display
labels ``"PrivBoN"``...), per module outside the selector modules. The ceilings below may only go down: a
module above its ceiling fails (a new branch), and so does a module below it (lower the ceiling here).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "privalign"

#: the method names and the experiments' display labels
NAMES = frozenset(
    {
        "bon",
        "itp",
        "privbon",
        "privitp",
        "BoN",
        "ITP",
        "PrivBoN",
        "PrivITP",
        "PrivBoN-Gaussian",
        "PrivITP-matched",
    }
)
#: where a method is defined: its selector module, the registry, the shared base
OWNERS = frozenset(
    {
        "alignment/selectors.py",
        "alignment/base.py",
        "alignment/bon.py",
        "alignment/itp.py",
        "alignment/priv_bon.py",
        "alignment/priv_itp.py",
    }
)
#: module → the most method-name branches it may hold (may only go down; remove a module at 0). Measured
#: when the test was added: 71 outside the selector modules before the selectors owned their methods, 24
#: after. What remains: the experiments filtering their own result records by display label
#: (``r["method"] == "PrivITP"``).
CEILINGS: dict[str, int] = {
    "experiments/beyond.py": 5,
    "experiments/paper1.py": 3,
    "experiments/privacy_sweep.py": 8,
    "experiments/report.py": 2,
    "experiments/verdicts.py": 6,
}


def _names_in(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
        return 1
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return int(any(_names_in(e) for e in node.elts))
    return 0


def count_branches(tree: ast.AST) -> int:
    """Comparisons (``==``, ``!=``, ``in``, ``not in``) with a method name on either side, and ``case``
    patterns matching one."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            n += int(any(_names_in(x) for x in (node.left, *node.comparators)))
        elif isinstance(node, ast.MatchValue):
            n += _names_in(node.value)
    return n


def branches() -> dict[str, int]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in OWNERS:
            continue
        k = count_branches(ast.parse(path.read_text(encoding="utf-8")))
        if k:
            out[rel] = k
    return out


def test_no_new_method_name_branch():
    got = branches()
    over = {m: (k, CEILINGS.get(m, 0)) for m, k in got.items() if k > CEILINGS.get(m, 0)}
    assert not over, (
        f"method-name branches above the ceiling (module: (count, ceiling)): {over}. Ask the selector "
        "(alignment/selectors.py: method_class(name).private, .layout, .params, .describe, ...) instead."
    )


def test_ceilings_only_shrink():
    got = branches()
    stale = {m: (got.get(m, 0), c) for m, c in CEILINGS.items() if got.get(m, 0) < c}
    assert not stale, f"fewer branches than the ceiling: lower CEILINGS (module: (count, ceiling)): {stale}"


def test_the_counter_sees_each_kind_of_branch():
    src = """
if m == "privitp": pass
if kind in ("bon", "itp"): pass
if "PrivBoN" != label: pass
match m:
    case "privbon": pass
if m == "other": pass
x = {"bon": 1}
"""
    assert count_branches(ast.parse(src)) == 4
