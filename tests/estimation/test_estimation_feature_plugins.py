"""Feature maps by kind (issue 18): built-in kinds, registration, the ``privalign.feature_maps`` entry points,
``EmbeddingFeatures`` in the models layer (with an injected embedder) and its deprecated old names.

No test here loads MiniLM: the embedder is a fake (``tests/estimation/test_estimation_data_cli.py`` has the
real one, marked ``model``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
import tomllib
import types
import urllib.parse
import warnings
from pathlib import Path

import numpy as np
import pytest

import privalign
import privalign.estimation.features as F
from privalign.errors import MissingDependencyError, PrivacyParameterError
from privalign.estimation.features import (
    FEATURE_MAP_GROUP,
    HashedNgramFeatures,
    PairFeatures,
    feature_map_class,
    feature_map_from_config,
    feature_map_kinds,
    register_feature_map,
)
from privalign.models.features import EmbeddingFeatures

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(privalign.__file__).resolve().parent


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


@pytest.fixture
def clean_registry(monkeypatch):
    """A registry without ``minilm`` and no installed entry points, restored afterwards."""
    monkeypatch.setattr(F, "_REGISTERED", {})
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points([]))


def _fake_entry_points(eps: list[importlib.metadata.EntryPoint]):
    def entry_points(**params):
        assert params == {"group": FEATURE_MAP_GROUP}
        return importlib.metadata.EntryPoints(eps)

    return entry_points


def _ep(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=FEATURE_MAP_GROUP)


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
    assert isinstance(f, PairFeatures) and isinstance(f, F._PairFeatures)  # the old private name
    with pytest.raises(PrivacyParameterError, match="single string"):
        f.transform("one text")
    with pytest.raises(PrivacyParameterError, match="'embedder'"):
        EmbeddingFeatures(embedder=object())


def test_embedding_features_missing_models_dependency_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "privalign.models.embeddings", None)  # import fails
    with pytest.raises(MissingDependencyError, match=r"privalign\[models\]"):
        EmbeddingFeatures().transform(["x"])
    f = feature_map_from_config({"kind": "minilm", "backend": "onnx", "use_prompt": False, "batch_size": 4})
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
        again = feature_map_from_config(fm.get_config())
        assert type(again) is type(fm) and again.get_config() == fm.get_config()
    assert feature_map_class("minilm") is EmbeddingFeatures  # importing models.features registered it
    assert {"hashed_ngram", "lexicon", "minilm"} <= set(feature_map_kinds())


def test_unknown_kind_names_the_parameter_the_known_kinds_and_the_value():
    with pytest.raises(PrivacyParameterError) as e:
        feature_map_from_config({"kind": "word2vec"})
    msg = str(e.value)
    assert "'config[\"kind\"]'" in msg and "'word2vec'" in msg
    assert all(k in msg for k in ("hashed_ngram", "lexicon", "minilm", FEATURE_MAP_GROUP))
    with pytest.raises(PrivacyParameterError, match=r"'config\[\"kind\"\]'.*Got None"):
        feature_map_from_config({"n_features": 8})
    with pytest.raises(PrivacyParameterError, match="'kind'.*Got \\['minilm'\\]"):
        feature_map_class(["minilm"])
    with pytest.raises(PrivacyParameterError, match="'config' parameter must be a dict"):
        feature_map_from_config([("kind", "minilm")])


def test_minilm_is_found_through_the_entry_point(clean_registry, monkeypatch):
    """What happens in a fresh process of an installed privalign: nothing registered, the entry point from
    pyproject.toml in the installed metadata."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    value = declared[FEATURE_MAP_GROUP]["minilm"]
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points([_ep("minilm", value)]))
    assert feature_map_kinds() == ["hashed_ngram", "lexicon", "minilm"]
    f = feature_map_from_config({"kind": "minilm", "backend": "torch", "use_prompt": True, "batch_size": 2})
    assert type(f) is EmbeddingFeatures and f.get_config()["backend"] == "torch"
    assert F._REGISTERED == {"minilm": EmbeddingFeatures}  # loaded once, then registered


def test_third_party_plugin_by_entry_point(clean_registry, monkeypatch):
    mod = types.ModuleType("toy_feature_plugin")

    class ToyFeatures(PairFeatures):
        kind = "toy"

        def __init__(self, dim: int = 3, use_prompt: bool = False) -> None:
            self.dim, self.use_prompt = dim, use_prompt

        feature_bound = 1.0

        def transform(self, texts):
            return np.ones((len(texts), self.dim))

        def get_config(self):
            return {"kind": self.kind, "dim": self.dim, "use_prompt": self.use_prompt}

    mod.ToyFeatures = ToyFeatures
    mod.NotAFeatureMap = dict
    monkeypatch.setitem(sys.modules, "toy_feature_plugin", mod)
    eps = [
        _ep("toy", "toy_feature_plugin:ToyFeatures"),
        _ep("wrong", "toy_feature_plugin:NotAFeatureMap"),
        _ep("renamed", "toy_feature_plugin:ToyFeatures"),  # the class's kind is "toy"
        _ep("absent", "no_such_module_for_privalign:Features"),
    ]
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points(eps))
    f = feature_map_from_config({"kind": "toy", "dim": 5, "use_prompt": False})
    assert isinstance(f, ToyFeatures) and f.transform_pairs(["k"], ["a"]).shape == (1, 5)
    with pytest.raises(PrivacyParameterError, match="must name a PairFeatures subclass"):
        feature_map_class("wrong")
    with pytest.raises(PrivacyParameterError, match="whose kind is 'renamed'"):
        feature_map_class("renamed")
    with pytest.raises(MissingDependencyError, match="no_such_module_for_privalign"):
        feature_map_class("absent")


def test_register_feature_map(clean_registry):
    class Local(PairFeatures):
        kind = "local"

    assert register_feature_map(Local) is Local and register_feature_map(Local) is Local  # idempotent
    assert feature_map_class("local") is Local

    class Clash(PairFeatures):
        kind = "local"

    class Builtin(PairFeatures):
        kind = "hashed_ngram"

    class NoKind(PairFeatures):
        pass

    for bad, match in ((Clash, "already taken"), (Builtin, "already taken"), (NoKind, "non-empty string")):
        with pytest.raises(PrivacyParameterError, match=match):
            register_feature_map(bad)
    with pytest.raises(PrivacyParameterError, match="PairFeatures subclass"):
        register_feature_map(dict)
    reloaded = type("Local", (PairFeatures,), {"kind": "local", "__qualname__": Local.__qualname__})
    assert register_feature_map(reloaded) is reloaded and feature_map_class("local") is reloaded


# ---------------------------------------------------------------------------------------------------------
# The deprecated names
# ---------------------------------------------------------------------------------------------------------


def test_old_names_warn_and_resolve_through_the_lookup():
    import privalign.estimation

    with pytest.warns(DeprecationWarning, match="moved to privalign.models.features.EmbeddingFeatures") as w:
        from privalign.estimation.features import EmbeddingFeatures as Old1
    assert Old1 is EmbeddingFeatures and w[0].filename == __file__  # the warning points at the caller
    with pytest.warns(DeprecationWarning, match="privalign.estimation.EmbeddingFeatures moved to") as w:
        Old2 = privalign.estimation.EmbeddingFeatures
    assert Old2 is EmbeddingFeatures and w[0].filename == __file__
    assert "EmbeddingFeatures" not in privalign.estimation.__all__  # `import *` does not warn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no attribute 'Nope'"):
            F.Nope  # noqa: B018


def test_old_name_without_a_provider_is_an_attribute_error(clean_registry):
    with pytest.warns(DeprecationWarning), pytest.raises(AttributeError, match="cannot resolve"):
        F.EmbeddingFeatures  # noqa: B018
    with pytest.warns(DeprecationWarning):
        assert not hasattr(F, "EmbeddingFeatures")


def test_no_module_of_privalign_uses_the_old_names():
    """Nothing in the package emits the DeprecationWarning: no import of EmbeddingFeatures from estimation."""
    offenders = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("privalign.estimation")
                and any(a.name == "EmbeddingFeatures" for a in node.names)
            ) or (isinstance(node, ast.Attribute) and node.attr == "EmbeddingFeatures"):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


# ---------------------------------------------------------------------------------------------------------
# Real installed metadata
# ---------------------------------------------------------------------------------------------------------


def _installed_metadata_is_this_tree() -> tuple[bool, str]:
    """Whether ``importlib.metadata`` describes the privalign being imported: an editable install of this
    source tree, or a regular install of the files imported. A source tree run through ``PYTHONPATH`` with
    another tree installed sees that tree's (possibly older) entry points."""
    try:
        dist = importlib.metadata.distribution("privalign")
    except importlib.metadata.PackageNotFoundError:
        return False, "privalign is not installed"
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):
        root = Path(urllib.parse.urlparse(direct["url"]).path).resolve()
        return SRC.is_relative_to(root), f"the installed metadata is the editable install of {root}"
    installed = Path(str(dist.locate_file("privalign/__init__.py"))).resolve().parent
    return installed == SRC, f"the installed metadata belongs to {installed}"


def test_installed_entry_points_match_pyproject_and_load_in_a_fresh_process():
    ours, why = _installed_metadata_is_this_tree()
    if not ours:
        pytest.skip(f"{why}, not {SRC} (reinstall: pip install -e .)")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=FEATURE_MAP_GROUP)}
    assert installed == declared[FEATURE_MAP_GROUP]
    code = (
        "import sys, warnings; warnings.simplefilter('error');"
        "from privalign.estimation.features import feature_map_from_config as f;"
        "assert 'privalign.models' not in sys.modules;"
        "m = f({'kind': 'minilm', 'backend': 'onnx', 'use_prompt': False, 'batch_size': 64});"
        "print(type(m).__module__, type(m).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["privalign.models.features", "EmbeddingFeatures"]


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


def test_real_data_loader_takes_a_feature_map_or_the_minilm_kind(tmp_path, monkeypatch):
    from privalign.estimation.realdata import load_preference_data

    pairs = str(_pairs_file(tmp_path / "pairs.jsonl"))
    given = EmbeddingFeatures(embedder=FakeEmbedder())
    data, fmap = load_preference_data(pairs, features=given, random_state=0)
    assert fmap is given and data.X.shape == (40, 8)
    monkeypatch.setitem(F._REGISTERED, "minilm", FakeMiniLM)  # what the "minilm" kind resolves to
    data, fmap = load_preference_data(pairs, features="minilm", random_state=0)
    assert type(fmap) is FakeMiniLM and data.X.shape == (40, 8)
    with pytest.raises(PrivacyParameterError, match="'features'"):
        load_preference_data(pairs, features="tfidf")


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
