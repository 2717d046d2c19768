"""Feature maps by kind: the built-in kinds, the kinds a caller passes in (``EmbeddingFeatures`` of the models
layer, with an injected embedder), and their callers.

No test here loads MiniLM: the embedder is a fake (``tests/estimation/test_estimation_data_cli.py`` has the
real one, marked ``model``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import privalign.estimation.features as F
from privalign.errors import MissingDependencyError, PrivacyParameterError
from privalign.estimation.features import HashedNgramFeatures, PairFeatures, feature_map_from_config
from privalign.models.features import MODEL_FEATURE_MAPS, EmbeddingFeatures


class FakeEmbedder:
    """Deterministic 8-d "embeddings" from word hashes, some coordinates outside [−1, 1] (to see clipping)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), 8))
        for i, t in enumerate(texts):
            for w in t.split():
                out[i, sum(map(ord, w)) % 8] += 0.75
        return out


# ---------------------------------------------------------------------------------------------------------
# EmbeddingFeatures in the models layer
# ---------------------------------------------------------------------------------------------------------


def test_embedding_features_with_an_injected_embedder():
    emb = FakeEmbedder()
    f = EmbeddingFeatures(embedder=emb)
    X = f.transform(["good good movie", "bad"])
    assert X.dtype == np.float64 and X.shape == (2, 8)
    # "good good movie" gives a row of norm > 1: projected onto the unit ball (norm_bound = 2 then holds)
    assert np.linalg.norm(X, axis=1) == pytest.approx([1.0, 0.75]) and np.abs(X).max() <= 1.0
    assert f.feature_bound == 2.0 and f.norm_bound == 2.0 and f.load_embedder() is emb
    Xp = EmbeddingFeatures(use_prompt=True, embedder=emb).transform_pairs(["k"], ["a"])
    assert emb.calls[-1] == ["k\na"] and Xp.shape == (1, 8)
    assert f.get_config() == {"kind": "minilm", "backend": "onnx", "use_prompt": False, "batch_size": 64}
    assert isinstance(f, PairFeatures)
    with pytest.raises(PrivacyParameterError, match="single string"):
        f.transform("one text")
    with pytest.raises(PrivacyParameterError, match="'embedder'"):
        EmbeddingFeatures(embedder=object())


def test_embedding_features_missing_models_dependency_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "privalign.models.embeddings", None)  # import fails
    with pytest.raises(MissingDependencyError, match=r"privalign\[models\]"):
        EmbeddingFeatures().transform(["x"])
    cfg = {"kind": "minilm", "backend": "onnx", "use_prompt": False, "batch_size": 4}
    f = feature_map_from_config(cfg, kinds=MODEL_FEATURE_MAPS)
    with pytest.raises(MissingDependencyError, match=r"privalign\[models\]"):
        f.transform(["x"])


def test_models_package_exports_embedding_features():
    import privalign.models

    assert privalign.models.EmbeddingFeatures is EmbeddingFeatures


# ---------------------------------------------------------------------------------------------------------
# Lookup by kind
# ---------------------------------------------------------------------------------------------------------


def test_config_round_trip_for_every_kind():
    for fm in (
        HashedNgramFeatures(n_features=64, ngram_range=(1, 3)),
        F.LexiconFeatures(["sorry", "cannot"], name="harm"),
        EmbeddingFeatures(backend="torch", use_prompt=True, batch_size=8),
    ):
        again = feature_map_from_config(fm.get_config(), kinds=MODEL_FEATURE_MAPS)
        assert type(again) is type(fm) and again.get_config() == fm.get_config()
    assert set(F.BUILTIN_FEATURE_MAPS) == {"hashed_ngram", "lexicon"}
    assert MODEL_FEATURE_MAPS == {"minilm": EmbeddingFeatures}


def test_unknown_kind_names_the_parameter_the_known_kinds_and_the_value():
    with pytest.raises(PrivacyParameterError) as e:
        feature_map_from_config({"kind": "word2vec"}, kinds=MODEL_FEATURE_MAPS)
    msg = str(e.value)
    assert "'config[\"kind\"]'" in msg and "'word2vec'" in msg
    assert all(k in msg for k in ("hashed_ngram", "lexicon", "minilm"))
    with pytest.raises(PrivacyParameterError, match=r"'config\[\"kind\"\]'.*Got None"):
        feature_map_from_config({"n_features": 8})
    with pytest.raises(PrivacyParameterError, match=r"'config\[\"kind\"\]'.*Got \['minilm'\]"):
        feature_map_from_config({"kind": ["minilm"]})
    with pytest.raises(PrivacyParameterError, match="'config' parameter must be a dict"):
        feature_map_from_config([("kind", "minilm")])


def test_a_model_kind_is_unknown_unless_the_caller_passes_it():
    """The estimation layer knows no model-based map by itself: no plugin lookup, no hidden import."""
    with pytest.raises(PrivacyParameterError, match="MODEL_FEATURE_MAPS") as e:
        feature_map_from_config({"kind": "minilm", "backend": "onnx", "use_prompt": False, "batch_size": 4})
    assert "'minilm'" in str(e.value)

    class Toy(PairFeatures):
        kind = "toy"
        feature_bound = 1.0

        def __init__(self, dim: int = 3, use_prompt: bool = False) -> None:
            self.dim, self.use_prompt = dim, use_prompt

        def transform(self, texts):
            return np.ones((len(texts), self.dim))

    f = feature_map_from_config({"kind": "toy", "dim": 5, "use_prompt": False}, kinds={"toy": Toy})
    assert isinstance(f, Toy) and f.transform_pairs(["k"], ["a"]).shape == (1, 5)


def test_estimation_has_no_model_names():
    import privalign.estimation

    assert not hasattr(privalign.estimation, "EmbeddingFeatures")
    assert not hasattr(F, "EmbeddingFeatures")


# ---------------------------------------------------------------------------------------------------------
# Callers: the real-data loader (estimation) and fit-reward (cli)
# ---------------------------------------------------------------------------------------------------------


class FakeMiniLM(EmbeddingFeatures):
    """``EmbeddingFeatures`` with the fake embedder (what a test substitutes for kind ``minilm``)."""

    def __init__(self, backend: str = "onnx", use_prompt: bool = False, batch_size: int = 64) -> None:
        super().__init__(backend, use_prompt, batch_size, embedder=FakeEmbedder())


def _pairs_file(path: Path, n: int = 40) -> Path:
    rows = [
        {
            "prompt": f"prompt {i % (n // 2)}",
            "chosen": f"great wonderful answer {i}",
            "rejected": f"awful {i}",
        }
        for i in range(n)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_real_data_loader_takes_a_feature_map_or_ngram(tmp_path):
    from privalign.estimation.realdata import load_preference_data

    pairs = str(_pairs_file(tmp_path / "pairs.jsonl"))
    given = EmbeddingFeatures(embedder=FakeEmbedder())
    data, fmap = load_preference_data(pairs, features=given, random_state=0)
    assert fmap is given and data.X.shape == (40, 8)
    data, fmap = load_preference_data(pairs, features="ngram", n_features=64, random_state=0)
    assert type(fmap) is HashedNgramFeatures and data.X.shape == (40, 64)
    for bad in ("tfidf", "minilm"):  # a model-based map is built by the caller
        with pytest.raises(PrivacyParameterError, match="'features'"):
            load_preference_data(pairs, features=bad)


def test_cli_fit_reward_minilm_builds_the_map_from_the_models_layer(tmp_path, monkeypatch, capsys):
    import privalign.models.features
    from privalign.cli import main
    from privalign.estimation.persistence import load_model

    monkeypatch.setattr(privalign.models.features, "EmbeddingFeatures", FakeMiniLM)
    pairs, model = _pairs_file(tmp_path / "pairs.jsonl", 80), tmp_path / "m.json"
    argv = ["fit-reward", "--data", str(pairs), "--features", "minilm", "--method", "rr-iht"]
    argv += ["--epsilon", "2", "--sparsity", "4", "--seed", "3", "--out", str(model)]
    assert main(argv) == 0
    _, fcfg, _ = load_model(model)
    assert fcfg == {"kind": "minilm", "backend": "onnx", "use_prompt": False, "batch_size": 64}
