"""Issue 24, item 10: what pool manifests copy out of a private reward-model file.

A pool scored by a private reward model (``build-pool``/``rescore-pool --proxy-reward linear:PATH``) records
the scorer in its manifest. The scores are post-processing of the DP model and may stay; the model file's
extras (the noise seed, exact held-out accuracy, the tuning candidates' validation accuracies) must not be
copied. Neighbouring datasets: the model is fit on D and on D' (one label flipped) with the same seed; the
two manifests may differ only in fields computed from the DP output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from privalign.data.pools import write_pool
from privalign.estimation.features import HashedNgramFeatures
from privalign.estimation.iht import RRIHT
from privalign.estimation.persistence import save_model
from privalign.models.scorers import LinearRewardScorer
from privalign.pipeline.build_pool import manifest_path, public_manifest, write_manifest
from privalign.pipeline.rescore import rescore_pool
from privalign.release import public_metadata

# These tests read reward-model files as privalign wrote them before the release boundary (with the noise seed
# and exact accuracies), on purpose: loading one warns (PrivacyWarning, an error elsewhere in this suite).
pytestmark = pytest.mark.filterwarnings("ignore::privalign.errors.PrivacyWarning")

WORDS = ["good", "bad", "kind", "rude", "clear", "vague", "fine", "poor", "nice", "mean"]
SEED_ENTROPY = "271828182845904523536028747135266249775"  # what fit-reward records today (metadata)
VOLATILE = ("created_utc", "seconds_this_run", "git", "versions")


def _fit_reward_file(tmp_path, name: str, flip: bool):
    """A label-DP reward model as ``privalign fit-reward`` wrote it before the release boundary:
    coefficients (the DP output) plus metadata with the seed of the randomized response and exact held-out
    statistics."""
    rng = np.random.default_rng(0)
    fm = HashedNgramFeatures(n_features=32, ngram_range=(1, 1))
    a = [" ".join(rng.choice(WORDS, 4)) for _ in range(200)]
    b = [" ".join(rng.choice(WORDS, 4)) for _ in range(200)]
    X = (fm.transform(a) - fm.transform(b)).toarray()
    y = (rng.random(200) < 0.5).astype(int)
    if flip:  # D': one private label changed
        y[0] = 1 - y[0]
    est = RRIHT(epsilon=1.0, sparsity=4, n_iter=20, random_state=12345).fit(X, y)
    path = save_model(est, tmp_path / name, feature_config=fm.get_config())
    doc = json.loads(path.read_text())
    doc["metadata"] = {
        "method": "rr-iht",
        "estimator": "RRIHT",
        "privacy_unit": "label",
        "heldout_accuracy": float(est.score(X[:50], y[:50])),
        "n_train": 150,
        "n_test": 50,
        "n_features": 32,
        "nonzeros": int(np.count_nonzero(est.coef_)),
        "data": "prefs.jsonl",
        "seed_entropy": SEED_ENTROPY,
        "tuning": {
            "best_params": {"sparsity": 4},
            "candidates": [{"params": {"sparsity": 4}, "validation_accuracy": 0.61}],
            "n_fit": 120,
            "n_validation": 30,
            "selection": "exponential mechanism on validation accuracy",
            "privacy_budget": {"epsilon": 1.0, "delta": 0.0},
        },
    }
    path.write_text(json.dumps(doc))
    return path


def _pool(tmp_path):
    recs = [
        {
            "prompt": f"prompt {i}",
            "responses": [
                {"text": " ".join(WORDS[j : j + 3]), "proxy_reward": 0.0, "true_reward": 0.0}
                for j in range(4)
            ],
            "meta": {"prompt_index": i},
        }
        for i in range(2)
    ]
    path = tmp_path / "src.jsonl.gz"
    write_pool(path, recs)
    return path


def _leaves(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}/{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}/{i}")
    else:
        yield prefix, obj


def _assert_no_private_extras(text: str) -> None:
    for leak in ("seed_entropy", SEED_ENTROPY, "heldout_accuracy", "validation_accuracy", "random_state"):
        assert leak not in text, leak


def test_rescored_pool_manifest_on_neighbouring_data_differs_only_in_dp_outputs(tmp_path):
    src = _pool(tmp_path)
    mans = {}
    for name, flip in (("d", False), ("d1", True)):
        rm = _fit_reward_file(tmp_path, f"rm-{name}.json", flip)
        out = tmp_path / f"{name}.jsonl.gz"
        returned = rescore_pool(src, out, proxy_reward=f"linear:{rm}", progress=False)
        written = manifest_path(out).read_text()
        _assert_no_private_extras(written)
        _assert_no_private_extras(json.dumps(returned))
        mans[name] = {k: v for k, v in json.loads(written).items() if k not in VOLATILE}
    # public configuration and DP outputs survive
    meta = mans["d"]["scorers"]["proxy"]["metadata"]
    assert meta["privacy_unit"] == "label" and meta["tuning"]["best_params"] == {"sparsity": 4}
    assert mans["d"]["scorers"]["proxy"]["privacy_event"]["kind"] == "randomized_response"
    # D vs D': only the pool's name, the path of the model and values computed from the DP coefficients differ
    a, b = dict(_leaves(mans["d"])), dict(_leaves(mans["d1"]))
    assert a.keys() == b.keys()
    differ = {k for k in a if a[k] != b[k]}
    allowed = {"/pool", "/proxy_reward", "/scorers/proxy/name", "/scorers/proxy/metadata/nonzeros"}
    assert differ <= allowed, differ - allowed


def test_an_older_manifest_copied_by_rescore_is_filtered(tmp_path):
    """rescore-pool nests the source pool's manifest: one written before the fix (holding the reward
    model's whole metadata) is filtered on the way."""
    src = _pool(tmp_path)
    rm = _fit_reward_file(tmp_path, "rm.json", False)
    old = {"pool": src.name, "scorers": {"proxy": LinearRewardScorer.load(rm).describe(), "true": None}}
    old["scorers"]["proxy"]["metadata"] = json.loads(rm.read_text())["metadata"]  # as the old describe()
    manifest_path(src).write_text(json.dumps(old))
    man = rescore_pool(src, tmp_path / "o.jsonl", true_reward="vader", progress=False)
    _assert_no_private_extras(json.dumps(man))
    _assert_no_private_extras((tmp_path / "o.manifest.json").read_text())
    assert man["rescored_from"]["manifest"]["scorers"]["proxy"]["metadata"]["method"] == "rr-iht"


def test_describe_and_write_manifest_keep_non_private_reference_models_whole(tmp_path):
    """A model without a privacy event (the shipped gold/proxy references, fit on public data) claims no
    guarantee; its manifest description keeps its metadata (e.g. the gold model's held-out accuracy)."""
    sc = LinearRewardScorer(HashedNgramFeatures(n_features=8, ngram_range=(1, 1)), np.ones(8))
    sc.metadata = {"heldout_accuracy": 0.9, "random_state": 0}
    assert sc.describe()["metadata"] == sc.metadata
    sc.privacy_event = {"kind": "randomized_response", "epsilon": 1.0}
    assert sc.describe()["metadata"] == {}
    pool = tmp_path / "x.jsonl"
    write_manifest(pool, {"scorers": {"proxy": {**sc.describe(), "metadata": {"seed_entropy": 1}}}})
    _assert_no_private_extras(manifest_path(pool).read_text())
    assert public_manifest([{"scorer": "linear", "privacy_event": None, "metadata": {"a": 1}}])[0]["metadata"]


def test_public_metadata_is_an_allow_list():
    md = {"method": "rr-iht", "unknown_field": 1, "seed_entropy": 5, "tuning": {"candidates": [], "n_fit": 3}}
    assert public_metadata(md) == {"method": "rr-iht", "tuning": {"n_fit": 3}}
    assert public_metadata(None) == {}
