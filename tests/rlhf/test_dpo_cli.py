"""``privalign dpo``: bad input (one line naming the option, exit 2, nothing written, no model loaded), the
output directory on a tiny local model, and the release boundary on neighbouring datasets."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("opacus")

from test_dpo import tiny_base  # noqa: E402

from _util import one_line_error  # noqa: E402
from privalign.cli import main  # noqa: E402


def _write_pairs(path: Path, n: int = 12, *, swap_first: bool = False) -> Path:
    rows = [
        {"prompt": f"review {k}: ", "chosen": f"great film {k}!", "rejected": f"dull film {k}."}
        for k in range(n)
    ]
    if swap_first:  # the neighbouring dataset: one comparison replaced (its preference reversed)
        rows[0] = {**rows[0], "chosen": rows[0]["rejected"], "rejected": rows[0]["chosen"]}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_pairs(tmp_path / "pairs.jsonl")
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    (tmp_path / "onesided.jsonl").write_text('{"chosen": "good", "rejected": ""}\n', encoding="utf-8")
    (tmp_path / "same.jsonl").write_text(
        '{"chosen": "x y", "rejected": "a b"}\n{"chosen": "same", "rejected": "same"}\n', encoding="utf-8"
    )

    def no_load(*a, **k):  # pragma: no cover - reached only if a bad input loads the model
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr("privalign.rlhf.train.load_base_model", no_load)
    return tmp_path


BASE = ["dpo", "--data", "pairs.jsonl", "--out", "o", "--no-progress"]


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--privacy", "label", "--epsilon", "-1"], ["--epsilon", "-1"]),
        (["--privacy", "label", "--epsilon", "nan"], ["--epsilon", "nan"]),
        (["--privacy", "label", "--epsilon", "inf"], ["--epsilon", "inf"]),
        (["--privacy", "label"], ["--epsilon", "None"]),
        (["--privacy", "sample", "--epsilon", "2", "--delta", "1.5"], ["--delta", "1.5"]),
        (["--privacy", "sample", "--epsilon", "2", "--delta", "0.2"], ["--delta", "1/n"]),
        (["--privacy", "label", "--epsilon", "2", "--delta", "1e-5"], ["--delta"]),
        (["--privacy", "none", "--epsilon", "2"], ["--epsilon"]),
        (["--privacy", "label", "--flip-rate", "0.5"], ["--flip-rate", "0.5"]),
        (["--privacy", "label", "--flip-rate", "0"], ["--flip-rate", "0"]),
        (["--privacy", "label", "--flip-rate", "0.1", "--epsilon", "1"], ["--flip-rate", "--epsilon"]),
        (["--privacy", "sample", "--flip-rate", "0.1"], ["--flip-rate", "label"]),
        (["--privacy", "label", "--epsilon", "2", "--batch-size", "13"], ["--batch-size", "13"]),
        (["--privacy", "label", "--epsilon", "2", "--batch-size", "0"], ["--batch-size", "0"]),
        (
            ["--privacy", "label", "--epsilon", "2", "--base-model", "llama-70b"],
            ["--base-model", "llama-70b"],
        ),
        (["--privacy", "label", "--epsilon", "2", "--beta", "0"], ["--beta"]),
    ],
)
def test_bad_options(work, capsys, extra, needles):
    one_line_error(BASE + extra, needles, capsys)
    assert not (work / "o").exists() and not (work / "o.partial").exists()


@pytest.mark.parametrize(
    "data, needles",
    [
        ("missing.jsonl", ["--data", "missing.jsonl"]),
        ("empty.jsonl", ["--data", "no preference pairs"]),
        ("onesided.jsonl", ["--data", "one-sided"]),
        ("same.jsonl", ["--data", "pair 2", "identical"]),
    ],
)
def test_bad_data(work, capsys, data, needles):
    argv = ["dpo", "--data", data, "--out", "o", "--privacy", "label", "--epsilon", "1", "--batch-size", "1"]
    one_line_error(argv, needles, capsys)
    assert not (work / "o").exists()


def test_out_holding_files_is_refused(work, capsys):
    (work / "o").mkdir()
    (work / "o" / "x").write_text("keep me")
    one_line_error(BASE + ["--privacy", "label", "--epsilon", "1"], ["--out"], capsys)
    assert (work / "o" / "x").read_text() == "keep me"


# ---------------------------------------------------------------------------------------------------------
# the output directory and the release boundary
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    model, tok, _ = tiny_base()
    d = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _walk_keys(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{prefix}{k}"
            yield from _walk_keys(v, f"{prefix}{k}.")
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk_keys(v, prefix)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize(
    "privacy, extra", [("label", ["--epsilon", "1"]), ("sample", ["--epsilon", "4", "--delta", "1e-3"])]
)
def test_dpo_cli_writes_a_policy_dir_and_a_release_on_neighbouring_data(
    tmp_path, tiny_dir, capsys, privacy, extra
):
    """Neighbouring datasets (one comparison reversed), different seeds: the two manifests differ only in
    their creation time; they hold no seed, no hash and no training loss; the policy loads as an HF model."""
    from transformers import AutoModelForCausalLM

    from privalign.release import ReleaseBoundaryError, check_dpo_manifest

    d = _write_pairs(tmp_path / "d.jsonl")
    dp = _write_pairs(tmp_path / "dp.jsonl", swap_first=True)
    mans = []
    for k, (data, out) in enumerate(((d, tmp_path / "o1"), (dp, tmp_path / "o2"))):
        argv = ["dpo", "--data", str(data), "--out", str(out), "--privacy", privacy, *extra]
        argv += ["--base-model", str(tiny_dir), "--batch-size", "4", "--lora-rank", "2", "--max-length", "24"]
        argv += ["--seed", str(1234 + k), "--no-progress", "--json"]
        assert main(argv) == 0, capsys.readouterr().err
        cap = capsys.readouterr()
        man = json.loads(cap.out)
        warned = [ln for ln in cap.err.splitlines() if ln.startswith("privalign dpo: warning:")]
        # sample-DP on this tiny run is noise-dominated: one line says so; label-DP has no such warning
        assert len(warned) == (1 if privacy == "sample" else 0), cap.err
        assert "Traceback" not in cap.err and "UtilityWarning" not in cap.err
        assert man["policy_dir"] == str((out / "policy").resolve())
        on_disk = json.loads((out / "manifest.json").read_text())
        assert on_disk["policy_dir"] == "policy" and on_disk["status"] == "complete"
        check_dpo_manifest(on_disk)
        keys = " ".join(_walk_keys(on_disk)).lower()
        for bad in ("seed", "sha256", "hash", "loss", "entropy"):
            assert bad not in keys, bad
        text = json.dumps(on_disk)
        assert "1234" not in text
        for f in (d, dp):
            for h in (hashlib.sha256, hashlib.sha1, hashlib.md5):
                assert h(f.read_bytes()).hexdigest() not in text
        m = AutoModelForCausalLM.from_pretrained(out / "policy")
        assert not any("lora" in n for n, _ in m.named_parameters())
        assert not (tmp_path / f"o{k + 1}.partial").exists()
        mans.append(on_disk)
    a, b = ({k: v for k, v in m.items() if k not in ("created_at", "data")} for m in mans)
    assert a == b
    assert mans[0]["data"]["n_pairs"] == mans[1]["data"]["n_pairs"] == 12
    assert mans[0]["privacy"]["privacy_unit"] == ("label" if privacy == "label" else "sample")
    for field in ("seed", "train_loss"):
        with pytest.raises(ReleaseBoundaryError, match=field):
            check_dpo_manifest({**mans[0], field: 1})
    with pytest.raises(ReleaseBoundaryError, match="config.seed"):
        check_dpo_manifest({**mans[0], "config": {**mans[0]["config"], "seed": 1}})


def test_dpo_policy_failure_leaves_no_output(tmp_path, monkeypatch):
    from privalign.rlhf import dpo

    def boom(*a, **k):
        raise RuntimeError("disk full")

    base = tiny_base()
    monkeypatch.setattr(base[0].__class__, "save_pretrained", boom, raising=False)
    cfg = dpo.DPOConfig(privacy="label", epsilon=1.0, batch_size=4, lora_rank=2, max_length=24)
    with pytest.raises(RuntimeError, match="disk full"):
        dpo.dpo_policy(
            _write_pairs(tmp_path / "p.jsonl"), tmp_path / "o", cfg, base=base, rng=np.random.default_rng(0)
        )
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()
