"""The complexity limit (ruff C901, ``max-complexity`` in pyproject.toml) holds for new code.

ruff enforces the limit in ``make lint``; the functions that already exceeded it when the limit was set are
exempted per file in ``[tool.ruff.lint.per-file-ignores]``. This test closes the two holes of a per-file
exemption: it fails on a *new* complex function in an exempted file, and on an exempted function that is
no longer complex (remove it here and, if it was the file's last, from pyproject.toml): the list can only
shrink.
"""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: (file, function) pairs above the limit when it was introduced.
KNOWN_COMPLEX: set[tuple[str, str]] = {
    ("benchmarks/bench_service_select.py", "main"),
}


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]


def _offenders(limit: int) -> set[tuple[str, str]]:
    """Every function above ``limit``, ignoring per-file exemptions and ``noqa`` comments."""
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "ruff",
                "check",
                "--isolated",
                "--ignore-noqa",
                "--select",
                "C901",
                "--config",
                f"lint.mccabe.max-complexity = {limit}",
                "--output-format",
                "json",
                "--exit-zero",
                "src",
                "tests",
                "benchmarks",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
    except FileNotFoundError:  # pragma: no cover - ruff is in the dev extra
        pytest.fail("ruff is not installed (pip install -e '.[dev]')")
    out = set()
    for d in json.loads(proc.stdout):
        name = d["message"].split("`")[1]
        out.add((Path(d["filename"]).resolve().relative_to(ROOT).as_posix(), name))
    return out


def test_complexity_limit_is_configured():
    cfg = _config()
    assert "C901" in cfg["select"]
    assert cfg["mccabe"]["max-complexity"] <= 15


def test_known_complex_functions_can_only_shrink():
    found = _offenders(_config()["mccabe"]["max-complexity"])
    assert found - KNOWN_COMPLEX == set(), (
        f"new functions above the complexity limit: {sorted(found - KNOWN_COMPLEX)}"
    )
    assert KNOWN_COMPLEX - found == set(), (
        "simplified, remove from KNOWN_COMPLEX (and pyproject per-file-ignores): "
        f"{sorted(KNOWN_COMPLEX - found)}"
    )


def test_per_file_exemptions_match_the_known_list():
    exempt = {f for f, codes in _config()["per-file-ignores"].items() if "C901" in codes}
    assert exempt == {f for f, _ in KNOWN_COMPLEX}


def test_the_check_sees_a_complex_function():  # negative control: a limit of 1 flags almost everything
    assert len(_offenders(1)) > len(KNOWN_COMPLEX)
