"""Issue 16, problem 1: one reward-model format and one featurizer from ``fit-reward`` to ``serve``.

* ``privalign serve --reward-model rm.json`` accepts what ``privalign fit-reward --out rm.json`` wrote
  (before: "not a valid linear model: 'n_features'").
* ``/v1/select`` ranks candidates by exactly the fitted estimator's ``predict_reward`` of the trainer's
  features.
* Older files load with a warning naming ``privalign upgrade-reward-model``; the retired service weights
  format is refused with a one-line error saying how to replace it.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from privalign.cli import main
from privalign.errors import DataFormatError
from privalign.estimation import IHT, HashedNgramFeatures, load_model, save_model
from privalign.models.scorers import FormatUpgradeWarning, LinearRewardScorer, read_reward_model

GOOD = ["helpful", "kind", "clear", "polite", "correct", "careful"]
BAD = ["rude", "wrong", "insult", "harmful", "lazy", "vague"]
FILL = ["the", "answer", "is", "a", "reply", "to", "your", "question", "here", "we", "go"]


def _pairs_file(path, n=240, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        for i in range(n):
            fill = " ".join(rng.choice(FILL, 6))
            good = " ".join(rng.choice(GOOD, 2))
            bad = " ".join(rng.choice(BAD, 2))
            fh.write(
                json.dumps(
                    {"prompt": f"question {i}", "chosen": f"{fill} {good}", "rejected": f"{fill} {bad}"}
                )
                + "\n"
            )
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("rm")
    data = _pairs_file(d / "pairs.jsonl")
    rm = d / "rm.json"
    rc = main(
        [
            "fit-reward",
            "--data",
            str(data),
            "--method",
            "iht",
            "--sparsity",
            "8",
            "--n-features",
            "512",
            "--seed",
            "0",
            "--out",
            str(rm),
            "--json",
        ]
    )
    assert rc == 0
    return rm


def test_fit_reward_writes_the_versioned_schema(fitted):
    doc = json.loads(fitted.read_text())
    assert doc["format"] == "privalign.reward_model" and doc["version"] == 2
    assert doc["feature_config"]["kind"] == "hashed_ngram" and doc["privacy_event"]["kind"]
    assert doc["intercept"] == 0.0 and doc["link"] == "identity" and doc["estimator"] == "IHT"


def test_serve_check_accepts_what_fit_reward_wrote(fitted, tmp_path, capsys):
    rc = main(["serve", "--check", "--reward-model", str(fitted), "--db", f"sqlite:///{tmp_path / 'svc.db'}"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    out = json.loads(cap.out)
    assert out["reward_model"] == "linear" and out["reward_model_path"] == str(fitted.resolve())
    assert (
        out["reward_model_privacy_event"]["kind"] == json.loads(fitted.read_text())["privacy_event"]["kind"]
    )


def test_scorer_equals_predict_reward_bit_for_bit(fitted):
    est, fcfg, _ = load_model(fitted)
    fm = HashedNgramFeatures(
        **{k: (tuple(v) if k == "ngram_range" else v) for k, v in fcfg.items() if k != "kind"}
    )
    texts = [
        "a helpful and kind reply",
        "a rude wrong insult",
        "the answer is here",
        "careful clear polite lazy",
    ]
    sc = LinearRewardScorer.load(fitted)
    assert np.array_equal(sc("any prompt", texts), est.predict_reward(fm.transform(texts)))
    from privalign.service.components import build_scorer
    from privalign.service.config import ComponentConfig

    served = build_scorer(ComponentConfig("linear", {"path": str(fitted)}))
    assert np.array_equal(np.asarray(served("p", texts)), est.predict_reward(fm.transform(texts)))


def test_prompt_using_feature_map_is_featurised_as_in_training(tmp_path):
    rng = np.random.default_rng(1)
    fm = HashedNgramFeatures(n_features=256, ngram_range=(1, 1), use_prompt=True)
    X = fm.transform_pairs(
        [f"q {i}" for i in range(40)], [" ".join(rng.choice(GOOD + BAD, 3)) for _ in range(40)]
    )
    y = rng.integers(0, 2, 40)
    est = IHT(sparsity=4, random_state=0).fit(X, y)
    path = save_model(est, tmp_path / "m.json", feature_config=fm.get_config())
    texts = ["kind clear", "rude vague"]
    expect = est.predict_reward(fm.transform_pairs(["why?", "why?"], texts))
    assert np.array_equal(LinearRewardScorer.load(path)("why?", texts), expect)


def test_select_endpoint_ranks_by_exactly_predict_reward(fitted, tmp_path):
    from fastapi.testclient import TestClient

    from privalign.service import db
    from privalign.service.app import create_app
    from privalign.service.config import config_from_dict
    from privalign.service.keys import create_key

    est, fcfg, _ = load_model(fitted)
    fm = HashedNgramFeatures(
        **{k: (tuple(v) if k == "ngram_range" else v) for k, v in fcfg.items() if k != "kind"}
    )
    cfg = config_from_dict(
        {
            "database": {"url": f"sqlite:///{tmp_path / 'svc.db'}"},
            "privacy": {
                "allowed_methods": ["bon", "privbon"],
                "allow_non_private": True,
                "reward_max": 100.0,
                "sensitivity": 100.0,
            },
            "reward_model": {"kind": "linear", "path": str(fitted)},
            "generator": {"kind": "none"},
        }
    )
    app = create_app(cfg)
    engine = db.make_engine(cfg.database.url)
    db.create_schema(engine)
    _, token = create_key(engine, budget_epsilon=1e6, accounting="pure")
    rng = np.random.default_rng(7)
    checked = 0
    with TestClient(app) as client:
        for _ in range(25):
            cands = [" ".join(rng.choice(GOOD + BAD + FILL, 4)) for _ in range(5)]
            r = est.predict_reward(fm.transform(cands))
            clipped = np.clip(r, 0.0, 100.0)
            if np.sum(clipped == clipped.max()) > 1:  # ties after clipping: BoN's choice is not determined
                continue
            resp = client.post(
                "/v1/select",
                json={"prompt": "say something", "candidates": cands, "privacy": {"method": "bon"}},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["index"] == int(np.argmax(r))
            checked += 1
    assert checked >= 10


def test_version_1_and_old_linear_files_load_with_an_upgrade_message(fitted, tmp_path, capsys):
    doc = json.loads(fitted.read_text())
    v1 = {k: v for k, v in doc.items() if k not in ("name", "intercept", "link")}
    v1["version"] = 1
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    with pytest.warns(FormatUpgradeWarning, match="privalign upgrade-reward-model"):
        sc = LinearRewardScorer.load(tmp_path / "v1.json")
    assert np.array_equal(sc.coef, LinearRewardScorer.load(fitted).coef)
    est, _, _ = load_model(tmp_path / "v1.json")  # the estimator API still reads version 1
    assert np.array_equal(est.coef_, load_model(fitted)[0].coef_)
    old = {
        "format": "privalign-linear-reward/1",
        "name": "old",
        "feature_config": doc["feature_config"],
        "coef": {
            "dtype": "<f4",
            "shape": [512],
            "b64": __import__("base64").b64encode(np.arange(512, dtype="<f4").tobytes()).decode(),
        },
        "intercept": 0.5,
        "link": "sigmoid",
        "metadata": {},
    }
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.warns(FormatUpgradeWarning):
        before = LinearRewardScorer.load(tmp_path / "old.json")
    assert (
        main(["upgrade-reward-model", str(tmp_path / "old.json"), "--out", str(tmp_path / "new.json")]) == 0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", FormatUpgradeWarning)
        after = LinearRewardScorer.load(tmp_path / "new.json")
    assert read_reward_model(tmp_path / "new.json")["version"] == 2
    texts = ["a helpful reply", "rude"]
    assert np.array_equal(before.score(texts), after.score(texts))
    assert after.link == "sigmoid" and after.intercept == 0.5


def test_retired_service_format_is_refused_with_the_remedy(tmp_path, capsys):
    p = tmp_path / "reward.json"
    p.write_text(json.dumps({"n_features": 64, "ngram_range": [1, 1], "bias": 0.0, "weights": {"3": 1.0}}))
    with pytest.raises(DataFormatError, match="fit-reward"):
        LinearRewardScorer.load(p)
    rc = main(["serve", "--check", "--reward-model", str(p), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("privalign serve: error: ") and "fit-reward" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_shipped_reward_files_are_in_the_current_format():
    from privalign.paths import repo_root
    from privalign.service.config import DEFAULT_REWARD_MODEL

    for p in [DEFAULT_REWARD_MODEL, *sorted((repo_root() / "pools").glob("*-logreg.json"))]:
        doc = json.loads(p.read_text())
        assert (doc["format"], doc["version"]) == ("privalign.reward_model", 2), p
