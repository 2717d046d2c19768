"""The newcomer list of issue 25 (item 3): each edge a new user hit, with the behaviour it has now. A user
error is one line ``privalign CMD: error: ...`` naming the flag and the value, exit status 2, nothing
written; no test here loads a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privalign.cli import main


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIVALIGN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _one_line_error(argv, needles, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and "internal error" not in err, err
    assert rc == 2, f"exit status {rc}: {err}"
    assert len(lines) == 1, err
    assert lines[0].startswith(f"privalign {argv[0]}: error: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --- simulate: size limits (were "internal error (MemoryError) ... a bug", exit 1) ---------------------------


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--synthetic", "20,99999999999"], ["argument --synthetic:", "20,99999999999", "at most"]),
        (
            ["--synthetic", "20,512", "--replicates", "1000000000000"],
            ["argument --replicates:", "1,000,000,000,000", "at most"],
        ),
    ],
)
def test_simulate_sizes_beyond_memory_are_refused_naming_the_flag(extra, needles, work, capsys):
    _one_line_error(["simulate", *extra, "--out", "o", "--no-progress"], needles, capsys)
    assert not (work / "o").exists()


# --- simulate: options no listed method reads are refused, as by select -------------------------------------


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--methods", "bon", "--epsilon", "2", "--sigma-x", "3"], ["argument --epsilon:", "--methods bon"]),
        (["--methods", "bon,privbon", "--sigma-x", "3"], ["argument --sigma-x:", "not used"]),
        (["--methods", "bon,itp", "--delta", "1e-5"], ["argument --delta:", "not used"]),
        (["--methods", "bon", "--beta", "0.1"], ["argument --beta:", "not used"]),
        (["--methods", "privbon", "--sigma-gumbel", "1", "--epsilon", "2"], ["argument --epsilon:"]),
        (["--methods", "privitp", "--sigma-z", "1"], ["argument --sigma-z:", "--sigma-x"]),
    ],
)
def test_simulate_refuses_options_its_methods_do_not_read(extra, needles, work, capsys):
    _one_line_error(
        ["simulate", "--synthetic", "3,16", *extra, "--out", "o", "--no-progress"], needles, capsys
    )
    assert not (work / "o").exists()


# --- simulate: the default methods at equal privacy, with units ---------------------------------------------


def test_simulate_defaults_compare_privbon_and_privitp_at_equal_privacy_with_units(work, capsys):
    argv = ["simulate", "--synthetic", "4,64", "--replicates", "2", "--out", "o", "--no-progress"]
    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    priv = {m["name"].split()[0]: m["privacy"] for m in summary["methods"]}
    assert priv["PrivBoN"]["epsilon"] == 4.0
    # PrivITP's worst case at the largest N is PrivBoN's ε (it was ε1 = 3.58e3 beside ε = 4)
    assert priv["PrivITP"]["epsilon_max"][-1] == pytest.approx(4.0, rel=1e-5)
    assert priv["PrivITP"]["epsilon_max"][-1] <= 4.0
    assert main([*argv, "--out", "o2"]) == 0
    out = capsys.readouterr().out
    assert "true-reward units" in out and "ε = 4 (pure DP)" in out and "ε ≤ 4 (worst case" in out
    bon = next(ln for ln in out.splitlines() if ln.strip().startswith("BoN"))
    lift = next(m["true_lift_at_max_n"] for m in summary["methods"] if m["name"] == "BoN")
    assert f"{lift:+.4f}" in bon  # the lift itself, not ×100 without a unit


def test_simulate_privitp_alone_is_calibrated_to_epsilon(work, capsys):
    argv = ["simulate", "--synthetic", "3,16", "--methods", "privitp", "--epsilon", "2"]
    assert main([*argv, "--replicates", "2", "--out", "o", "--no-progress", "--json"]) == 0
    (m,) = json.loads(capsys.readouterr().out)["methods"]
    assert m["privacy"]["epsilon_max"][-1] == pytest.approx(2.0, rel=1e-5)
