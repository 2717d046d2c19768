"""The newcomer list: each edge a new user hit, with the behaviour it has now. A user
error is one line ``privalign CMD: error: ...`` naming the flag and the value, exit status 2, nothing
written; no test here loads a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _util import one_line_error
from privalign.cli import main


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIVALIGN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


# --- simulate: size limits (were "internal error (MemoryError) ... a bug", exit 1) ---------------------


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
    one_line_error(["simulate", *extra, "--out", "o", "--no-progress"], needles, capsys)
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
    one_line_error(
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


# --- build-pool: incompatible options refused before any dataset or model loads; a lock on --out -----------


def _build_pool_argv(out="pool.jsonl", *extra):
    return [
        "build-pool", "--dataset", "imdb", "--n", "2", "--num-prompts", "1", "--proxy-reward", "vader",
        "--true-reward", "vader", "--out", out, "--no-progress", *extra,
    ]  # fmt: skip


@pytest.fixture
def no_model(monkeypatch):
    """build-pool with the dataset and the builder replaced: nothing loads; records what ran."""
    import privalign.data.datasets as datasets
    import privalign.pipeline.build_pool as pipeline

    ran = []

    def fail(*a, **k):
        raise AssertionError("loaded a dataset or a model")

    def build(cfg, examples, out, **kw):
        ran.append(out)
        assert Path(f"{out}.lock").read_text() == str(__import__("os").getpid())  # held while building
        return {"num_prompts": 1, "candidates_per_prompt": 2, "counts": [2]}

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [object()])
    monkeypatch.setattr(pipeline, "build_pool", build)
    return ran, fail, monkeypatch


@pytest.mark.parametrize(
    ("dataset", "flag", "reward"),
    [
        ("hh-rlhf", "--true-reward", "gsm8k"),
        ("imdb", "--proxy-reward", "mmlu"),
        ("gsm8k", "--true-reward", "math"),
    ],
)
def test_build_pool_refuses_a_verifier_of_another_dataset_before_loading(
    dataset, flag, reward, work, capsys, no_model
):
    ran, fail, mp = no_model
    import privalign.data.datasets as datasets

    mp.setattr(datasets, "load_dataset", fail)
    argv = _build_pool_argv()
    argv[argv.index("imdb")] = dataset
    argv[argv.index(flag) + 1] = reward
    one_line_error(argv, [f"argument {flag}:", repr(reward), f"--dataset {dataset}"], capsys)
    assert not ran and not list(work.glob("pool*"))


def test_build_pool_refuses_a_second_run_on_the_same_out(work, capsys, no_model):
    import fcntl
    import os

    ran, _, _ = no_model
    fd = os.open("pool.jsonl.lock", os.O_RDWR | os.O_CREAT)  # a first run, alive, holds the lock
    os.write(fd, b"4242")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        line = one_line_error(_build_pool_argv(), ["argument --out:", "pool.jsonl", "pid 4242"], capsys)
        assert "another build-pool run" in line and not ran
    finally:
        os.close(fd)
    assert main(_build_pool_argv()) == 0 and ran == ["pool.jsonl"]  # released: the next run goes ahead
    assert not Path("pool.jsonl.lock").exists()


def test_build_pool_takes_over_the_stale_lock_of_a_dead_run(work, capsys, no_model):
    ran, _, _ = no_model
    Path("sub").mkdir()
    Path("sub/pool.jsonl.lock").write_text("999999999")  # left by a killed run: no process holds it
    assert main(_build_pool_argv("sub/pool.jsonl")) == 0, capsys.readouterr().err
    assert ran == ["sub/pool.jsonl"] and not Path("sub/pool.jsonl.lock").exists()
    assert main(_build_pool_argv("new/dir/pool.jsonl")) == 0  # directories made for the lock only: removed
    assert not Path("new").exists()


# --- fit-reward: options the method does not read are refused; --out is checked before any work ------------


@pytest.mark.parametrize(
    ("method", "extra", "needles"),
    [
        ("rr-iht", ["--delta", "1e-5"], ["argument --delta:", "--method rr-iht", "1e-05"]),  # = the default
        ("mle", ["--epsilon", "2"], ["argument --epsilon:", "--method mle", "not private"]),
        ("iht", ["--delta", "1e-6"], ["argument --delta:", "--method iht"]),
        ("rr", ["--sparsity", "4"], ["argument --sparsity:", "--method rr"]),
        ("mle", ["--n-iter", "5"], ["argument --n-iter:", "--method mle"]),
        ("dp-sgd", ["--n-iter", "5"], ["argument --n-iter:", "--method dp-sgd"]),
        ("rr-iht", ["--out", "afile/m.json"], ["argument --out:", "afile", "is a file"]),  # was after the fit
        ("rr-iht", ["--audit-record", "afile/a.json"], ["argument --audit-record:", "afile"]),
    ],
)
def test_fit_reward_refuses_unused_options_and_unwritable_outputs_before_loading_data(
    method, extra, needles, work, capsys, monkeypatch
):
    import privalign.estimation.realdata as realdata

    def no_loading(*a, **k):
        raise AssertionError("data loaded before the options were checked")

    monkeypatch.setattr(realdata, "load_preference_data", no_loading)
    (work / "afile").write_text("x")
    one_line_error(["fit-reward", "--data", "pairs.jsonl", "--method", method, *extra], needles, capsys)


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("dp-iht", ["--epsilon", "2", "--delta", "1e-6", "--sparsity", "2", "--n-iter", "3"]),
        ("dp-sgd", ["--epsilon", "2", "--delta", "1e-6", "--step-size", "0.1"]),
        ("rr-iht", ["--epsilon", "2", "--sparsity", "2", "--step-size", "0.1", "--n-iter", "3"]),
        ("mle", []),
    ],
)
def test_fit_reward_accepts_the_options_each_method_reads(method, extra, work, capsys):
    with open(work / "pairs.jsonl", "w") as fh:
        for i in range(40):
            fh.write(json.dumps({"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"}) + "\n")
    argv = ["fit-reward", "--data", "pairs.jsonl", "--method", method, "--n-features", "64", "--seed", "0"]
    assert main([*argv, *extra, "--out", "m.json", "--json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["privacy_unit"] == ("none" if method == "mle" else "label" if "rr" in method else "sample")


# --- session: unused options refused; defaults that work on the shipped pools; a human summary -------------


def _scored_pool(path: Path, prompts: int, candidates: int, low: float, high: float) -> Path:
    with open(path, "w") as fh:
        for p in range(prompts):
            resp = [
                {
                    "text": f"t{i}",
                    "proxy_reward": low + (high - low) * ((i * 7 + p) % 13) / 12,
                    "true_reward": i % 2,
                }
                for i in range(candidates)
            ]
            fh.write(json.dumps({"prompt": f"p{p}", "responses": resp}) + "\n")
    return path


def _session(pool, *extra):
    return ["session", "--pool", str(pool), "--budget-epsilon", "100", "--out", "s", "--no-progress", *extra]


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--method", "privbon", "--sigma-x", "2"], "--sigma-x"),
        (["--method", "privbon", "--beta", "0.1"], "--beta"),
        (["--method", "privbon", "--delta", "1e-5"], "--delta"),
        (["--method", "privitp", "--epsilon", "2"], "--epsilon"),
        (["--score-range", "0,1", "--r-max", "1"], "--r-max"),
    ],
)
def test_session_refuses_options_its_method_does_not_read(extra, flag, work, capsys):
    pool = _scored_pool(work / "p.jsonl", 3, 40, 0.0, 1.0)
    one_line_error(_session(pool, *extra), [f"argument {flag}:"], capsys)
    assert not (work / "s").exists()


def test_session_scores_outside_the_public_range_ask_for_one_and_score_range_runs(work, capsys):
    hh = _scored_pool(work / "hh.jsonl", 3, 40, -3.0, 3.0)  # like the shipped HH pools' linear proxy
    line = one_line_error(_session(hh), ["--score-range", "--r-max", "--clip"], capsys)
    assert "-3" not in line and "3.0" not in line  # the private scores are not shown
    assert not (work / "s").exists()
    assert main(_session(hh, "--score-range", "-4,4", "--sigma-x", "0.5", "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompts_served"] + out["prompts_refused"] == 3


def test_session_defaults_run_on_a_small_pool_and_print_a_summary_for_a_person(work, capsys):
    pool = _scored_pool(work / "gsm.jsonl", 3, 8, 0.3, 0.9)  # 8 candidates, as the shipped GSM8K pool
    assert main(_session(pool)) == 0, capsys.readouterr().err  # n = 3 (2n + 1 = 7 ≤ 8); was n = 16: refused
    out = capsys.readouterr().out
    assert not out.lstrip().startswith("{") and "served" in out and "session.json" in out
    assert json.loads((work / "s" / "session.json").read_text())["method"] == "privitp"


def test_session_runs_on_the_shipped_pools(work, capsys):
    root = Path(__file__).resolve().parents[1] / "pools"
    for name, extra in (("winrate-imdb.jsonl.gz", []), ("gsm8k-smollm2.jsonl.gz", [])):
        rc = main(
            [
                "session",
                "--pool",
                str(root / name),
                "--budget-epsilon",
                "20",
                "--out",
                "s",
                "--no-progress",
                *extra,
            ]
        )
        assert rc == 0, (name, capsys.readouterr().err)
    rc = main(_session(root / "hh-smollm2.jsonl.gz", "--score-range", "-4,4", "--max-prompts", "2"))
    assert rc == 0, capsys.readouterr().err


def test_session_defaults_run_on_the_shipped_hh_pools_with_their_declared_range(work, capsys):
    """The shipped HH pools' proxy is an unbounded Bradley-Terry logit (scores outside [0, 1]): with no range
    option, session takes the public range their manifests declare ([-4, 4]) and says so on stderr; it was a
    refusal asking for --score-range. PrivITP's default σ_X is R_max, so the prompts are served."""
    root = Path(__file__).resolve().parents[1] / "pools"
    for name in ("hh-smollm2.jsonl.gz", "hh-smollm2-2048-p1000.jsonl.gz"):
        rc = main(_session(root / name, "--max-prompts", "2"))
        err = capsys.readouterr().err
        assert rc == 0, err
        assert "public score range [-4, 4] declared in" in err and "manifest.json" in err
        rec = json.loads((work / "s" / "session.json").read_text())
        assert rec["score_range"] == {
            "range": "-4.0,4.0",
            "declared_in": str(root / name.replace(".jsonl.gz", ".manifest.json")),
        }
        # σ_X defaults to R_max = 8 (1 in units of the range): a prompt's worst case (≈ 9) fits ε = 100
        assert rec["prompts_served"] == 2, rec
        (work / "s" / "session.json").unlink()
        (work / "s").rmdir()
    # a range option given is used as given (no note, no manifest range)
    assert main(_session(root / "hh-smollm2.jsonl.gz", "--max-prompts", "1", "--clip", "--r-max", "8")) == 0
    assert "declared in" not in capsys.readouterr().err


def test_session_refuses_a_malformed_declared_range_in_one_line(work, capsys):
    pool = _scored_pool(work / "hh.jsonl", 3, 40, -3.0, 3.0)
    (work / "hh.manifest.json").write_text(json.dumps({"proxy_score_range": {"low": 4, "high": -4}}))
    one_line_error(_session(pool), ["proxy_score_range", "hh.manifest.json"], capsys)
    assert not (work / "s").exists()
    (work / "hh.manifest.json").write_text(
        json.dumps({"proxy_score_range": {"low": -4, "high": 4, "why": "x"}})
    )
    assert main(_session(pool, "--json")) == 0, capsys.readouterr().err


# --- rough edges ----------------------------------------------------------------------------------------


def test_a_closed_stdout_is_not_an_error(work, capsys, monkeypatch):
    import sys

    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())  # 'privalign reproduce --list | head': head has exited
    rc = main(["reproduce", "--list"])
    monkeypatch.undo()
    assert rc == 141 and "Broken pipe" not in capsys.readouterr().err  # was "[Errno 32] Broken pipe", exit 2


def test_bon_curve_out_with_a_json_suffix_is_the_prefix(work, capsys, monkeypatch):
    import privalign.pipeline.analysis as analysis

    seen = []
    monkeypatch.setattr(
        analysis, "write_bon_report", lambda pools, out, **kw: seen.append(out) or {"series": []}
    )
    assert main(["bon-curve", "--pool", "p.jsonl", "--out", "curve.json"]) == 0
    assert (
        seen == ["curve"] and "wrote curve.json and curve.png" in capsys.readouterr().err
    )  # not curve.json.json


def test_audit_exits_1_on_a_violation_with_the_reason_on_stderr(capsys, monkeypatch):
    import privalign.audit.worst_case as worst_case

    report = {
        "mechanism": "laplace", "pair": "0 vs 1", "claimed_epsilon": 1.0, "epsilon_lower_bound": 1.9,
        "alpha": 1e-3, "samples": [10, 10], "verdict": "violation",
    }  # fmt: skip
    monkeypatch.setattr(worst_case, "audit_builtin", lambda *a, **k: dict(report))
    assert main(["audit", "--mechanism", "laplace", "--epsilon", "1"]) == 1  # was 0
    err = capsys.readouterr().err
    assert "violation" in err and "1.9" in err
    assert main(["audit", "--mechanism", "laplace", "--epsilon", "1", "--no-fail-on-violation"]) == 0
    monkeypatch.setattr(worst_case, "audit_builtin", lambda *a, **k: {**report, "verdict": "consistent"})
    assert main(["audit", "--mechanism", "laplace", "--epsilon", "1"]) == 0


# --- issue 36: a new user's command-line edges ------------------------------------------------------------


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def read_only(work, monkeypatch):
    """A directory ``ro`` nobody may write into: mode 0555, and, for root (whom the mode does not stop, as a
    read-only file system would), ``os.access`` answering as it does for a read-only file system."""
    import os

    ro = work / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.access(ro, os.W_OK):
        real = os.access
        monkeypatch.setattr(
            os,
            "access",
            lambda p, mode, *a, **k: (
                False if mode & os.W_OK and str(p).startswith(str(ro)) else real(p, mode)
            ),
        )
    yield ro
    ro.chmod(0o755)


def _no_work(*a, **k):
    raise AssertionError("work started before --out was checked")


def _in_a_fresh_process(argv: list[str], ro: Path) -> tuple[int, list[str], bool]:
    """``privalign ARGV`` in a new interpreter, with ``ro`` unwritable as in :func:`read_only`: (exit
    status, stderr lines, whether torch was imported)."""
    import os
    import subprocess
    import sys

    code = f"""
import json, os, sys
ro, real = {str(ro)!r}, os.access
if real(ro, os.W_OK):  # root: answer as a read-only file system does
    os.access = lambda p, m, *a, **k: False if m & os.W_OK and str(p).startswith(ro) else real(p, m)
from privalign.cli import main
rc = main({argv!r})
print(json.dumps({{"rc": rc, "torch": "torch" in sys.modules}}))
"""
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=ro.parent, env=env, capture_output=True, text=True, timeout=300
    )
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return res["rc"], [ln for ln in p.stderr.splitlines() if ln.strip()], res["torch"]


@pytest.mark.parametrize(
    "argv",
    [
        ["dpo", "--data", "pairs.jsonl", "--privacy", "none", "--out", "ro/run", "--no-progress"],
        ["align", "--reward-model", "vader", "--prompts", "p.txt", "--out", "ro/run", "--no-progress"],
    ],
    ids=["dpo", "align"],
)
def test_a_read_only_out_is_refused_before_torch_is_imported(argv, work, read_only):
    """A read-only --out was found only after the model had loaded and trained (dpo). Refused first, in a
    process that never imports torch, so no model can have loaded."""
    rc, err, torch = _in_a_fresh_process(argv, read_only)
    assert rc == 2 and len(err) == 1, err
    assert (
        err[0].startswith(f"privalign {argv[0]}: error: argument --out: ro/run") and "cannot write" in err[0]
    )
    assert not torch and _files(read_only) == set()


def test_build_pool_refuses_a_read_only_out_before_loading_anything(work, read_only, capsys, no_model):
    ran, _, _ = no_model
    one_line_error(_build_pool_argv("ro/pool.jsonl"), ["argument --out:", "ro/pool.jsonl"], capsys)
    assert not ran and _files(read_only) == set()


def test_reproduce_records_only_with_nothing_to_summarise_refuses_before_any_work(work, capsys, monkeypatch):
    """It generated the private pairs (76 s), then refused, leaving manifest.json, results.jsonl and data/."""
    for mod in ("torch", "transformers", "peft", "trl"):
        pytest.importorskip(mod, reason="needs privalign[rlhf]")
    import privalign.experiments.frontier as frontier

    monkeypatch.setattr(frontier, "_generate_pairs", _no_work)
    monkeypatch.setattr(frontier, "_base", _no_work)
    argv = ["reproduce", "beyond-frontier", "--quick", "--set", "records_only=true", "--out", "new"]
    one_line_error([*argv, "--no-progress"], ["records_only", "no reference record", "prior_results"], capsys)
    assert _files(work) == set()


def test_serve_check_writes_nothing(work, capsys):
    """`serve --check --config configs/serve.example.toml` created configs/privalign-service.db (the
    config's relative SQLite ledger) inside the checkout; --check opens the database read-only."""
    pytest.importorskip("sqlalchemy", reason="needs privalign[serve]")
    import shutil

    from privalign.service.config import DEFAULT_REWARD_MODEL

    root = Path(__file__).resolve().parents[1]
    (work / "configs").mkdir()
    shutil.copy(root / "configs" / "serve.example.toml", work / "configs")
    shutil.copy(DEFAULT_REWARD_MODEL, work / "configs" / "reward.json")
    before = _files(work)
    argv = ["serve", "--check", "--config", "configs/serve.example.toml", "--port", "0"]
    assert main(argv) == 0, capsys.readouterr().err
    assert _files(work) == before
    summary = json.loads(capsys.readouterr().out)
    assert summary["database"] == "sqlite" and summary["database_status"].startswith("absent")
    # an existing ledger is read, not written (no -wal or -shm file either)
    url = f"sqlite:///{work / 'configs' / 'privalign-service.db'}"
    assert main(["keys", "create", "--budget-epsilon", "1", "--db", url, "--json"]) == 0
    capsys.readouterr()
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*")}
    assert main(argv) == 0, capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in work.rglob("*")} == before
    assert "(current)" in json.loads(capsys.readouterr().out)["database_status"]


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--check", "--generator", "none", "--db", "mysql://x"],
        ["keys", "list", "--db", "mysql://x"],
    ],
)
def test_an_unsupported_database_names_the_supported_ones(argv, work, capsys):
    """Was `internal error (ModuleNotFoundError): No module named 'MySQLdb'`, exit 1."""
    pytest.importorskip("sqlalchemy", reason="needs privalign[serve]")
    cmd = " ".join(argv[:2]) if argv[0] == "keys" else "serve"
    needles = ["'--db'", "'mysql://x'", "sqlite:///", "postgresql+psycopg://"]
    one_line_error(argv, needles, capsys, cmd=cmd)
    assert _files(work) == set()


def test_an_unsupported_database_in_the_config_names_the_key(work, capsys):
    pytest.importorskip("sqlalchemy", reason="needs privalign[serve]")
    Path("s.toml").write_text(
        '[database]\nurl = "postgresql+psycopg2://u@h/db"\n[generator]\nkind = "none"\n'
    )
    line = one_line_error(["serve", "--check", "--config", "s.toml"], ["database.url", "psycopg"], capsys)
    assert "postgresql+psycopg://" in line


def test_serve_blames_the_host_for_an_address_that_is_not_one(work, capsys):
    """`serve --host 256.1.1.1` was `argument --port: cannot listen on 256.1.1.1:8000 ...`."""
    pytest.importorskip("sqlalchemy", reason="needs privalign[serve]")
    argv = ["serve", "--check", "--generator", "none", "--host", "256.1.1.1", "--port", "0"]
    line = one_line_error(argv, ["argument --host:", "256.1.1.1"], capsys)
    assert "--port" not in line
    assert _files(work) == set()


def test_simulate_blames_max_log2_n_for_an_n_the_pool_cannot_hold(work, capsys):
    """`simulate --max-log2-n 40` blamed '--epsilon', which was never passed (PrivITP's noise was calibrated
    to N = 2^40 before the pool was checked)."""
    argv = ["simulate", "--synthetic", "3,16", "--max-log2-n", "40", "--out", "o", "--no-progress"]
    line = one_line_error(argv, ["argument --max-log2-n:", "2^40", "widest prompt has 16"], capsys)
    assert "--epsilon" not in line and not (work / "o").exists()
    argv[argv.index("40")] = "5"  # also with --skip-short: no prompt holds N = 32 (64 for PrivITP's pools)
    one_line_error([*argv, "--skip-short"], ["argument --max-log2-n:", "2^5"], capsys)


def test_align_says_what_differs_from_the_run_in_out_and_how_to_go_on(work, capsys):
    pytest.importorskip("vaderSentiment", reason="needs privalign[models]")
    from privalign.rlhf.prompts import prompts_sha256
    from privalign.rlhf.train import AlignConfig
    from privalign.rlhf.workflow import load_align_inputs

    Path("p.txt").write_text("The film was\nI watched this movie and\n")
    inputs = load_align_inputs("vader", prompts="p.txt")
    (work / "run").mkdir()
    (work / "run" / "manifest.json").write_text(
        json.dumps(
            {
                "format": "privalign.align/1",
                "run_hash": "0" * 64,  # an earlier run: the same reward and prompts, 20 steps at β = 0.05
                "status": "complete",
                "reward_model": inputs.reward.describe(),
                "prompts": {"sha256": prompts_sha256(inputs.prompts)},
                "config": AlignConfig(steps=20).to_dict(),
                "base_model": "smollm2",
            }
        )
    )
    argv = ["align", "--reward-model", "vader", "--prompts", "p.txt", "--out", "run", "--steps", "30"]
    line = one_line_error(argv, ["argument --out:", "'run'", "--steps 30, not 20", "new --out"], capsys)
    assert "--beta" not in line and "reward" not in line.split("(")[1]


def test_a_resumed_align_says_from_which_step(work, capsys, monkeypatch):
    """The line comes from the library's ``on_resume`` hook (the real resumption: tests/rlhf, ``model``)."""
    import privalign.rlhf.workflow as workflow

    def resumed(*a, on_resume=None, **k):
        assert on_resume is not None, "align was not asked to report a resumption"
        on_resume(Path("run/checkpoints/checkpoint-5"), 5)
        return {"steps_done": 20, "prompts": {"n": 2}, "training_log": [], "policy_dir": "run/policy",
                "privacy": {"statement": "No privacy guarantee."}}  # fmt: skip

    monkeypatch.setattr(workflow, "align", resumed)
    assert main(["align", "--reward-model", "vader", "--out", "run", "--steps", "20", "--no-progress"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "resum" in ln]
    assert len(err) == 1 and "from step 5 of 20" in err[0] and "checkpoint-5" in err[0], err


def test_a_non_private_fit_says_nothing_of_a_noise_seed(work, capsys):
    with open(work / "pairs.jsonl", "w") as fh:
        for i in range(40):
            fh.write(json.dumps({"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"}) + "\n")
    argv = ["fit-reward", "--data", "pairs.jsonl", "--n-features", "64", "--out", "m.json"]
    assert main([*argv, "--method", "mle"]) == 0
    err = capsys.readouterr().err
    assert "--audit-record" in err and "seed" not in err.lower(), err
    assert main([*argv, "--method", "rr-iht", "--epsilon", "2", "--out", "m2.json"]) == 0
    assert "noise seed" in capsys.readouterr().err  # a private fit's note is unchanged
