"""Issue 24, item 8: a non-finite ε is refused wherever a private result is produced, and a non-private run is
asked for by name (``--method bon``, σ = 0), never reached through ε = ∞.

Every command-line entry point that takes an ε (or δ, or an ε budget) refuses ``inf``, ``nan`` and ``1e400``
(which parses as ``inf``) with exit status 2 and one line ``privalign CMD: error: ...`` naming the option, the
constraint and the value, and leaves no output behind. Before this was checked, ``select``/``law``/``session
--epsilon inf`` ran plain best-of-N (``session`` served nothing and exited 0), ``simulate`` drew a curve
"PrivBoN ε=inf" reported as "pure ε-DP", ``audit`` audited the vacuous claim ε = ∞, and an experiment config
with ``epsilons = [inf]`` failed late with "Out of range float values are not JSON compliant". The
budget options (``session --budget-*``, ``keys``) and the service config already refused them: those cases
guard against regressions. The HTTP API's cases are in ``tests/service``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _util import one_line_error, write_scored_pool
from privalign.cli import main

NONFINITE = ["inf", "nan", "1e400"]


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIVALIGN_CACHE_DIR", str(tmp_path / "cache"))
    write_scored_pool(tmp_path / "pool.jsonl", candidates=16)
    return tmp_path


def _refused(argv, cmd, flag, value, capsys) -> str:
    """Exit status 2, one line ``privalign CMD: error: ...`` naming ``flag`` and the value."""
    line = one_line_error(argv, [flag], capsys, cmd=cmd, no_stdout=True)
    # the value as typed, or as parsed (1e400 is inf once argparse has made it a float)
    assert value in line or (value == "1e400" and "inf" in line), (value, line)
    return line


# (command, argv with {v} for the value, the option or key the message must name)
PRIVATE_RESULTS = [
    (
        "select",
        ["select", "--method", "privbon", "--scores", "0.1,0.5,0.9", "--epsilon", "{v}", "--seed", "0"],
    ),
    ("select", ["select", "--method", "privbon", "--scores", "0.1,0.5,0.9", "--epsilon", "{v}", "--secure"]),
    ("law", ["law", "--method", "privbon", "--scores", "0.1,0.5,0.9", "--epsilon", "{v}", "--json"]),
    # (bon takes no ε: refused too, with the same words, not "not used by --method bon" after a parse)
    ("law", ["law", "--method", "bon", "--scores", "0.1,0.5,0.9", "--epsilon", "{v}"]),
    (
        "session",
        ["session", "--pool", "pool.jsonl", "--method", "privbon", "--epsilon", "{v}"]
        + ["--budget-epsilon", "10", "--out", "o", "--no-progress"],
    ),
    (
        "session",
        ["session", "--pool", "pool.jsonl", "--method", "privbon", "--epsilon", "{v}", "--secure"]
        + ["--budget-epsilon", "10", "--out", "o", "--no-progress"],
    ),
    (
        "simulate",
        ["simulate", "--synthetic", "3,16", "--methods", "bon,privbon", "--epsilon", "1,{v}"]
        + ["--replicates", "2", "--out", "o", "--no-progress"],
    ),
    ("audit", ["audit", "--mechanism", "noisy_argmax", "--epsilon", "{v}", "--samples", "50", "--seed", "0"]),
    ("audit", ["audit", "--mechanism", "randomized_response", "--epsilon", "{v}", "--samples", "50"]),
    # was exit 0 with a non-private model described as "label-level privacy"
    (
        "fit-reward",
        ["fit-reward", "--data", "pool.jsonl", "--method", "rr-iht", "--epsilon", "{v}", "--out", "o"],
    ),
    (
        "fit-reward",
        ["fit-reward", "--data", "pool.jsonl", "--method", "dp-iht", "--epsilon", "{v}", "--tune"],
    ),
]


@pytest.mark.parametrize("v", NONFINITE)
@pytest.mark.parametrize(
    ("cmd", "argv"), PRIVATE_RESULTS, ids=lambda x: " ".join(x) if isinstance(x, list) else x
)
def test_a_non_finite_epsilon_is_refused_by_name(cmd, argv, v, work, capsys):
    argv = [a.replace("{v}", v) for a in argv]
    line = _refused(argv, cmd, "--epsilon", v, capsys)
    assert "finite" in line
    if v != "nan":  # +∞: says why, and what to ask for instead
        assert "no privacy" in line, line
        if v == "1e400":
            assert "'1e400'" in line and "overflows to inf" in line, line
    assert not (work / "o").exists()


@pytest.mark.parametrize("v", NONFINITE)
def test_select_points_to_the_named_non_private_method(v, capsys):
    line = _refused(
        ["select", "--method", "privbon", "--scores", "0.1,0.9", "--epsilon", v],
        "select",
        "--epsilon",
        v,
        capsys,
    )
    if v != "nan":
        assert "--method bon" in line
    # the non-private selection, asked for by name, still runs (and says it is not private)
    assert main(["select", "--method", "bon", "--scores", "0.1,0.9", "--seed", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["event"]["kind"] == "non_private"


@pytest.mark.parametrize("v", ["inf", "1e400", "nan"])
def test_simulate_sigma_gumbel_sweep_refuses_non_finite_scales_by_name(v, work, capsys):
    argv = [
        "simulate",
        "--synthetic",
        "3,16",
        "--methods",
        "privbon",
        "--sigma-gumbel",
        f"0.5,{v}",
        "--out",
        "o",
    ]
    _refused(argv + ["--no-progress"], "simulate", "--sigma-gumbel", v, capsys)
    assert not (work / "o").exists()


def test_simulate_sigma_zero_is_the_named_non_private_curve(work, capsys):
    argv = ["simulate", "--synthetic", "3,16", "--methods", "bon,privbon", "--sigma-gumbel", "0"]
    assert main(argv + ["--replicates", "2", "--out", "o", "--no-progress", "--json"]) == 0
    methods = json.loads(capsys.readouterr().out)["methods"]
    sig0 = next(m for m in methods if m["name"].startswith("PrivBoN"))
    assert "non-private" in sig0["name"] and sig0["privacy"]["guarantee"] == "none", sig0


@pytest.mark.parametrize("v", NONFINITE)
def test_audit_refuses_a_non_finite_delta_even_where_unused(v, capsys):
    # laplace is pure ε-DP and ignores δ: an infinite δ used to be accepted silently
    _refused(
        ["audit", "--mechanism", "laplace", "--epsilon", "1", "--delta", v], "audit", "--delta", v, capsys
    )


# Budgets and δ that were already refused (check_real without allow_inf): regression guards. A budget is
# not a private result, but an infinite budget would leave every answer unprotected; there is no
# "unlimited" setting (keys cap a grant at 1e9 ε).
@pytest.mark.parametrize("v", NONFINITE)
@pytest.mark.parametrize(
    ("cmd", "argv", "flag"),
    [
        (
            "session",
            ["session", "--pool", "pool.jsonl", "--budget-epsilon", "{v}", "--out", "o", "--no-progress"],
            "--budget-epsilon",
        ),
        (
            "session",
            ["session", "--pool", "pool.jsonl", "--method", "privbon", "--budget-epsilon", "10"]
            + ["--budget-delta", "{v}", "--out", "o", "--no-progress"],
            "--budget-delta",
        ),
        (
            "session",
            ["session", "--pool", "pool.jsonl", "--budget-epsilon", "10", "--delta", "{v}", "--out", "o"],
            "--delta",
        ),
        (
            "select",
            ["select", "--method", "privitp", "--scores", "0.1,0.5", "--scores-b", "0.2,0.3"]
            + ["--beta", "1", "--sigma-x", "1", "--sigma-z", "1", "--delta", "{v}"],
            "--delta",
        ),
        (
            "keys create",
            ["keys", "create", "--db", "sqlite:///k.db", "--budget-epsilon", "{v}"],
            "--budget-epsilon",
        ),
        (
            "keys create",
            ["keys", "create", "--db", "sqlite:///k.db", "--budget-epsilon", "1", "--budget-delta", "{v}"],
            "--budget-delta",
        ),
        ("keys top-up", ["keys", "top-up", "KEY", "--db", "sqlite:///k.db", "--epsilon", "{v}"], "--epsilon"),
        ("keys top-up", ["keys", "top-up", "KEY", "--db", "sqlite:///k.db", "--delta", "{v}"], "--delta"),
    ],
)
def test_budgets_and_deltas_stay_refused(cmd, argv, flag, v, work, capsys):
    pytest.importorskip("sqlalchemy")
    if cmd == "keys top-up":
        assert main(["keys", "create", "--db", "sqlite:///k.db", "--budget-epsilon", "1", "--json"]) == 0
        key_id = json.loads(capsys.readouterr().out)["key_id"]
        argv = [key_id if a == "KEY" else a for a in argv]
    _refused([a.replace("{v}", v) for a in argv], cmd, flag, v, capsys)
    assert not (work / "o").exists()
    if cmd == "keys top-up":  # nothing was granted
        assert main(["keys", "list", "--db", "sqlite:///k.db", "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert row["limit"] == [1.0, 0.0], row


# Experiment configurations: no key takes ±inf (TOML's inf, or 1e400). A non-private reference curve is a
# method named as such (BoN), never ε = inf in a sweep.
@pytest.mark.parametrize("v", ["inf", "-inf", "1e400", "nan"])
@pytest.mark.parametrize(
    ("experiment", "key", "line"),
    [
        ("p1-epsilon-star", "epsilons", "epsilons = [1.0, {v}]"),
        ("p1-budget", "budget_epsilon", "budget_epsilon = {v}"),
        ("p1-budget", "privbon_epsilon", "privbon_epsilon = {v}"),
        ("p2-rates", "eps_grid", "eps_grid = [{v}]"),
        ("p1-scaling", "score_high", "score_high = {v}"),
    ],
)
def test_experiment_configs_refuse_non_finite_values(experiment, key, line, v, work, capsys):
    (work / "c.toml").write_text(line.replace("{v}", v) + "\n")
    rc = main(["reproduce", experiment, "--config", "c.toml", "--out", "o", "--no-progress"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("privalign reproduce: error: c.toml: ") and f"'{key}'" in lines[0], lines[0]
    assert ("NaN" if v == "nan" else "finite") in lines[0], lines[0]
    if v != "nan" and "eps" in key:
        assert "BoN" in lines[0], lines[0]
    assert not (work / "o").exists()


def test_no_shipped_experiment_config_uses_an_infinite_value():
    import tomllib

    roots = [
        Path(__file__).parents[1] / "configs",
        Path(__file__).parents[1] / "src/privalign/experiments/configs",
    ]
    files = [f for r in roots for f in sorted(r.glob("*.toml"))]
    assert len(files) > 20
    for f in files:
        with f.open("rb") as fh:
            data = tomllib.load(fh)
        stack = [data]
        while stack:
            d = stack.pop()
            for k, x in d.items() if isinstance(d, dict) else enumerate(d):
                if isinstance(x, dict | list):
                    stack.append(x)
                elif isinstance(x, float):
                    assert math.isfinite(x), (f, k, x)


# A property over the text of --epsilon, boundaries included: a privbon selection either is refused (exit 2,
# one line naming --epsilon) or charges a finite ε; it never returns a non-private event.
_BOUNDARY = [
    "inf",
    "+inf",
    "-inf",
    "Infinity",
    "INF",
    "nan",
    "NaN",
    "-nan",
    "1e400",
    "1E400",
    "-1e400",
    "1e309",
    "1.7976931348623159e308",  # overflow to ±inf
    "1.7976931348623157e308",
    "1e308",
    "5e-324",
    "1e-400",
    "0",
    "-0.0",
    "1",
    "2.5",
]


@settings(
    max_examples=80, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
@given(text=st.one_of(st.sampled_from(_BOUNDARY), st.floats(allow_nan=True, allow_infinity=True).map(repr)))
def test_property_privbon_never_runs_without_a_finite_epsilon(text):
    import contextlib
    import io

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(
            [
                "select",
                "--method",
                "privbon",
                "--scores",
                "0.1,0.5,0.9",
                f"--epsilon={text}",
                "--seed",
                "0",
                "--json",
            ]
        )
    v = float(text)
    if rc == 0:
        event = json.loads(out.getvalue())["event"]
        assert math.isfinite(v) and v > 0, (text, event)
        assert event["kind"] == "noisy_argmax" and math.isfinite(float(event["epsilon"])), (text, event)
    else:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        # (a subnormal ε such as 5e-324 is refused by the Gumbel-scale check, which names 'epsilon' only)
        assert rc == 2 and len(lines) == 1 and "epsilon" in lines[0], (text, err.getvalue())
        assert "Traceback" not in err.getvalue()
        if not math.isfinite(v):
            assert "--epsilon" in lines[0] and repr(text) in lines[0], (text, lines[0])
