"""An estimator is owned by its class: no module outside the estimator modules branches on an estimator's
name (issue 38 item 1).

Each estimator class declares its name, aliases, privacy kind, sparsity, title, step keyword and experiment
parameters, and ``estimation/registry.py`` hands them out, so ``fit-reward``, the rates scans, the
experiments and the reports ask the class instead of comparing strings. This test counts, per module
outside the owners, in both vocabularies (the class names ``SampleDPIHT``... and the CLI spellings
``dp-iht``...):

* **comparisons**: ``==``, ``!=``, ``in``, ``not in`` with an estimator name on either side, and ``case``
  patterns matching one (``m == "IHT"``, ``name not in ("IHT", "MLE")``, ``r["method"] == "SampleDPIHT"``:
  a record selection by literal is a comparison);
* **tables**: name-keyed dispatch tables (a ``dict`` literal with an estimator name as a key) and module-level
  name lists (a tuple, list or set of estimator names bound to a module-level name: ``LABEL_DP``);
* **selections**: a call that picks an estimator or its records by literal (a keyword argument or a
  subscript whose value is an estimator name: ``method="RRIHT"``, ``grid["dp-sgd"]``).

The ceilings below may only go down: a module above its ceiling fails (a new branch), and so does a module
below it (lower the ceiling here). Comparisons are at 0 everywhere outside the owners (a record selection
asks ``registry.is_estimator``, a property ``registry.kind_of`` / the class). ``accounting/`` is not
scanned: its ``"rr"`` is the randomized-response atom of the RDP accountant, and the layer rule keeps
accounting from knowing the estimators.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "privalign"

#: the estimators' names and aliases
NAMES = frozenset(
    {
        "MLE",
        "IHT",
        "SampleDPIHT",
        "RRIHT",
        "DenseRR",
        "DPSGDLinear",
        "DPTransformerRM",
        "mle",
        "iht",
        "dp-iht",
        "rr-iht",
        "rr",
        "dp-sgd",
    }
)
#: where an estimator is declared: its class module, the shared base, the registry
OWNERS = frozenset(
    {
        "estimation/registry.py",
        "estimation/base.py",
        "estimation/baselines.py",
        "estimation/iht.py",
        "estimation/transformer.py",
    }
)
#: not scanned (see the module docstring)
SKIP = ("accounting/",)

#: module → (comparisons, tables, selections): today's count, which may only go down.
CEILINGS: dict[str, tuple[int, int, int]] = {
    "estimation/rates.py": (0, 2, 0),  # RATE_GRIDS' DP-SGD overrides (configuration data)
    "estimation/sparsity.py": (0, 1, 0),
    "estimation/tuning.py": (0, 2, 0),  # the tuning grids per estimator
    "experiments/paper2.py": (0, 1, 1),
    "experiments/plotting.py": (0, 1, 0),  # STYLE
    "experiments/report.py": (0, 0, 3),
    "experiments/rlhf.py": (0, 3, 0),
    "experiments/rlhf_bon.py": (0, 3, 0),
    "experiments/routes/_reward.py": (0, 3, 0),  # LINEAR_PRIVATE, LINEAR_NONPRIVATE, LABEL_DP
    "experiments/user_level.py": (0, 1, 0),
    "experiments/winrate.py": (0, 1, 0),
}


def _has_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
        return True
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_has_name(e) for e in node.elts)
    return False


def count(tree: ast.Module) -> tuple[int, int, int]:
    """(comparisons, tables, selections) by estimator literal in ``tree`` (see the module docstring)."""
    comparisons = tables = selections = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            comparisons += int(any(_has_name(x) for x in (node.left, *node.comparators)))
        elif isinstance(node, ast.MatchValue):
            comparisons += int(_has_name(node.value))
        elif isinstance(node, ast.Dict):
            tables += int(any(k is not None and _has_name(k) for k in node.keys))
        elif isinstance(node, ast.keyword):
            selections += int(_has_name(node.value))
        elif isinstance(node, ast.Subscript):
            selections += int(_has_name(node.slice))
    for stmt in tree.body:  # module-level name lists (``__all__`` exports class names: not a table)
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in stmt.targets):
            continue
        if isinstance(value, ast.Tuple | ast.List | ast.Set) and _has_name(value):
            tables += 1
    return comparisons, tables, selections


def counts(root: Path = SRC) -> dict[str, tuple[int, int, int]]:
    """Module (relative to ``root``) → its counts, for every scanned module outside OWNERS with any."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in OWNERS or rel.startswith(SKIP):
            continue
        got = count(ast.parse(path.read_text(encoding="utf-8")))
        if any(got):
            out[rel] = got
    return out


def over_and_under(
    got: dict[str, tuple[int, int, int]], ceilings: dict[str, tuple[int, int, int]]
) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Modules above their ceiling (a new branch) and below it (lower the ceiling)."""
    over, under = {}, {}
    for mod in sorted(set(got) | set(ceilings)):
        g, c = got.get(mod, (0, 0, 0)), ceilings.get(mod, (0, 0, 0))
        if any(a > b for a, b in zip(g, c)):
            over[mod] = (g, c)
        elif g != c:
            under[mod] = (g, c)
    return over, under


def test_no_new_estimator_name_branch_outside_the_classes():
    over, under = over_and_under(counts(), CEILINGS)
    assert not over, (
        f"estimator-name branches above the ceiling (module: (comparisons, tables, selections) got vs "
        f"ceiling): {over}. Ask the class (privalign.estimation.registry: privacy_kind(name), "
        "estimator_class(name).sparse / .step_param / .title / .params, names(kind=...)) instead."
    )
    assert not under, f"fewer estimator-name branches than the ceiling: lower CEILINGS here to {under}."


def test_comparisons_only_go_down():
    assert sum(c[0] for c in CEILINGS.values()) == 0  # 33 before the registry, 17 before is_estimator/kind_of


def test_a_planted_branch_table_and_selection_are_found(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "x.py").write_text(
        'LABEL_DP = ("RRIHT", "DenseRR")\n'
        'rows = [r for r in recs if r["method"] == "SampleDPIHT"]\n'
        'STYLE = {"dp-iht": 1}\n'
        'slope(recs, method="RRIHT")\n'
    )
    (tmp_path / "estimation").mkdir()
    (tmp_path / "estimation" / "iht.py").write_text('ok = m == "IHT"\n')  # an owner: not counted
    (tmp_path / "accounting").mkdir()
    (tmp_path / "accounting" / "rdp.py").write_text('ok = kind == "rr"\n')  # the RR atom: not scanned
    got = counts(tmp_path)
    assert got == {"experiments/x.py": (1, 2, 1)}
    over, _ = over_and_under(got, {})
    assert over == {"experiments/x.py": ((1, 2, 1), (0, 0, 0))}  # the ratchet fails on it


def test_the_counter_sees_each_kind_of_branch():
    src = """
if m == "SampleDPIHT": pass
if kind in ("mle", "iht"): pass
if "RRIHT" != name: pass
match m:
    case "dp-sgd": pass
if m == "other": pass
x = {"IHT": 1}
NONPRIVATE = ("IHT", "MLE")
f(method="DenseRR")
y = table["rr"]
def g():
    local = ("IHT",)  # a local list is not a module-level table
"""
    assert count(ast.parse(src)) == (4, 2, 2)
