"""Bad input is refused before any work starts, with a message naming what is wrong; configs are
annotated; interrupted runs are resumed or clearly marked incomplete."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

from privalign.cli import main
from privalign.experiments import runner
from privalign.experiments.config import SOURCE_TAGS, ConfigError, load_config, packaged_config_path
from privalign.experiments.registry import EXPERIMENTS
from privalign.experiments.runner import read_results, run_experiment

CHEAP = {"n_prompts": 30, "pool_size": 64, "N": 64, "replicates": 4, "epsilons": [1.0, 8.0, 64.0]}


def _cheap_config(path: Path, **extra) -> Path:
    with packaged_config_path("p1_epsilon_star_quick").open("rb") as fh:
        cfg = tomllib.load(fh)
    cfg.update(CHEAP)
    cfg.update(extra)
    lines = []
    for k, v in cfg.items():
        lines.append(f"{k} = {json.dumps(v)}\n")
    path.write_text("".join(lines), encoding="utf-8")
    return path


def _packaged_configs():
    by_name = {e.config_name: e for e in EXPERIMENTS.values()}
    out = []
    for path in sorted(packaged_config_path("x").parent.glob("*.toml")):
        owner = max((c for c in by_name if path.stem == c or path.stem.startswith(c + "_")), key=len)
        out.append((path, by_name[owner]))
    return out


def test_every_experiment_ships_a_full_and_a_quick_config():
    for exp in EXPERIMENTS.values():
        assert packaged_config_path(exp.config_name).is_file()
        assert packaged_config_path(exp.config_name + "_quick").is_file()


@pytest.mark.parametrize("path,exp", _packaged_configs(), ids=lambda v: getattr(v, "name", None))
def test_packaged_configs_validate_and_every_key_names_its_source(path, exp):
    if True:
        load_config(path, exp.schema)  # raises on unknown keys / wrong types
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            assert (
                "#" in line
                and any(tag in line.split("#", 1)[1] for tag in SOURCE_TAGS)
                or "[public code]" in line
            ), f"{path.name}: key line without a source tag: {line!r}"


def test_unknown_experiment(tmp_path, capsys):
    rc = main(["reproduce", "p9-nonsense", "--quick", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Unknown experiment 'p9-nonsense'" in err and "p1-scaling" in err
    assert not (tmp_path / "o").exists()


def test_unknown_config_key_names_key_and_file(tmp_path, capsys):
    cfg = _cheap_config(tmp_path / "bad.toml", replicats=3)
    rc = main(["reproduce", "p1-epsilon-star", "--config", str(cfg), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "'replicats'" in err and str(cfg) in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "key,value,typename",
    [
        ("replicates", "ten", "int"),
        ("epsilons", 3.0, "list[float]"),
        ("transform", 1, "str"),
        ("seed", 1.5, "int"),
    ],
)
def test_wrong_type_names_key_and_file(tmp_path, key, value, typename):
    cfg = _cheap_config(tmp_path / "bad.toml", **{key: value})
    with pytest.raises(ConfigError) as exc:
        run_experiment("p1-epsilon-star", config_path=cfg, out=tmp_path / "o")
    msg = str(exc.value)
    assert f"'{key}'" in msg and str(cfg) in msg and typename in msg
    assert not (tmp_path / "o").exists()


def test_choice_violation_names_key(tmp_path):
    cfg = _cheap_config(tmp_path / "bad.toml", transform="log")
    with pytest.raises(ConfigError, match=r"'transform' must be one of"):
        run_experiment("p1-epsilon-star", config_path=cfg, out=tmp_path / "o")


def test_pool_without_true_rewards_is_refused_before_work(tmp_path, capsys):
    from privalign.data.pools import write_pool

    pool = tmp_path / "pool.jsonl"
    write_pool(
        pool,
        [
            {
                "prompt": f"q{i}",
                "responses": [{"text": f"a{j}", "proxy_reward": float(j) / 8} for j in range(8)],
            }
            for i in range(3)
        ],
    )
    with packaged_config_path("p1_scaling_quick").open("rb") as fh:
        cfg = tomllib.load(fh)
    cfg.update({"pool": str(pool), "n_max_log2": 1})
    path = tmp_path / "c.toml"
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in cfg.items()), encoding="utf-8")
    rc = main(["reproduce", "p1-scaling", "--config", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "without a true reward" in err and str(pool) in err
    assert not (tmp_path / "o").exists()


def test_output_dir_with_a_different_run_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    assert (
        main(
            [
                "reproduce",
                "p1-epsilon-star",
                "--config",
                str(_cheap_config(tmp_path / "a.toml")),
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    other = _cheap_config(tmp_path / "b.toml", seed=7)
    rc = main(["reproduce", "p1-epsilon-star", "--config", str(other), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "already holds a different run" in err
    assert "(keys that differ: seed)" in err  # the user sees what changed
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing touched
    # a different experiment into the same directory
    rc = main(["reproduce", "p1-budget", "--quick", "--out", str(out), "--no-progress"])
    assert rc == 2 and "different run" in capsys.readouterr().err


def test_non_run_directory_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc = main(
        [
            "reproduce",
            "p1-epsilon-star",
            "--config",
            str(_cheap_config(tmp_path / "a.toml")),
            "--out",
            str(out),
        ]
    )
    assert rc == 2 and "holds no privalign run" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_interrupted_run_is_marked_incomplete_and_resumes_identically(tmp_path, monkeypatch):
    cfg = _cheap_config(tmp_path / "a.toml")
    fresh = tmp_path / "fresh"
    run_experiment("p1-epsilon-star", config_path=cfg, out=fresh, progress=False)

    exp = EXPERIMENTS["p1-epsilon-star"]
    calls = {"n": 0}
    real = exp.run_cell

    def flaky(cell, c, ctx, ss):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated interruption")
        return real(cell, c, ctx, ss)

    broken = runner.Experiment(**{**exp.__dict__, "run_cell": flaky})
    monkeypatch.setitem(EXPERIMENTS, "p1-epsilon-star", broken)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run_experiment("p1-epsilon-star", config_path=cfg, out=out, progress=False)
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "incomplete" and "KeyboardInterrupt" in man["error"]
    assert len({r["cell"] for r in read_results(out)}) == 2
    # a torn last line (crash mid-write) is dropped on resume
    with (out / "results.jsonl").open("a") as fh:
        fh.write('{"cell": "eps=64", "regret"')
    monkeypatch.setitem(EXPERIMENTS, "p1-epsilon-star", exp)
    run_experiment("p1-epsilon-star", config_path=cfg, out=out, progress=False)
    man = json.loads((out / "manifest.json").read_text())
    assert man["status"] == "complete" and man.get("resumed_at")
    key = lambda r: (r["cell"], r.get("variant"))
    a = sorted(read_results(fresh), key=key)
    b = sorted(read_results(out), key=key)
    assert a == b  # same seeds per cell: the resumed run equals the uninterrupted one


def test_same_config_rerun_is_a_no_op(tmp_path):
    cfg = _cheap_config(tmp_path / "a.toml")
    out = tmp_path / "o"
    run_experiment("p1-epsilon-star", config_path=cfg, out=out, progress=False)
    before = (out / "results.jsonl").read_bytes()
    run_experiment("p1-epsilon-star", config_path=cfg, out=out, progress=False)
    assert (out / "results.jsonl").read_bytes() == before


def test_claim_verdict_reads_the_results_file(tmp_path):
    """P1-7 holds on the run; tampering with results.jsonl flips the verdict in a fresh report."""
    from privalign.experiments.report import write_report

    cfg = _cheap_config(tmp_path / "a.toml")
    out = tmp_path / "run"
    run_experiment("p1-epsilon-star", config_path=cfg, out=out, progress=False)
    write_report([out], tmp_path / "r1")
    v1 = {c["id"]: c for c in json.loads((tmp_path / "r1" / "claims.json").read_text())}
    assert v1["P1-7"]["verdict"] == "holds", v1["P1-7"]
    tampered = tmp_path / "tampered"
    shutil.copytree(out, tampered)
    lines = []
    for line in (tampered / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("variant") == "sigma_reg" and r.get("epsilon") == 64.0:
            r["regret"] = 5.0  # far above the best regret over σ, on every prompt
            r["regret_pp"] = [5.0 + 0.01 * k for k in range(len(r["regret_pp"]))]
        lines.append(json.dumps(r))
    (tampered / "results.jsonl").write_text("\n".join(lines) + "\n")
    write_report([tampered], tmp_path / "r2")
    v2 = {c["id"]: c for c in json.loads((tmp_path / "r2" / "claims.json").read_text())}
    assert v2["P1-7"]["verdict"] == "does not hold"
    assert re.search(r"largest excess \+4\.\d+ ± 0\.\d+ \(ε=64\)", v2["P1-7"]["measured"]), v2["P1-7"][
        "measured"
    ]


def test_reproduce_list(capsys):
    assert main(["reproduce", "--list", "--json"]) == 0
    names = {r["name"] for r in json.loads(capsys.readouterr().out)}
    assert names == set(EXPERIMENTS)


def test_seeds_are_children_of_the_root_seed():
    a = runner.cell_seed(42, 3)
    b = np.random.SeedSequence(42).spawn(4)[3]
    assert np.array_equal(a.generate_state(4), b.generate_state(4))


def test_reproduce_set_values_are_toml_or_bare_strings():
    import pytest

    from privalign.cli.reproduce import parse_overrides

    assert parse_overrides(
        ["records_only=true", "steps=50", 'policies=["IHT", "RRIHT@8"]', "gold=a/b.json"]
    ) == {
        "records_only": True,
        "steps": 50,
        "policies": ["IHT", "RRIHT@8"],
        "gold": "a/b.json",
    }
    assert parse_overrides([]) == {}
    for bad in (["seed"], ["=3"], ["seed=1", "seed=2"]):
        with pytest.raises(ValueError):
            parse_overrides(bad)
