"""The layer order of ``privalign`` is declared once (``LAYERS``) and enforced on the import graph.

Every ``import``/``from … import`` of a ``privalign`` module counts, including function-local ones (a
function-local import hides a cycle from Python, not from this test). Two checks:

* **Layers**: a sub-package may import only its own modules and sub-packages of a strictly lower layer.
* **Cycles**: no cycle in the module-level graph.

A lower layer that needs an implementation from a higher one (a feature map built on a model) does not import
it: the caller passes it in. privalign declares no entry-point groups of its own (a plugin lookup would be a
hidden upward import); ``ENTRY_POINT_LOADERS`` stays empty, and a third check fails on any
``[project.entry-points."privalign.*"]`` group without a loader, or one whose entry points sit below it.

``KNOWN_*`` lists the violations the codebase still has; the test fails on any new one *and* on a
listed one that no longer occurs, so the lists can only shrink.
"""

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

import privalign

SRC = Path(privalign.__file__).parent
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

#: Bottom to top. The same order is stated in ``privalign/__init__.py``.
LAYERS: list[set[str]] = [
    {"errors"},
    {"_validation", "rng", "paths", "_json", "_lazy"},
    {"accounting", "data", "release", "stats", "__init__"},
    {"mechanisms"},
    {"alignment", "estimation", "audit"},
    {"models"},
    {"pipeline"},
    {"rlhf"},
    {"experiments", "service"},
    {"cli"},
    {"__main__"},
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}

# keep it empty: a lower layer takes what it needs from a higher one as an argument (e.g. the feature maps of
# models/features.py are passed to estimation.features.feature_map_from_config by its callers)
KNOWN_UPWARD: set[tuple[str, str]] = set()
# keep it empty: the last three (estimation.labels, experiments.base, pipeline.steps) were broken up
KNOWN_CYCLES: set[frozenset[str]] = set()

#: privalign's entry-point groups (``[project.entry-points."privalign.*"]`` in pyproject.toml) → the package
#: that loads them (by the group's name, without importing the providers).
ENTRY_POINT_LOADERS: dict[str, str] = {}


def _module_name(path: Path) -> str:
    return ".".join(("privalign", *path.relative_to(SRC).with_suffix("").parts)).removesuffix(".__init__")


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t.startswith("privalign") and t in modules and t != name:
                    graph[name].add(t)
    return graph


def test_every_package_has_a_layer():
    packages = {_package(_module_name(p)) for p in SRC.rglob("*.py")}
    assert packages <= set(RANK), sorted(packages - set(RANK))


def test_imports_go_down_the_layers():
    upward = {
        (_package(a), _package(b))
        for a, bs in _graph().items()
        for b in bs
        if _package(a) != _package(b) and RANK[_package(b)] >= RANK[_package(a)]
    }
    assert upward - KNOWN_UPWARD == set(), f"new upward imports: {sorted(upward - KNOWN_UPWARD)}"
    assert KNOWN_UPWARD - upward == set(), f"fixed, remove from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - upward)}"


def _declared_entry_points() -> dict[str, dict[str, str]]:
    groups = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"].get("entry-points", {})
    return {g: eps for g, eps in groups.items() if g.startswith("privalign.")}


def _entry_point_problems(declared: dict[str, dict[str, str]], loaders: dict[str, str]) -> list[str]:
    problems = [
        f"{g}: no loader declared in ENTRY_POINT_LOADERS" for g in sorted(set(declared) - set(loaders))
    ]
    problems += [f"{g}: declared loader but no entry points" for g in sorted(set(loaders) - set(declared))]
    modules = {_module_name(p) for p in SRC.rglob("*.py")}
    for group, eps in declared.items():
        loader = loaders.get(group)
        if loader is None:
            continue
        sources = [p.read_text(encoding="utf-8") for p in (SRC / loader).rglob("*.py")]
        if not any(f'"{group}"' in text for text in sources):
            problems.append(f"{group}: {loader} does not name the group")
        for name, value in eps.items():
            module = value.split(":")[0].strip()
            if module not in modules:
                problems.append(f"{group}: {name} = {value!r} names no privalign module")
            elif RANK[_package(module)] < RANK[loader]:
                problems.append(
                    f"{group}: {name} = {value!r} is below its loader {loader!r}: import it instead"
                )
    return problems


def test_entry_points_go_up_from_their_loader():
    assert _entry_point_problems(_declared_entry_points(), ENTRY_POINT_LOADERS) == []


def test_the_entry_point_check_finds_a_downward_plugin():  # negative control for the check above
    bad = {
        "privalign.feature_maps": {"ok": "privalign.models.features:X", "low": "privalign.errors:X"},
        "privalign.orphan": {"x": "privalign.cli:X"},
    }
    assert _entry_point_problems(bad, {"privalign.feature_maps": "estimation"}) == [
        "privalign.orphan: no loader declared in ENTRY_POINT_LOADERS",
        "privalign.feature_maps: estimation does not name the group",
        "privalign.feature_maps: low = 'privalign.errors:X' is below its loader 'estimation': "
        "import it instead",
    ]


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: set[frozenset[str]] = set()
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.add(frozenset(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert cycles - KNOWN_CYCLES == set(), f"new import cycles: {[sorted(c) for c in cycles - KNOWN_CYCLES]}"
    assert KNOWN_CYCLES - cycles == set(), (
        f"fixed, remove from KNOWN_CYCLES: {[sorted(c) for c in KNOWN_CYCLES - cycles]}"
    )


def test_the_cycle_finder_finds_a_cycle():  # negative control for the check above
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
