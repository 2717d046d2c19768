"""``privalign upgrade-reward-model`` refuses a file whose noise seed was ever written down (issue 36).

Until issue 36 the command turned the reward model shipped at commit a836a1f (``params.random_state``
3241444873, ``metadata.seed_entropy`` 0, in git history) into a "release": it removed the two fields,
stamped the release rule into ``metadata`` and kept the coefficients byte for byte, so the new file claimed
ε = 4 label-DP for a fit anyone with the repository replays. Now such a file is refused (exit 2, one line
naming what was found and the ``fit-reward`` command that refits it, nothing written), and so is a copy that
an earlier upgrade already stripped (its coefficients are known). A file that never held a seed still
upgrades.

The fixture ``tests/golden/reward-model-a836a1f-public-seed.json`` is that shipped file, byte for byte
(``git show a836a1f:src/privalign/models/reward_models/hh-rlhf-harmless-rr-iht.json``): a model fitted on
the public HH-RLHF data, holding no private data.
"""

from __future__ import annotations

import base64
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from tests._util import one_line_error

from privalign.cli import main

OLD = Path(__file__).resolve().parents[1] / "golden" / "reward-model-a836a1f-public-seed.json"
CMD = "upgrade-reward-model"


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _clean_doc() -> dict:
    """A current-format RR-IHT document that never held a seed (the shipped fields, new coefficients)."""
    import privalign.models

    shipped = Path(privalign.models.__file__).parent / "reward_models" / "hh-rlhf-harmless-rr-iht.json"
    doc = json.loads(shipped.read_text())
    coef = np.zeros(4096, dtype="<f8")
    coef[[3, 70, 900]] = [0.5, -0.25, 1.0]
    doc["coef"] = {"dtype": "<f8", "shape": [4096], "b64": base64.b64encode(coef.tobytes()).decode()}
    return doc


def test_old_shipped_model_is_refused_and_nothing_is_written(work, capsys):
    """The file of a836a1f: exit 2, one line naming the seed and the refit command. HEAD wrote new.json
    (exit 0) with the same coefficients and the release rule."""
    line = one_line_error(
        [CMD, str(OLD), "--out", "new.json"],
        [
            "refit: this file's noise seed is public",
            "params.random_state = 3241444873",
            "metadata.seed_entropy = 0",
            "privalign fit-reward --data hh-rlhf --method rr-iht --epsilon 4 --out NEW.json",
        ],
        capsys,
        cmd=CMD,
    )
    assert "nothing was written" in line
    assert list(work.iterdir()) == []


def test_a_stripped_copy_of_the_old_model_is_refused(work, capsys):
    """A copy rewritten by the old upgrade (seed fields gone, release rule stamped, coefficients unchanged)
    is still that fit: refused by its coefficients."""
    from privalign.release import RELEASE_RULE

    doc = json.loads(OLD.read_text())
    doc["params"]["random_state"] = None
    for k in ("seed_entropy", "heldout_accuracy"):
        doc["metadata"].pop(k)
    doc["metadata"]["release"] = RELEASE_RULE
    (work / "laundered.json").write_text(json.dumps(doc))
    one_line_error(
        [CMD, "laundered.json", "--out", "new.json"],
        ["noise seed is public", "coefficients = those of", "a836a1f", "3241444873"],
        capsys,
        cmd=CMD,
    )
    assert not (work / "new.json").exists()
    # loading it warns that its privacy event does not hold, and says to refit (not to upgrade)
    from privalign.errors import PrivacyWarning
    from privalign.models.scorers import LinearRewardScorer

    with pytest.warns(PrivacyWarning, match="refit from fresh noise: privalign fit-reward") as seen:
        LinearRewardScorer.load(work / "laundered.json")
    assert not any("upgrade-reward-model" in str(w.message) for w in seen)


@pytest.mark.parametrize(
    "where, key, value",
    [
        ("metadata", "seed_entropy", 123456789),
        ("metadata", "data_sha256", "9f" * 32),
        ("metadata", "training_data_sha256", "ab" * 32),
        ("params", "random_state", 7),
        ("top", "noise_seed", 7),
        ("tuning", "seed", 7),
    ],
)
def test_seed_entropy_or_data_hash_is_refused(work, capsys, where, key, value):
    doc = _clean_doc()
    doc["metadata"].pop("release")  # as written before the boundary
    target = {"metadata": doc["metadata"], "params": doc["params"], "top": doc}.get(where)
    if where == "tuning":
        doc["metadata"]["tuning"] = {"grid": {"sparsity": [16, 32]}, "seed": value}
        target = doc["metadata"]["tuning"]
    target[key] = value
    (work / "old.json").write_text(json.dumps(doc))
    argv = [CMD, "old.json", "--out", "new.json", "--json"]
    one_line_error(argv, ["noise seed is public", key], capsys, cmd=CMD, no_stdout=True)
    assert sorted(p.name for p in work.iterdir()) == ["old.json"]


def test_a_pre_boundary_fit_reward_file_with_its_seed_removed_by_hand_is_refused(work, capsys):
    """fit-reward before the boundary always wrote params.random_state and metadata.seed_entropy (with
    metadata.method and without metadata.release): a copy without them had them removed, not never held."""
    doc = _clean_doc()
    doc["metadata"].pop("release")
    doc["metadata"].pop("split")
    (work / "old.json").write_text(json.dumps(doc))
    one_line_error(
        [CMD, "old.json", "--out", "new.json"], ["fit-reward file written before"], capsys, cmd=CMD
    )
    assert not (work / "new.json").exists()


def test_a_file_that_never_held_a_seed_still_upgrades(work, capsys):
    """A version-1 file from the Python API (no seed, no fit-reward marker) and the current shipped model
    upgrade; the split's public seed (metadata.split.seed) is not a noise seed."""
    from privalign.models.scorers import LinearRewardScorer

    doc = _clean_doc()
    assert doc["metadata"]["split"]["seed"] == 0
    (work / "current.json").write_text(json.dumps(doc))
    assert main([CMD, "current.json", "--out", "a.json", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == []
    v1 = {k: v for k, v in doc.items() if k not in ("name", "intercept", "link")}
    v1["version"] = 1
    v1["metadata"] = {"n_train": 10, "estimator": "RRIHT"}
    (work / "v1.json").write_text(json.dumps(v1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the version-1 upgrade notice
        assert main([CMD, "v1.json", "--out", "b.json"]) == 0
    capsys.readouterr()
    for name in ("a.json", "b.json"):
        up = LinearRewardScorer.load(work / name)
        assert np.array_equal(up.coef, LinearRewardScorer.load(work / "current.json").coef)


def test_reference_model_claiming_no_privacy_keeps_its_metadata(work, capsys):
    """A 'privalign-linear-reward/1' reference model (public data, no privacy claim) upgrades with its
    metadata, seed included: nothing is stripped and no privacy is claimed, so nothing is made to look
    private."""
    old = {
        "format": "privalign-linear-reward/1",
        "name": "gold",
        "feature_config": {"kind": "hashed_ngram", "n_features": 8, "ngram_range": [1, 1]},
        "coef": {"dtype": "<f4", "shape": [8], "b64": base64.b64encode(np.ones(8, "<f4").tobytes()).decode()},
        "metadata": {"seed": 3},
    }
    (work / "gold.json").write_text(json.dumps(old))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([CMD, "gold.json", "--out", "new.json"]) == 0
    capsys.readouterr()
    new = json.loads((work / "new.json").read_text())
    assert new["privacy_event"] is None and new["metadata"] == {"seed": 3}


def test_help_says_what_is_refused(capsys):
    assert main([CMD, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "refused with exit status 2" in out and "refit it with" in out and "a836a1f" in out
