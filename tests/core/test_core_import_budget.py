"""The CLI's cold start: what ``privalign [CMD] --help`` and a PrivITP run may import, and the command table
the CLI relies on.

``privalign CMD ...`` imports only ``privalign.cli.<module of CMD>`` (``privalign.cli.COMMANDS`` lists the
commands, their modules and their one-line help for ``privalign --help``). The PrivITP laws, the engine and
the ex-post accounting take Φ, log Φ and erfcx from ``privalign.accounting.normal`` (numpy), not from
``scipy.special``. The budget: the modules below must not be loaded by a ``--help``, by importing the
alignment and accounting modules, or by a whole ``privalign simulate`` / ``select`` / ``law`` run with
PrivITP (``simulate`` may load Pillow, which draws its PNGs, and threadpoolctl, which keeps BLAS on one
thread). Checked on ``sys.modules`` of a fresh interpreter (``python -X importtime`` does not list modules
imported through ``importlib.import_module``, which is how the CLI loads its command modules).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys

import pytest

#: Heavy modules that no ``--help`` (and no import of the laws / accounting) may load. ``scipy.special``
#: alone was ≈ 0.25-0.3 s of every ``privalign`` start (its import clones numpy's namespace, which loads
#: numpy.f2py, numpy.testing and numpy.ma).
HEAVY = (
    "scipy",
    "scipy.special",
    "scipy.stats",
    "scipy.optimize",
    "numpy.f2py",
    "numpy.testing",
    "matplotlib",
    "PIL",
    "threadpoolctl",
    "pandas",
    "sklearn",
    "torch",
    "transformers",
    "datasets",
    "peft",
    "trl",
    "sqlalchemy",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "openai",
    "ray",
)

_CHILD = """
import contextlib, io, json, sys
from privalign.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    rc = main(json.loads(sys.argv[1]))
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


def _loaded(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(argv)], capture_output=True, text=True, check=True, env=env
    )
    out = json.loads(res.stdout)
    return out["rc"], set(out["modules"])


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["simulate", "--help"], ["select", "--help"], ["session", "--help"], ["law", "--help"]],
)
def test_help_loads_no_heavy_module(argv):
    rc, mods = _loaded(argv)
    assert rc == 0
    assert sorted(set(HEAVY) & mods) == []
    commands = {m for m in mods if m.startswith("privalign.cli.") and not m.startswith("privalign.cli._")}
    named = {f"privalign.cli.{argv[0]}"} if argv[0] != "--help" else set()
    assert named <= commands
    # only the named command's module (and cli.select, whose option helpers law and simulate share)
    assert commands - named - {"privalign.cli.select"} == set()


def test_importing_laws_and_accounting_loads_no_scipy():
    code = (
        "import sys, privalign.alignment.simulation, privalign.alignment.laws, privalign.accounting.expost, "
        "privalign.alignment.selectors as s\n"
        "[s.method_class(m) for m in s.METHODS]\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


#: What ``privalign simulate`` may load of :data:`HEAVY`: Pillow draws its PNGs, threadpoolctl keeps BLAS on
#: one thread while the engine runs.
SIMULATE_MAY_LOAD = {"PIL", "threadpoolctl"}

_PRIVITP = ["--beta", "0.1", "--sigma-x", "0.5", "--sigma-z", "0.3"]


def test_privitp_runs_load_no_heavy_module(tmp_path):
    """A whole PrivITP run (the laws, the engine's rejection table, the ex-post and phase-1 accounting)
    imports no scipy: ``privalign simulate`` with all four methods, ``select`` and ``law`` with PrivITP."""
    from privalign.alignment.synthetic import make_synthetic_pool
    from privalign.data.pools import write_pool

    pool = tmp_path / "pool.jsonl"
    write_pool(pool, make_synthetic_pool(3, 64, random_state=0).to_records())
    env = dict(os.environ, PRIVALIGN_CACHE_DIR=str(tmp_path / "cache"))
    scores = ["--scores", "0.1,0.5,0.9", "--scores-b", "0.2,0.8,0.4"]
    runs = [
        [
            "simulate",
            "--pool",
            str(pool),
            "--out",
            str(tmp_path / "sim"),
            "--methods",
            "bon,itp,privbon,privitp",
        ]
        + _PRIVITP
        + ["--max-log2-n", "3", "--replicates", "3", "--no-progress"],
        ["select", "--method", "privitp", *_PRIVITP, *scores, "--seed", "1", "--json"],
        ["law", "--method", "privitp", *_PRIVITP, *scores, "--json"],
    ]
    for argv in runs:
        rc, mods = _loaded(argv, env)
        assert rc == 0, argv
        allowed = SIMULATE_MAY_LOAD if argv[0] == "simulate" else set()
        assert sorted((set(HEAVY) - allowed) & mods) == [], argv[0]
    assert (tmp_path / "sim" / "results.json").is_file()  # the run did write (and so drew its figures)


def _registered() -> list[tuple[str, str, str | None]]:
    """``(command, module, help)`` in registration order, from each module's own ``register``."""
    import privalign.cli as pkg
    from privalign.cli._args import Parser

    rows = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        register = getattr(importlib.import_module(f"privalign.cli.{info.name}"), "register", None)
        if register is None:
            continue
        sub = Parser(prog="x").add_subparsers(dest="command", parser_class=Parser)
        register(sub)
        rows += [(a.dest, info.name, a.help) for a in sub._choices_actions]
    return rows


def test_command_table_matches_the_modules():
    from privalign.cli import COMMANDS

    assert list(COMMANDS) == _registered()


def _sub(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_parser_built_for_one_command_matches_the_full_parser():
    from privalign.cli import COMMANDS, build_parser

    full = build_parser()
    assert build_parser([]).format_help() == full.format_help()  # `privalign --help` from the table
    for name, _, _ in COMMANDS:
        one = build_parser([name, "--help"])
        assert one.format_help() == full.format_help()
        assert list(_sub(one).choices) == list(_sub(full).choices)
        assert _sub(one).choices[name].format_help() == _sub(full).choices[name].format_help(), name
