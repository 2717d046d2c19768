"""Hostile inputs found in a newcomer's review: each must give one line ``privalign CMD: error: ...``
that names the flag (or the file) and the value, exit status 2, and leave no output behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _util import one_line_error, write_scored_pool
from privalign.cli import main


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIVALIGN_CACHE_DIR", str(tmp_path / "cache"))
    write_scored_pool(tmp_path / "pool.jsonl")
    (tmp_path / "not_gzip.jsonl.gz").write_text("garbage\n")
    (tmp_path / "a_dir").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--pool", "not_gzip.jsonl.gz", "--out", "o", "--no-progress"],
        ["simulate", "--pool", "not_gzip.jsonl.gz", "--out", "o", "--no-progress", "--no-pool-cache"],
        ["session", "--pool", "not_gzip.jsonl.gz", "--budget-epsilon", "9", "--out", "o", "--no-progress"],
        ["bon-curve", "--pool", "not_gzip.jsonl.gz", "--out", "o"],
    ],
)
def test_a_corrupt_gzip_pool_is_named(argv, work, capsys):
    one_line_error(argv, ["not_gzip.jsonl.gz", "gzip"], capsys)
    assert not (work / "o").exists() and not (work / "o.json").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--pool", "a_dir", "--out", "o", "--no-progress"],
        ["bon-curve", "--pool", "a_dir", "--out", "o"],
    ],
)
def test_a_directory_given_as_pool_is_called_a_directory(argv, work, capsys):
    one_line_error(argv, ["a_dir", "is a directory"], capsys)


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        # was "[Errno 21] Is a directory: 'a_dir'", naming no flag
        (
            ["fit-reward", "--data", "a_dir", "--method", "rr-iht", "--out", "m.json"],
            ["argument --data:", "a_dir"],
        ),
        # was "Configuration file not found: a_dir"
        (["reproduce", "p1-scaling", "--config", "a_dir", "--out", "o"], ["a_dir", "is a directory"]),
    ],
)
def test_a_directory_given_as_an_input_file_names_the_flag(argv, needles, work, capsys):
    line = one_line_error(argv, needles, capsys)
    assert "Errno" not in line and "not found" not in line
    assert not (work / "m.json").exists() and not (work / "o").exists()


def _session(*extra):
    return ["session", "--pool", "pool.jsonl", "--out", "o", "--no-progress", *extra]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        # the budgets were reported as '--epsilon' / '--delta', which are other options of session
        (["--budget-epsilon", "0"], ["'--budget-epsilon'", "0.0"]),
        (["--budget-epsilon", "nan"], ["'--budget-epsilon'", "nan"]),
        (["--budget-epsilon", "-1"], ["'--budget-epsilon'", "-1"]),
        (["--budget-epsilon", "9", "--budget-delta", "2"], ["'--budget-delta'", "2.0"]),
        (
            ["--budget-epsilon", "9", "--method", "privbon", "--budget-delta", "0"],
            ["'--budget-delta'", "0.0"],
        ),
        # --max-prompts 0 / -1 ran (-1 reported prompts_refused = -1)
        (["--budget-epsilon", "9", "--max-prompts", "0"], ["--max-prompts", "'0'"]),
        (["--budget-epsilon", "9", "--max-prompts", "-1"], ["--max-prompts", "'-1'"]),
    ],
)
def test_session_names_the_budget_options(extra, needles, work, capsys):
    one_line_error(_session(*extra), needles, capsys, cmd="session")
    assert not (work / "o").exists()


def test_session_note_names_the_delta_budget_when_it_is_the_one_exceeded(work, capsys):
    assert main(_session("--budget-epsilon", "100", "--budget-delta", "0")) == 0
    err = capsys.readouterr().err
    assert "no prompt was served" in err and "--budget-delta 0" in err and "delta = 1e-06" in err
    assert "exceeds --budget-epsilon 100" not in err


_PRIVITP = ["--method", "privitp", "--scores", "0.1,0.5", "--scores-b", "0.1,0.2,0.3", "--beta", "0.1"]


@pytest.mark.parametrize("cmd", ["select", "law"])
@pytest.mark.parametrize(
    ("sigmas", "flag"),
    [
        # ZeroDivisionError (an "internal error", status 1) for select; 'epsilon_realized' named otherwise
        (["--sigma-x", "1e-300", "--sigma-z", "1e-300"], "'--sigma-x'"),
        (["--sigma-x", "1e-10", "--sigma-z", "1"], "'--sigma-x'"),
        (["--sigma-x", "1", "--sigma-z", "1e-300"], "'--sigma-z'"),
    ],
)
def test_privitp_noise_too_small_for_a_finite_cost_names_the_sigma(cmd, sigmas, flag, capsys):
    argv = [cmd, *_PRIVITP, *sigmas] + (["--seed", "0"] if cmd == "select" else [])
    one_line_error(argv, [flag, "finite privacy cost"], capsys, cmd=cmd)


def test_session_privitp_noise_too_small_names_the_sigma(work, capsys):
    argv = _session("--budget-epsilon", "100", "--sigma-x", "1e-10")
    one_line_error(argv, ["'--sigma-x'", "1e-10"], capsys, cmd="session")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        # simulate and session wrote into the current directory; bon-curve wrote '..json' and '..png.png'
        (["simulate", "--synthetic", "2,8", "--out", "", "--no-progress"], "--out"),
        (["session", "--pool", "pool.jsonl", "--budget-epsilon", "9", "--out", "", "--no-progress"], "--out"),
        (["bon-curve", "--pool", "pool.jsonl", "--out", " "], "--out"),
        (["bon-curve", "--pool", "", "--out", "b"], "--pool"),
        (["fit-reward", "--data", "", "--method", "mle", "--out", "m.json"], "--data"),
        (["upgrade-reward-model", "", "--out", "m.json"], "model"),
        (["reproduce", "p1-scaling", "--config", "", "--out", "r"], "--config"),
    ],
)
def test_an_empty_path_is_refused(argv, flag, work, capsys):
    before = set(work.iterdir())
    one_line_error(argv, [f"argument {flag}: must not be empty"], capsys)
    assert set(work.iterdir()) == before


def _pairs(path: Path, n: int = 40) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"}) + "\n")
    return path


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--n-pairs", "0"], ["'--n-pairs'", "0"]),  # was "The 'limit' parameter"
        (["--step-size", "-1"], ["'--step-size'", "-1"]),  # was found only after loading the data
        (["--n-iter", "0"], ["'--n-iter'", "0"]),
        (["--sparsity", "5000"], ["'--sparsity'", "5000", "d=4096"]),  # was found only after loading
        (["--out", "a_dir"], ["'--out'", "a_dir", "directory"]),  # was "[Errno 21] ... '.tmp.*' -> 'a_dir'"
        # was ignored without --tune (nothing is selected on a validation split then)
        (["--validation-fraction", "0.3"], ["--validation-fraction", "--tune", "0.3"]),
    ],
)
def test_fit_reward_checks_its_options_before_loading_data(extra, needles, work, capsys, monkeypatch):
    import privalign.estimation.realdata as realdata

    def no_loading(*a, **k):
        raise AssertionError("data loaded before the options were checked")

    monkeypatch.setattr(realdata, "load_preference_data", no_loading)
    _pairs(work / "pairs.jsonl")
    argv = ["fit-reward", "--data", "pairs.jsonl", "--method", "rr-iht", "--seed", "0", "--out", "m.json"]
    line = one_line_error(argv + extra, needles, capsys, cmd="fit-reward")
    assert "limit" not in line and not (work / "m.json").exists()


def test_upgrade_reward_model_checks_the_source_before_writing(work, capsys):
    # a version-1 document without coefficients: the error named the *output* file, which was left behind
    (work / "old.json").write_text(json.dumps({"format": "privalign.reward_model", "version": 1}))
    one_line_error(
        ["upgrade-reward-model", "old.json", "--out", "new.json"],
        ["old.json", "'coef'"],
        capsys,
        cmd="upgrade-reward-model",
    )
    assert not (work / "new.json").exists()


def test_upgrade_reward_model_names_directories(work, capsys):
    import shutil

    import privalign.models

    shipped = Path(privalign.models.__file__).parent / "reward_models" / "hh-rlhf-harmless-rr-iht.json"
    shutil.copy(shipped, work / "rm.json")
    cmd = "upgrade-reward-model"
    # was "[Errno 21] Is a directory: '.tmp.*' -> 'a_dir'" and "The reward-model file a_dir does not exist."
    one_line_error([cmd, "rm.json", "--out", "a_dir"], ["a_dir", "is a directory"], capsys, cmd=cmd)
    one_line_error([cmd, "a_dir", "--out", "x.json"], ["a_dir", "is a directory"], capsys, cmd=cmd)
    assert sorted(p.name for p in (work / "a_dir").iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        # were "The 'n_grid' parameter must be non-empty", "The 'specs' parameter ...", and
        # "Lower 'n_grid' or pass skip_short=True": names the user cannot type
        (["--max-log2-n", "-1"], ["--max-log2-n", "'-1'"]),
        (["--methods", ""], ["'--methods'", "''"]),
        (["--max-log2-n", "10"], ["--max-log2-n", "2048", "--skip-short"]),
    ],
)
def test_simulate_names_its_options(extra, needles, work, capsys):
    argv = ["simulate", "--synthetic", "2,8", "--out", "o", "--no-progress", *extra]
    line = one_line_error(argv, needles, capsys, cmd="simulate")
    assert "n_grid" not in line and "specs" not in line and "skip_short" not in line
    assert not (work / "o").exists()


@pytest.mark.parametrize(
    "text",
    [
        "{broken",  # was the bare JSON message, naming no file
        "[]",  # was "internal error (TypeError)", status 1
        "{}",  # was "internal error (KeyError): 'experiment'", status 1 (e.g. a directory of another tool)
    ],
)
@pytest.mark.parametrize("cmd", ["report", "reproduce"])
def test_a_damaged_run_manifest_is_named(cmd, text, work, capsys):
    (work / "run").mkdir()
    (work / "run" / "manifest.json").write_text(text)
    if cmd == "report":
        argv = ["report", "run", "--out", "rep"]
    else:
        argv = ["reproduce", "p1-scaling", "--quick", "--out", "run", "--no-progress"]
    one_line_error(argv, ["manifest.json"], capsys, cmd=cmd)
    assert not (work / "rep").exists()


def test_bon_curve_refuses_a_pool_without_gold_rewards(work, capsys):
    # was status 0: "gold peaks at N=1 (nan) ...; not over-optimised", a verdict on no data
    resp = [{"text": "x", "proxy_reward": 0.1}, {"text": "y", "proxy_reward": 0.3}]
    (work / "nogold.jsonl").write_text(json.dumps({"prompt": "a", "responses": resp}) + "\n")
    argv = ["bon-curve", "--pool", "nogold.jsonl", "--out", "b"]
    one_line_error(argv, ["nogold.jsonl", "true_reward", "rescore-pool"], capsys, cmd="bon-curve")
    assert not (work / "b.json").exists() and not (work / "b.png").exists()


def test_keys_without_an_action_is_one_line(capsys):
    # printed the whole 11-line help on stderr
    one_line_error(["keys"], ["ACTION", "create"], capsys, cmd="keys")


def test_keys_config_that_is_not_toml_is_named(work, capsys):
    # was the bare TOML parser message, naming neither --config nor the file
    (work / "bad.toml").write_text("this is [not toml\n")
    one_line_error(
        ["keys", "list", "--config", "bad.toml"], ["--config", "bad.toml"], capsys, cmd="keys list"
    )


def test_keys_db_that_is_a_bare_path_gets_a_url_hint(work, capsys):
    # was only SQLAlchemy's "Could not parse SQLAlchemy URL", with no hint of what a URL looks like
    pytest.importorskip("sqlalchemy", reason="needs privalign[serve]")
    argv = ["keys", "list", "--db", "x.db"]
    line = one_line_error(argv, ["--db 'x.db'", "sqlite:///"], capsys, cmd="keys list")
    assert str(work / "x.db") in line
    assert not (work / "x.db").exists()


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        # was "Give 'proxy_reward' or 'true_reward' (or both)": Python names, not the flags
        (["--pool", "pool.jsonl", "--out", "r.jsonl"], ["'--proxy-reward'", "'--true-reward'"]),
        # was "names a file that does not exist: 'a_dir'"
        (["--pool", "a_dir", "--proxy-reward", "clean", "--out", "r.jsonl"], ["'--pool'", "directory"]),
        (["--pool", "pool.jsonl", "--proxy-reward", "clean", "--out", "pool.jsonl"], ["'--pool'", "'--out'"]),
    ],
)
def test_rescore_pool_names_its_options(argv, needles, work, capsys):
    line = one_line_error(["rescore-pool", *argv], needles, capsys, cmd="rescore-pool")
    assert "proxy_reward" not in line and "true_reward" not in line
    assert not (work / "r.jsonl").exists()


def test_select_messages_use_command_line_words(capsys):
    # were "Got np.float64(nan) at index (1,)" and "(pass clip=True to clip)"
    line = one_line_error(["select", "--method", "bon", "--scores", "0.1,nan"], ["nan"], capsys, cmd="select")
    assert "np.float64" not in line and "at index 1." in line
    argv = ["select", "--method", "privbon", "--epsilon", "1", "--scores", "0.1,1.5", "--seed", "0"]
    line = one_line_error(argv, ["'--scores'", "pass --clip"], capsys, cmd="select")
    assert "clip=True" not in line


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--synthetic", "2,8", "--no-progress", "--out", "pool.jsonl"],
        ["session", "--pool", "pool.jsonl", "--budget-epsilon", "100", "--out", "pool.jsonl"],
    ],
)
def test_an_output_directory_that_is_a_file_is_refused_before_the_work(argv, work, capsys, monkeypatch):
    # was "[Errno 17] File exists: 'pool.jsonl'", after the whole run
    import privalign.alignment.session as session
    import privalign.alignment.simulation as simulation

    def no_work(*a, **k):
        raise AssertionError("the run started before --out was checked")

    monkeypatch.setattr(simulation, "run_protocol", no_work)
    monkeypatch.setattr(session, "run_session", no_work)
    one_line_error(argv, ["--out", "pool.jsonl", "not a directory"], capsys)
    # below a file: '[Errno 20] Not a directory', after the whole run
    argv = [*argv[:-1], "pool.jsonl/sub/dir"]
    one_line_error(argv, ["--out", "pool.jsonl is a file"], capsys)


def test_session_sigma_z_zero_is_refused_not_replaced_by_sigma_x(work, capsys):
    # '--sigma-z 0' ran with σ_Z = σ_X (args.sigma_z or args.sigma_x), status 0
    argv = _session("--budget-epsilon", "100", "--sigma-z", "0")
    one_line_error(argv, ["'--sigma-z'", "0.0"], capsys, cmd="session")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        # were "The 'sigma-z' parameter ...": a hyphenated name the CLI did not turn into the flag
        (["simulate", "--synthetic", "2,64", "--out", "o", "--sigma-x", "1", "--sigma-z", ""], "--sigma-z"),
        (["simulate", "--synthetic", "2,64", "--out", "o", "--score-range", "a,b"], "--score-range"),
        (["law", "--method", "itp", "--beta", "1", "--scores", "0.1", "--scores-b", ","], "--scores-b"),
    ],
)
def test_list_options_are_named_as_flags(argv, flag, work, capsys):
    one_line_error(argv, [f"The '{flag}' option"], capsys)


@pytest.mark.parametrize("name", ["results.jsonl", "summary.json"])
def test_report_names_a_damaged_results_file(name, work, capsys):
    # was the bare JSON message ("Expecting property name ..."), naming no file
    (work / "run").mkdir()
    (work / "run" / "manifest.json").write_text(json.dumps({"experiment": "p1-scaling"}))
    (work / "run" / name).write_text("{bad\n")
    one_line_error(["report", "run", "--out", "rep"], [name, "not valid JSON"], capsys, cmd="report")
    assert not (work / "rep").exists()


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        # ran plain best-of-N (no noise) while the user asked for ε = 1
        (
            ["select", "--method", "bon", "--scores", "0.1,0.5", "--epsilon", "1", "--seed", "0"],
            ["--epsilon", "not private", "privbon"],
        ),
        (
            [
                "law",
                "--method",
                "itp",
                "--beta",
                "1",
                "--scores",
                "0.1",
                "--scores-b",
                "0.2",
                "--sigma-x",
                "1",
            ],
            ["--sigma-x", "not private"],
        ),
        (
            [
                "select",
                "--method",
                "privbon",
                "--epsilon",
                "1",
                "--beta",
                "2",
                "--scores",
                "0.1,0.5",
                "--seed",
                "0",
            ],
            ["--beta", "privbon"],
        ),
    ],
)
def test_an_option_the_method_does_not_use_is_refused_not_ignored(argv, needles, capsys):
    one_line_error(argv, needles, capsys)


def test_the_options_each_method_uses_are_accepted(capsys):
    base = ["--scores", "0.1,0.5", "--seed", "0", "--json"]
    assert (
        main(
            [
                "select",
                "--method",
                "privbon",
                "--epsilon",
                "1",
                "--sigma-reg",
                "0.1",
                "--sensitivity",
                "1",
                *base,
            ]
        )
        == 0
    )
    b = ["--scores-b", "0.2,0.3"]
    assert main(["select", "--method", "itp", "--beta", "1", *b, *base]) == 0
    pitp = ["--beta", "1", "--sigma-x", "2", "--sigma-z", "1", "--sensitivity", "1"]
    assert main(["select", "--method", "privitp", *pitp, *b, *base]) == 0
    capsys.readouterr()
