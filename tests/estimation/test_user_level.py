"""User-level privacy for the label-DP reward models: contribution bounding, the per-user mechanism, the
fit, the release, and the audit of the whole 'bound, then randomize' step on worst-case neighbouring users.

The mechanism's own audit (a user's K labels all 0 vs all 1, negative control: ε per label instead of ε/K)
is in tests/audit/test_audit_privacy.py; here the pipeline is audited with its own negative control (the
contribution bound skipped), because a user-level guarantee is only as good as the bound it rests on.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from _util import one_line_error
from privalign.accounting.accountant import pure_cost
from privalign.accounting.events import event_from_dict
from privalign.audit.audit import audit_threshold
from privalign.cli import main
from privalign.estimation.labels import privatize_labels
from privalign.estimation.users import bound_contributions, user_level_label_fit
from privalign.mechanisms import UserRandomizedResponse

ALPHA = 1e-4


# ---------------------------------------------------------------------------------------------------------
# contribution bounding
# ---------------------------------------------------------------------------------------------------------


def _kept_by_user(users, contents, k):
    kept = bound_contributions(users, k)
    out: dict = {}
    for i in kept:
        out.setdefault(users[i], []).append(contents[i])
    return out


@pytest.mark.parametrize(
    "users,k,expected",
    [
        (["a", "b", "a", "a", "b"], 2, [0, 1, 2, 4]),
        (["a"] * 5, 1, [0]),  # one user, all tied: only the first
        (["a"] * 5, 5, [0, 1, 2, 3, 4]),  # K at the boundary: everything
        (["a"] * 5, 6, [0, 1, 2, 3, 4]),
        ([3, 3, 1, 1, 3], 1, [0, 2]),  # grid-valued (integer) ids
        (["x"], 1, [0]),
    ],
)
def test_bound_contributions_keeps_the_first_k_of_each_user(users, k, expected):
    assert bound_contributions(users, k).tolist() == expected


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_bound_contributions_refuses_a_bad_k(k):
    from privalign.errors import PrivacyParameterError

    with pytest.raises((PrivacyParameterError, TypeError, ValueError), match="max_per_user"):
        bound_contributions(["a"], k)


def test_another_users_data_never_changes_what_a_user_keeps(rng):
    """Replace, add or remove every pair of one user (the user-level neighbouring relation): every other
    user's kept pairs are the same pairs in the same order. Ties (one user with many pairs), a K at the
    boundary and interleaved positions included."""
    for trial in range(200):
        n = int(rng.integers(1, 60))
        users = [f"u{int(u)}" for u in rng.integers(0, 6, n)]
        contents = [f"pair{trial}-{i}" for i in range(n)]
        k = int(rng.integers(1, 8))
        victim = users[int(rng.integers(0, n))]
        # the neighbour: the victim's pairs removed, and a new set of them inserted at random positions
        rest = [(u, c) for u, c in zip(users, contents) if u != victim]
        m = int(rng.integers(0, 12))
        for j in range(m):
            rest.insert(int(rng.integers(0, len(rest) + 1)), (victim, f"new-{j}"))
        users2, contents2 = [u for u, _ in rest], [c for _, c in rest]
        a = _kept_by_user(users, contents, k)
        b = _kept_by_user(users2, contents2, k) if users2 else {}
        for u in set(a) | set(b):
            if u != victim:
                assert a.get(u) == b.get(u), (trial, u)
        assert all(len(v) <= k for v in b.values())


# ---------------------------------------------------------------------------------------------------------
# the mechanism and its accounting
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps,k", [(1.0, 1), (2.0, 4), (8.0, 100), (0.5, 3)])
def test_user_rr_costs_epsilon_per_user_and_states_k(eps, k):
    urr = UserRandomizedResponse(eps, max_contributions=k)
    ev = urr.event
    assert ev.unit == "user" and ev.count == k and ev.event.epsilon == pytest.approx(eps / k)
    assert float(pure_cost(ev)) == pytest.approx(eps)
    assert event_from_dict(ev.to_dict()) == ev
    assert urr.flip_probability >= 1 / (1 + math.exp(eps / k))


def test_user_rr_refuses_bad_parameters():
    from privalign.errors import PrivacyParameterError

    for kw in ({"epsilon": 0.0, "max_contributions": 2}, {"epsilon": 1.0, "max_contributions": 0}):
        with pytest.raises(PrivacyParameterError):
            UserRandomizedResponse(kw["epsilon"], max_contributions=kw["max_contributions"])


def test_user_level_label_fit_randomizes_each_label_at_epsilon_over_k(rng):
    from privalign.estimation.baselines import DenseRR

    X = rng.normal(size=(200, 3))
    y = (X[:, 0] > 0).astype(float)
    est = user_level_label_fit(DenseRR(epsilon=1.0, random_state=rng), X, y, epsilon=3.0, max_per_user=6)
    assert est.flip_probability_ == pytest.approx(1 / (1 + math.exp(0.5)), rel=1e-12)
    assert est.privacy_event_.unit == "user" and est.privacy_event_.count == 6
    assert float(pure_cost(est.privacy_event_)) == pytest.approx(3.0)


# ---------------------------------------------------------------------------------------------------------
# audit of 'bound, then randomize' on worst-case neighbouring users, with the bound-skipped control
# ---------------------------------------------------------------------------------------------------------


def _pipeline(users: list[str], epsilon: float, k: int, *, skip_bound: bool):
    """The fit's label path: keep ≤ K pairs per user (bound_contributions), then randomized response at ε/K on
    the kept labels (privatize_labels, what RRIHT and DenseRR call). Returns a sampler of the number of
    ones among the victim's released labels, given the victim's true labels (all 0 or all 1)."""
    kept = np.arange(len(users)) if skip_bound else bound_contributions(users, k)
    victim_rows = np.asarray([i for i in kept if users[i] == "victim"])
    per_label = UserRandomizedResponse(epsilon, max_contributions=k).per_label_epsilon

    def sampler(bit: int, rng: np.random.Generator):
        def draw(n: int) -> np.ndarray:
            y = np.zeros((n, len(users)))
            y[:, [i for i, u in enumerate(users) if u == "victim"]] = bit
            y_tilde, _, _ = privatize_labels(y[:, kept], per_label, rng)  # n independent releases
            return y_tilde[:, np.searchsorted(kept, victim_rows)].sum(axis=1)

        return draw

    return sampler, len(victim_rows)


@pytest.mark.statistical
def test_user_level_pipeline_audit_passes_and_catches_a_skipped_bound(seed):
    """Worst case: the victim labels 2K pairs, all 0 (D) vs all 1 (D′), among other users' pairs. Statistic:
    the number of ones among the victim's released labels (the likelihood ratio is monotone in it, so its
    threshold events are the most powerful). The correct pipeline keeps K and must pass (ε̂ ≤ ε, false
    alarm ≤ α = 1e-4, Clopper–Pearson); skipping the bound releases 2K labels at ε/K, a 2ε loss, and must be
    caught."""
    eps, k = 1.0, 3
    users = ["victim", "a", "victim", "b", "victim", "victim", "a", "victim", "victim"]  # 6 = 2K victim pairs
    for skip, should_pass in ((False, True), (True, False)):
        sampler, m = _pipeline(users, eps, k, skip_bound=skip)
        rng = np.random.default_rng([seed, zlib.crc32(str(skip).encode())])
        res = audit_threshold(
            sampler(0, rng),
            sampler(1, rng),
            20_000,
            ALPHA,
            thresholds=tuple(float(t) for t in range(m)),
            claimed_epsilon=eps,
        )
        assert res.passed is should_pass, (skip, res.to_dict())


# ---------------------------------------------------------------------------------------------------------
# the command: fit-reward --privacy-unit user
# ---------------------------------------------------------------------------------------------------------

POS = ["great", "wonderful", "superb", "moving", "brilliant", "lovely"]
NEG = ["awful", "boring", "terrible", "dull", "weak", "bad"]


def _records(n: int = 240, users: int = 24, seed: int = 5) -> list[dict]:
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


def _fit(data: Path, out: Path, *extra: str) -> dict:
    here = os.getcwd()
    os.chdir(data.parent)
    try:
        argv = ["fit-reward", "--data", data.name, "--method", "rr-iht", "--epsilon", "2", "--sparsity", "4"]
        argv += ["--n-features", "128", "--privacy-unit", "user", "--max-pairs-per-user", "4", "--seed", "3"]
        assert main([*argv, "--out", str(out), *extra]) == 0
    finally:
        os.chdir(here)
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("method", ["rr-iht", "rr", "RRIHT"])  # any spelling of a user-level class
def test_fit_reward_user_level_release_states_the_user_and_k(tmp_path, capsys, method):
    data = _write(tmp_path / "D", _records())
    out = tmp_path / "rm.json"
    argv = ["fit-reward", "--data", str(data), "--method", method, "--epsilon", "2", "--n-features", "128"]
    argv += ["--privacy-unit", "user", "--max-pairs-per-user", "4", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    ev = event_from_dict(doc["privacy_event"])
    assert ev.unit == "user" and ev.count == 4 and ev.event.epsilon == pytest.approx(0.5)
    assert float(pure_cost(ev)) == pytest.approx(2.0)
    meta = doc["metadata"]
    assert meta["privacy_unit"] == "user" and meta["max_pairs_per_user"] == 4
    assert meta["split"]["rule"] == "by user"
    # 24 users, each keeps 4 of their 10 pairs: 96 pairs in all
    assert meta["n_train"] + meta["n_test"] == 96
    assert "ε = 2" in capsys.readouterr().out


def test_user_level_release_differs_only_in_dp_outputs_between_neighbouring_users(tmp_path):
    """D vs D′: every label of one user flipped (chosen ↔ rejected on all of their pairs, kept or not). The
    releases differ only in the DP outputs (coefficients, support, nonzeros)."""
    recs = _records()
    flipped = [dict(r) for r in recs]
    for r in flipped:
        if r["user"] == "ann5":
            r["chosen"], r["rejected"] = r["rejected"], r["chosen"]
    a = _fit(_write(tmp_path / "D", recs), tmp_path / "a.json")
    b = _fit(_write(tmp_path / "D2", flipped), tmp_path / "b.json")
    outputs = ("coef", "fitted.support_", "metadata.nonzeros")

    def flat(doc, prefix=""):
        if isinstance(doc, dict):
            res = {}
            for key, v in doc.items():
                res.update(flat(v, f"{prefix}.{key}" if prefix else key))
            return res
        return {prefix: doc}

    fa, fb = flat(a), flat(b)
    differing = {key for key in fa.keys() | fb.keys() if fa.get(key) != fb.get(key)}
    assert not {f for f in differing if not any(f == o or f.startswith(o + ".") for o in outputs)}


@pytest.mark.parametrize(
    "extra,needles",
    [
        (
            ["--method", "iht", "--privacy-unit", "user", "--max-pairs-per-user", "3"],
            ["--privacy-unit", "iht", "does not offer it"],
        ),
        (["--method", "rr-iht", "--privacy-unit", "user"], ["--max-pairs-per-user", "required"]),
        (
            ["--method", "rr-iht", "--privacy-unit", "user", "--max-pairs-per-user", "0"],
            ["--max-pairs-per-user", "0"],
        ),
        (
            ["--method", "rr-iht", "--max-pairs-per-user", "3"],
            ["--max-pairs-per-user", "--privacy-unit user"],
        ),
    ],
)
def test_fit_reward_user_level_refusals_are_one_line_and_write_nothing(tmp_path, capsys, extra, needles):
    data = _write(tmp_path / "D", _records(40, 4))
    out = tmp_path / "rm.json"
    one_line_error(["fit-reward", "--data", str(data), "--out", str(out), *extra], needles, capsys)
    assert not out.exists()


def test_fit_reward_user_level_refuses_pairs_without_a_user(tmp_path, capsys):
    recs = _records(40, 4)
    del recs[7]["user"]
    data = _write(tmp_path / "D", recs)
    out = tmp_path / "rm.json"
    argv = ["fit-reward", "--data", str(data), "--method", "rr", "--privacy-unit", "user"]
    one_line_error([*argv, "--max-pairs-per-user", "3", "--out", str(out)], ["user", ":8"], capsys)
    assert not out.exists()
    one_line_error(
        [
            "fit-reward",
            "--data",
            "imdb",
            "--method",
            "rr",
            "--privacy-unit",
            "user",
            "--max-pairs-per-user",
            "3",
        ],
        ["--data", "imdb", "user"],
        capsys,
    )


def test_a_policy_from_a_user_level_model_states_the_per_user_budget(tmp_path):
    """`align`'s privacy statement of a user-level reward model: ε per user (not the ε/K per label its
    estimator ran at), the unit 'user' and K, as the budget the model file states."""
    from privalign.release import check_reward_model
    from privalign.rlhf.rewards import load_reward
    from privalign.rlhf.train import privacy_statement

    data = _write(tmp_path / "D", _records())
    out = tmp_path / "rm.json"
    _fit(data, out)
    desc = load_reward(str(out)).describe()
    st = privacy_statement(desc, {"source": "test prompts"})
    assert st["guarantee"]["epsilon"] == pytest.approx(2.0) and st["guarantee"]["delta"] == 0.0
    text = st["statement"]
    assert "'user'" in text and "at most 4 pairs per user" in text
    assert "the budget the model file states, (ε=2, δ=0)" in text
    check_reward_model(json.loads(out.read_text()))  # the file itself is inside the release boundary


def test_split_by_user_keeps_each_users_pairs_on_one_side(rng):
    from privalign.estimation.preferences import PreferenceData, train_test_split

    users = [f"u{int(u)}" for u in rng.integers(0, 12, 200)]
    data = PreferenceData(X=rng.normal(size=(200, 3)), y=rng.integers(0, 2, 200), user_ids=users)
    train, test = train_test_split(data, unit="user", test_size=0.25, random_state=0)
    assert set(train.user_ids.tolist()).isdisjoint(test.user_ids.tolist())
    assert train.n_samples + test.n_samples == 200
    assert list(train.prompt_ids) != list(train.user_ids)  # the prompts are kept, not replaced by the users
