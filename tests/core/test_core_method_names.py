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
        "PrivITP-fixed",  # p1-scaling's fixed-noise PrivITP curve (experiments/records.py: fixed_label)
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


def branches(root: Path = SRC) -> dict[str, int]:
    """Module (relative to ``root``) → its method-name branches, for every module outside OWNERS with one."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in OWNERS:
            continue
        k = count_branches(ast.parse(path.read_text(encoding="utf-8")))
        if k:
            out[rel] = k
    return out


def test_no_method_name_branch_outside_the_owners():
    got = branches()
    assert not got, (
        f"method-name branches outside the selector modules (module: count): {got}. Ask the selector "
        "(alignment/selectors.py: method_class(name).private, .layout, .params, .describe, label(name)) or "
        "select records with experiments/records.py (of_method, is_method) instead."
    )


def test_a_planted_branch_is_found(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "x.py").write_text('rows = [r for r in recs if r["method"] == "PrivITP"]\n')
    (tmp_path / "alignment").mkdir()
    (tmp_path / "alignment" / "priv_itp.py").write_text('ok = m == "privitp"\n')  # an owner: not counted
    assert branches(tmp_path) == {"experiments/x.py": 1}


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
