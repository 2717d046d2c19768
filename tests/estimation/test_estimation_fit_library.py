"""``privalign.estimation.fit``: a Python user fits, saves and audits a reward model as ``fit-reward`` does.

The library call and the command, given the same arguments and seeds, write the same model file and the same
audit record (but for the command's arguments), and print the same result.
"""

from __future__ import annotations

import json
import stat

import pytest

from privalign.estimation import load_model
from privalign.estimation.fit import fit_reward_model, fit_transformer_reward_model
from privalign.release import REWARD_MODEL_METADATA


def _pairs_file(path, n: int = 80):
    rows = [
        {
            "prompt": f"prompt {i % (n // 2)}",
            "chosen": f"great kind answer {i}",
            "rejected": f"rude bad answer {i}",
        }
        for i in range(n)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _cli(argv, capsys) -> dict:
    from privalign.cli import main

    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("method", "tune", "options", "kwargs"),
    [
        ("rr-iht", False, ["--epsilon", "2", "--sparsity", "4"], {"epsilon": 2.0, "sparsity": 4}),
        ("dp-iht", False, ["--epsilon", "3", "--delta", "1e-4"], {"epsilon": 3.0, "delta": 1e-4}),
        ("mle", False, [], {}),
        ("rr", True, ["--epsilon", "2"], {"epsilon": 2.0}),
    ],
    ids=["rr-iht", "dp-iht", "mle", "rr-tuned"],
)
def test_fit_reward_model_writes_what_the_cli_writes(tmp_path, capsys, method, tune, options, kwargs):
    data = _pairs_file(tmp_path / "pairs.jsonl")
    cli_model, cli_audit = tmp_path / "cli.json", tmp_path / "cli.PRIVATE-audit.json"
    argv = ["fit-reward", "--data", str(data), "--method", method, "--n-features", "256", *options]
    argv += ["--seed", "7", "--split-seed", "3", "--out", str(cli_model), "--audit-record", str(cli_audit)]
    printed = _cli(argv + (["--tune"] if tune else []), capsys)

    lines: list[str] = []
    fit = fit_reward_model(
        str(data),
        method=method,
        n_features=256,
        tune=tune,
        seed=7,
        split_seed=3,
        progress=lines.append,
        **kwargs,
    )
    lib_model = fit.save(tmp_path / "lib.json")
    lib_audit = fit.write_audit_record(tmp_path / "lib.PRIVATE-audit.json", release=lib_model)

    assert json.loads(lib_model.read_text()) == json.loads(cli_model.read_text())
    assert {k: v for k, v in printed.items() if k not in ("model", "audit_record")} == fit.summary
    assert printed["operator_only"]["heldout_accuracy"] == fit.heldout_accuracy
    assert len(lines) == 1 and lines[0].startswith("tuning " if tune else "fitting ")
    # the release holds only public metadata: no seed, hash or exact accuracy
    _, _, meta = load_model(lib_model)
    assert set(meta) <= set(REWARD_MODEL_METADATA) and "heldout_accuracy" not in json.dumps(meta)
    cli_rec, lib_rec = json.loads(cli_audit.read_text()), json.loads(lib_audit.read_text())
    assert cli_rec.pop("arguments")["method"] == method and lib_rec.pop("arguments") == {}
    assert (cli_rec.pop("release"), lib_rec.pop("release")) == (str(cli_model), str(lib_model))
    assert lib_rec == cli_rec
    assert lib_rec["noise_seed_entropy"] == "7" and len(lib_rec["data_sha256"]) == 64
    assert (lib_rec["tuning"] is not None) == tune
    assert stat.S_IMODE(lib_audit.stat().st_mode) == 0o600


def test_fit_reward_model_unseeded_keeps_its_seed_for_the_audit_record_only(tmp_path):
    data = _pairs_file(tmp_path / "pairs.jsonl")
    a = fit_reward_model(str(data), method="rr-iht", epsilon=1.0, sparsity=4, n_features=256)
    b = fit_reward_model(str(data), method="rr-iht", epsilon=1.0, sparsity=4, n_features=256)
    assert a.noise_seed != b.noise_seed  # fresh OS entropy each time
    model = a.save(tmp_path / "m.json")
    assert a.noise_seed not in model.read_text()
    rec = json.loads(a.write_audit_record(tmp_path / "m.audit.json", release=model).read_text())
    assert rec["noise_seed_entropy"] == a.noise_seed


def test_fit_transformer_reward_model_writes_what_the_cli_writes(tmp_path, capsys):
    data = _pairs_file(tmp_path / "pairs.jsonl", 40)
    cli_model = tmp_path / "cli.json"
    argv = ["fit-reward", "--data", str(data), "--model", "tiny-random", "--method", "rr", "--epsilon", "2"]
    argv += ["--batch-size", "8", "--epochs", "1", "--seed", "5", "--out", str(cli_model)]
    printed = _cli(argv, capsys)

    fit = fit_transformer_reward_model(
        str(data), backbone="tiny-random", method="rr", epsilon=2.0, batch_size=8, epochs=1, seed=5
    )
    lib_model = fit.save(tmp_path / "lib.json")
    assert json.loads(lib_model.read_text()) == json.loads(cli_model.read_text())
    assert {k: v for k, v in printed.items() if k != "model"} == fit.summary
    assert "tuning" not in json.loads(fit.write_audit_record(tmp_path / "a.json").read_text())
