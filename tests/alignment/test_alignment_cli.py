"""CLI: select, law, simulate, session via privalign.cli.main in-process."""

import json

import pytest

from privalign.alignment.synthetic import make_synthetic_pool
from privalign.cli import main
from privalign.data.pools import write_pool


def _json(capsys):
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "method,extra",
    [
        ("bon", []),
        ("itp", ["--beta", "0.1"]),
        ("privbon", ["--epsilon", "1"]),
        ("privitp", ["--beta", "0.1", "--sigma-x", "0.5", "--sigma-z", "0.3"]),
    ],
)
def test_select_and_law(capsys, method, extra):
    args = ["--method", method, "--scores", "0.1,0.5,0.9", "--scores-b", "0.2,0.8,0.4", *extra, "--json"]
    assert main(["select", *args, "--seed", "3"]) == 0
    out = _json(capsys)
    assert out["method"] == method and "event" in out and "worst_case_event" in out
    assert main(["select", *args, "--seed", "3"]) == 0
    assert _json(capsys)["index"] == out["index"]  # seeded → reproducible
    assert main(["law", *args]) == 0
    law = _json(capsys)
    assert abs(sum(law["probabilities"]) + law["fallback"] - 1) < 1e-9


def test_privbon_infinite_epsilon_cli(capsys):
    """ε = ∞ is refused (it used to run plain BoN as "privbon"); the non-private selection is asked
    for by name, --method bon, and says it is not private."""
    argv = ["select", "--method", "privbon", "--epsilon", "inf", "--scores", "0.1,0.9,0.3", "--seed", "0"]
    assert main([*argv, "--json"]) == 2
    assert "--method bon" in capsys.readouterr().err
    assert main(["select", "--method", "bon", "--scores", "0.1,0.9,0.3", "--seed", "0", "--json"]) == 0
    out = _json(capsys)
    assert out["index"] == 1 and out["event"]["kind"] == "non_private"


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["select", "--method", "privbon", "--epsilon", "1", "--scores", "0.1,1.3"], "public range"),
        (["select", "--method", "privbon", "--epsilon", "1", "--scores", "0.1,nan"], "finite"),
        (["select", "--method", "itp", "--beta", "-1", "--scores", "0.1", "--scores-b", "0.2"], "beta"),
        (
            ["select", "--method", "privitp", "--beta", "0.1", "--scores", "0.1", "--scores-b", "0.2"],
            "--sigma-x",
        ),
        (["select", "--method", "itp", "--beta", "0.1", "--scores", "0.1"], "pool_b_scores"),
        (["law", "--method", "privbon", "--epsilon", "1", "--scores", "a,b"], "comma-separated"),
    ],
)
def test_bad_input_exit_2(capsys, argv, msg):
    assert main(argv) == 2
    assert msg in capsys.readouterr().err


def test_simulate_and_session(tmp_path, capsys):
    pool = make_synthetic_pool(12, 80, random_state=0)
    path = tmp_path / "pool.jsonl.gz"
    write_pool(path, pool.to_records(), meta={"generator": "synthetic"})
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--pool",
                str(path),
                "--max-log2-n",
                "3",
                "--replicates",
                "3",
                "--out",
                str(out),
                "--no-progress",
                "--json",
            ]
        )
        == 0
    )
    s = _json(capsys)
    assert (out / "results.json").exists() and len(s["figures"]) == 2 and len(s["methods"]) == 4
    assert (
        main(
            [
                "session",
                "--pool",
                str(path),
                "--budget-epsilon",
                "60",
                "--n",
                "8",
                "--sigma-x",
                "3",
                "--out",
                str(tmp_path / "ses"),
                "--no-progress",
                "--json",
            ]
        )
        == 0
    )
    s = _json(capsys)
    assert s["prompts_served"] + s["prompts_refused"] == 12 and s["realized_epsilon"] <= 60
    assert (
        main(
            [
                "session",
                "--pool",
                str(path),
                "--method",
                "privbon",
                "--epsilon",
                "2",
                "--budget-epsilon",
                "10",
                "--n",
                "8",
                "--out",
                str(tmp_path / "ses2"),
                "--json",
            ]
        )
        == 0
    )
    s = _json(capsys)
    assert s["pure"]["prompts_served"] == 5 and s["zcdp"]["prompts_served"] >= 5
    assert (
        main(
            [
                "simulate",
                "--pool",
                str(path),
                "--max-log2-n",
                "8",
                "--replicates",
                "2",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 2
    )  # pool too small for N = 256


def test_simulate_default_grid_fits_itp_two_pools(tmp_path, capsys):
    """The default N grid halves the usable pool for ITP too (not only PrivITP): ``--methods bon,itp`` on a
    64-candidate pool used to pick N = 64 and fail on the 2N = 128 candidates the two pools need."""
    rc = main(
        [
            "simulate",
            "--synthetic",
            "4,64",
            "--methods",
            "bon,itp",
            "--replicates",
            "2",
            "--out",
            str(tmp_path / "sim"),
            "--no-progress",
            "--json",
        ]
    )
    assert rc == 0
    assert _json(capsys)["max_n"] == 32
