"""The estimator registry (estimation/registry.py): each class declares its name, aliases, privacy kind and
experiment parameters; the declared privacy kind is what the fitted event protects."""

from __future__ import annotations

import numpy as np
import pytest

from privalign.accounting.events import NonPrivateEvent
from privalign.errors import PrivacyParameterError
from privalign.estimation import registry
from privalign.estimation.base import EstimatorParam, RewardEstimator
from privalign.estimation.synthetic import make_btl


def _leaf_units(event) -> set[str]:
    """The units of ``event`` and every event inside it (composed, sampled, parallel)."""
    out = {event.unit}
    for attr in ("event", "events"):
        inner = getattr(event, attr, None)
        for e in inner if isinstance(inner, tuple | list) else ([inner] if inner is not None else []):
            out |= _leaf_units(e)
    return out


@pytest.mark.parametrize("name", registry.names())
def test_declared_privacy_kind_is_what_the_event_protects(name):
    prob = make_btl(400, 20, 3, random_state=np.random.default_rng(0))
    est = registry.make_estimator(
        name, epsilon=2.0, delta=1e-5, sparsity=3, feature_bound=1.0, random_state=np.random.default_rng(1)
    )
    est.fit(prob.X, prob.y)
    ev = est.privacy_event_
    kind = registry.privacy_kind(name)
    if kind == "none":
        assert isinstance(ev, NonPrivateEvent)
    else:
        assert not isinstance(ev, NonPrivateEvent)
        assert _leaf_units(ev) == {kind}, (name, ev)


def test_both_spellings_name_one_class_and_kinds_partition_the_names():
    for name in registry.names():
        cls = registry.estimator_class(name)
        assert cls.name == name == cls.__name__
        for alias in cls.aliases:
            assert registry.estimator_class(alias) is cls
            assert registry.canonical(alias) == name
            assert registry.privacy_kind(alias) == registry.privacy_kind(name)
    kinds = [registry.names(kind=k) for k in registry.KINDS]
    assert sorted(sum(kinds, ())) == sorted(registry.names())
    # the model-file class (its 'privacy' parameter picks the kind) is resolved but is not a method
    assert registry.estimator_class("DPTransformerRM").__name__ == "DPTransformerRM"
    assert "DPTransformerRM" not in registry.spellings()


def test_unknown_name_is_refused_naming_the_spellings():
    with pytest.raises(PrivacyParameterError, match=r"The 'method' parameter must be one of .*'dp-iht'"):
        registry.make_estimator("dpiht")
    with pytest.raises(PrivacyParameterError, match="'kind' parameter"):
        registry.names(kind="user")


def test_make_estimator_ignores_what_the_class_does_not_take():
    est = registry.make_estimator("mle", epsilon=3.0, sparsity=4, feature_bound=2.0)
    assert type(est).__name__ == "MLE" and est.feature_bound == 2.0


def test_experiment_estimator_reads_its_declared_keys():
    cfg = {p.key: p.default for p in registry.experiment_params().values()}
    cfg["alpha"] = 0.0  # 0: the constructor's own default
    est = registry.experiment_estimator("DPSGDLinear", cfg, n_train=100, epsilon=1.0, delta=1e-6, clip=True)
    assert (est.batch_size, est.epochs, est.learning_rate, est.clip) == (100, 5.0, 1.0, True)
    assert registry.experiment_estimator("DenseRR", cfg, epsilon=1.0).alpha is None


def test_register_refuses_a_taken_spelling_a_bad_kind_and_a_disagreeing_key():
    class Taken(RewardEstimator):
        name = "Taken"
        aliases = ("rr",)
        privacy_kind = "label"

    class NoKind(RewardEstimator):
        name = "NoKind"
        privacy_kind = "user"

    class BadKey(RewardEstimator):
        name = "BadKey"
        privacy_kind = "none"
        params = (EstimatorParam("step_size", "step_size", "float", 1.0, "other"),)

    for cls, match in ((Taken, "'rr'"), (NoKind, "privacy_kind"), (BadKey, "disagrees")):
        with pytest.raises(PrivacyParameterError, match=match):
            registry.register(cls)
    assert "BadKey" not in registry.names()


def test_is_estimator_and_kind_of_ask_the_registry():
    # any spelling of the same class matches; a record's reference row (not an estimator) matches nothing
    assert registry.is_estimator("dp-iht", "SampleDPIHT") and registry.is_estimator("SampleDPIHT", "dp-iht")
    assert not registry.is_estimator("RRIHT", "SampleDPIHT")
    assert not registry.is_estimator("Oracle (judge)", "IHT") and not registry.is_estimator(None, "IHT")
    assert registry.kind_of("rr") == "label" and registry.kind_of("MLE") == "none"
    assert registry.kind_of("DPSGDLinear") == "sample"
    assert registry.kind_of("Pool proxy (VADER)") is None and registry.kind_of(3) is None
