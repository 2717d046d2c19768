"""User-level DPO (issue 39) and the optimizer choice: configuration, contribution bounding, the per-user
clipping of user-level DP-SGD and its statistical audit on worst-case neighbouring users (with a broken
variant that clips per pair), both routes on a tiny random Llama, ε identical across optimizers, and
``privalign dpo --privacy-unit user`` (refusals; manifests on neighbouring users)."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("opacus")

from test_dpo import tiny_base  # noqa: E402
from test_dpo_cli import _walk_keys, tiny_dir  # noqa: E402, F401  (tiny_dir: a fixture)

from _util import one_line_error  # noqa: E402
from privalign.cli import main  # noqa: E402
from privalign.errors import DataFormatError, PrivacyParameterError, UtilityWarning  # noqa: E402
from privalign.rlhf import dpo  # noqa: E402

ALPHA = 1e-3


class UPairs:
    def __init__(self, users, prompts=None, chosen=None, rejected=None):
        n = len(users)
        self.users = list(users)
        self.prompts = list(prompts or [f"review {k}: " for k in range(n)])
        self.chosen = list(chosen or [f"great film {k}!" for k in range(n)])
        self.rejected = list(rejected or [f"dull film {k}." for k in range(n)])


@pytest.fixture(scope="module")
def base():
    return tiny_base()


# ---------------------------------------------------------------------------------------------------------
# configuration and contribution bounding
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, flag",
    [
        ({"privacy": "label", "epsilon": 1.0, "privacy_unit": "user"}, "max_pairs_per_user"),
        ({"privacy": "label", "epsilon": 1.0, "privacy_unit": "user", "max_pairs_per_user": 0}, "max_pairs"),
        ({"privacy": "label", "epsilon": 1.0, "max_pairs_per_user": 3}, "max_pairs_per_user"),
        ({"privacy": "none", "privacy_unit": "user", "max_pairs_per_user": 3}, "privacy_unit"),
        ({"privacy": "label", "epsilon": 1.0, "privacy_unit": "group"}, "privacy_unit"),
        # ε/K below the ε rule's floor (1e-9): refused as an ε problem before any work
        ({"privacy": "label", "epsilon": 1e-8, "privacy_unit": "user", "max_pairs_per_user": 100}, "epsilon"),
        ({"privacy": "label", "epsilon": 1.0, "optimizer": "lion"}, "optimizer"),
        ({"privacy": "label", "epsilon": 1.0, "weight_decay": 0.1}, "weight_decay"),
        ({"privacy": "sample", "epsilon": 1.0, "optimizer": "adamw", "weight_decay": -0.1}, "weight_decay"),
        (
            {"privacy": "sample", "epsilon": 1.0, "optimizer": "adamw", "weight_decay": math.nan},
            "weight_decay",
        ),
    ],
)
def test_config_refuses_bad_user_level_and_optimizer_settings(kw, flag):
    with pytest.raises(PrivacyParameterError, match=flag):
        dpo.DPOConfig(**kw)


def test_config_user_level_flip_rate_and_adamw_default():
    cfg = dpo.DPOConfig(privacy="label", epsilon=2.0, privacy_unit="user", max_pairs_per_user=4)
    assert cfg.per_label_epsilon == 0.5 and cfg.flip_rate == pytest.approx(1 / (1 + math.exp(0.5)))
    assert dpo.DPOConfig(privacy="sample", epsilon=1.0, optimizer="adamw").weight_decay == 0.01


def test_prepare_units_bounds_first_k_per_user_and_numbers_users():
    users = ["a", "b", "a", "a", "c", "b", "a", "b", "b"]
    cfg = dpo.DPOConfig(
        privacy="sample", epsilon=1.0, privacy_unit="user", max_pairs_per_user=2, batch_size=1
    )
    u = dpo.prepare_units(UPairs(users), cfg)
    assert u.pairs.users == ["a", "b", "a", "c", "b"]  # the first 2 of each user, in file order
    assert u.pairs.prompts == ["review 0: ", "review 1: ", "review 2: ", "review 4: ", "review 5: "]
    assert u.owner.tolist() == [0, 1, 0, 2, 1] and u.n_units == u.n_users == 3
    lab = dpo.DPOConfig(privacy="label", epsilon=1.0, privacy_unit="user", max_pairs_per_user=2)
    assert dpo.prepare_units(UPairs(users), lab).n_units == 5  # label: batches of pairs
    rec = dpo.prepare_units(UPairs(users), dpo.DPOConfig(privacy="label", epsilon=1.0))
    assert rec.n_units == 9 and rec.owner.tolist() == list(range(9)) and rec.n_users is None


@pytest.mark.parametrize("users", [None, ["a", "", "b"], ["a", None, "b"]])
def test_prepare_units_refuses_pairs_without_a_user(users):
    cfg = dpo.DPOConfig(privacy="label", epsilon=1.0, privacy_unit="user", max_pairs_per_user=2)
    pairs = UPairs(["a", "b", "c"])
    pairs.users = users
    with pytest.raises(DataFormatError, match="user"):
        dpo.prepare_units(pairs, cfg)


def test_schedule_counts_users_under_user_level_sample():
    cfg = dpo.DPOConfig(
        privacy="sample", epsilon=1.0, delta=0.4, privacy_unit="user", max_pairs_per_user=2, batch_size=2
    )
    with pytest.raises(PrivacyParameterError, match=r"delta.*1/n = 0\.333 for 3 users"):
        dpo.check_schedule(cfg, 3)
    big = dpo.DPOConfig(
        privacy="sample", epsilon=1.0, delta=1e-3, privacy_unit="user", max_pairs_per_user=2, batch_size=4
    )
    with pytest.raises(PrivacyParameterError, match=r"batch_size.*number of users \(3\)"):
        dpo.check_schedule(big, 3)


# ---------------------------------------------------------------------------------------------------------
# the per-user clipping and its audit
# ---------------------------------------------------------------------------------------------------------


def _flat(xs):
    return torch.cat([x.reshape(-1) for x in xs])


def test_clip_by_unit_sums_a_users_pairs_then_clips_once():
    g = [torch.tensor([[3.0, 0.0], [0.0, 4.0], [0.3, 0.4], [1.0, 0.0]], dtype=torch.float64)]
    out = dpo.clip_and_noise_by_unit(g, [7, 7, 2, 7], 1.0, 0.0, torch.Generator())
    user7 = torch.tensor([4.0, 4.0], dtype=torch.float64)  # 3e1 + 4e2 + 1e1, norm √32 → clipped to 1
    expect = user7 / user7.norm() + torch.tensor([0.3, 0.4], dtype=torch.float64)
    assert torch.allclose(out[0], expect, atol=1e-12)
    # one row per unit: exactly the record-level mechanism (same noise draws from the same generator)
    a = dpo.clip_and_noise_by_unit(g, [0, 1, 2, 3], 1.0, 2.0, torch.Generator().manual_seed(5))
    b = dpo.clip_and_noise(g, 1.0, 2.0, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0])
    with pytest.raises(PrivacyParameterError, match="owners"):
        dpo.clip_and_noise_by_unit(g, [0, 1], 1.0, 0.0, torch.Generator())


def _per_pair_clip(per, owners, clip, sigma, gen):
    """BROKEN (negative control): clips each pair, not each user; a user's K pairs move the sum by 2KC."""
    return dpo.clip_and_noise(per, clip, sigma, gen)


@pytest.mark.statistical
def test_audit_user_level_dp_sgd_step_and_catch_per_pair_clipping():
    """One user-level DP-SGD step with q = 1 on neighbouring datasets that differ in all of one user's pairs.

    The victim holds 6 pairs in the file (bounded to its first K = 4 by the training code's
    :func:`dpo.prepare_units`); in D each kept pair's gradient is 3·e₁, in D′ −3·e₁ (every pair pushes the
    same way: the worst case for per-pair clipping), the other three users' pairs are fixed random vectors.
    Clipped once per user (C = 1 < 12), the two noiseless sums differ by exactly 2C (asserted): a Gaussian
    of sensitivity 2C, claim ε = dpsgd_epsilon(σ = 4, q = 1, 1 step, δ = 1e-5) (replace-one, one user = one
    unit). Statistic: the output projected on the direction between the mechanism's two noiseless outputs, in
    units of σC; thresholds fixed in advance; ``audit_threshold`` with 6,000 draws per side, α = 1e-3 for the
    whole audit (exact Clopper–Pearson, Bonferroni). The broken variant clips per pair (sensitivity 2KC = 8C)
    and claims the same ε: it must be caught."""
    from privalign.audit import audit_threshold
    from privalign.estimation.baselines import dpsgd_epsilon

    users = ["v", "a", "v", "b", "v", "a", "v", "c", "v", "b", "v", "c"]
    cfg = dpo.DPOConfig(
        privacy="sample", epsilon=1.0, privacy_unit="user", max_pairs_per_user=4, batch_size=4, delta=1e-5
    )
    units = dpo.prepare_units(UPairs(users), cfg)
    owners = units.owner
    victim = np.asarray([u == "v" for u in units.pairs.users])
    assert victim.sum() == 4 and units.n_users == 4
    assert dpo._batches(cfg, units.n_units, np.random.default_rng(0), owners)[0].tolist() == list(
        range(len(owners))
    )  # q = B/n_users = 1: every pair of every user
    rng = np.random.default_rng(7)
    others = torch.as_tensor(rng.normal(size=(len(owners), 6)) * 0.4)
    g_d, g_dp = others.clone(), others.clone()
    e1 = torch.zeros(6, dtype=torch.float64)
    e1[0] = 3.0
    g_d[torch.as_tensor(victim)] = e1
    g_dp[torch.as_tensor(victim)] = -e1
    clip, sigma, delta, n = 1.0, 4.0, 1e-5, 6_000
    claimed = dpsgd_epsilon(sigma, 1.0, 1, delta)

    def sampler(per, mech, seed, mid, u):
        gen = torch.Generator().manual_seed(seed)

        def draw(m):
            return np.array(
                [
                    float((_flat(mech([per], owners, clip, sigma, gen)) - mid) @ u) / (sigma * clip)
                    for _ in range(m)
                ]
            )

        return draw

    for k, (mech, should_pass) in enumerate(((dpo.clip_and_noise_by_unit, True), (_per_pair_clip, False))):
        s_d = _flat(mech([g_d], owners, clip, 0.0, torch.Generator()))
        s_dp = _flat(mech([g_dp], owners, clip, 0.0, torch.Generator()))
        gap = float((s_d - s_dp).norm())
        assert gap == pytest.approx(2 * clip if should_pass else 2 * 4 * clip, rel=1e-9)
        mid, u = (s_d + s_dp) / 2, (s_d - s_dp) / (s_d - s_dp).norm()
        res = audit_threshold(
            sampler(g_d, mech, 300 + k, mid, u),
            sampler(g_dp, mech, 400 + k, mid, u),
            n,
            ALPHA,
            thresholds=[-0.5, -0.25, 0.0, 0.25, 0.5],
            claimed_epsilon=claimed,
            delta=delta,
        )
        assert res.passed is should_pass, (k, res.to_dict())


# ---------------------------------------------------------------------------------------------------------
# training on the tiny model
# ---------------------------------------------------------------------------------------------------------


def _users(n_users=6, per=3):
    return [f"u{k % n_users}" for k in range(n_users * per)]


def _train(base, cfg, pairs, seed=3):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UtilityWarning)
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        return dpo.train_dpo(
            pairs, cfg, model=copy.deepcopy(base[0]), tokenizer=base[1], rng=np.random.default_rng(seed)
        )


def test_user_level_sample_route_groups_by_user_and_accounts_users(base, monkeypatch):
    """Each step clips the sum of every sampled user's kept pairs: the owners handed to the mechanism are the
    users of the step's pairs, and every kept pair of a sampled user is in the step. q = B/n_users."""
    from privalign.accounting.events import event_from_dict
    from privalign.rlhf.train import event_guarantee

    seen = []
    real = dpo.clip_and_noise_by_unit

    def spy(per_pair, owners, *a):
        seen.append((per_pair[0].shape[0], np.asarray(owners).copy()))
        return real(per_pair, owners, *a)

    monkeypatch.setattr(dpo, "clip_and_noise_by_unit", spy)
    cfg = dpo.DPOConfig(
        privacy="sample",
        epsilon=4.0,
        delta=1e-3,
        privacy_unit="user",
        max_pairs_per_user=2,
        batch_size=2,
        lora_rank=2,
        max_length=24,
    )
    res = _train(base, cfg, UPairs(_users(6, 3)))
    assert res["steps"] == 3 and res["n_users"] == 6 and res["n_pairs"] == 12
    for m, owners in seen:
        assert len(owners) == m
        counts = np.bincount(owners, minlength=6)
        assert set(counts[counts > 0].tolist()) <= {2}  # all (both) kept pairs of each sampled user
    pr = res["privacy"]
    assert pr["privacy_unit"] == "user" and pr["max_pairs_per_user"] == 2 and pr["relation"] == "replace_one"
    assert pr["accounting"]["sampling_probability"] == pytest.approx(2 / 6)
    ev = event_from_dict(pr["privacy_event"])
    assert ev.unit == "user" and ev.event.unit == "user" and ev.event.event.unit == "user" and ev.count == 3
    eps_ev, d_ev, _ = event_guarantee(pr["privacy_event"], delta=1e-3)
    # the same accountant as the record route with n = n_users
    rec = dpo.sample_dp_accounting(4.0, 1e-3, 6, 2, 3)
    assert pr["accounting"]["epsilon"] == rec["epsilon"] and eps_ev <= 4.0 * 1.01 and d_ev == 1e-3


def test_user_level_label_route_randomizes_at_eps_over_k(base, monkeypatch):
    from privalign.mechanisms.user_level import UserRandomizedResponse

    got = {}
    real = dpo.privatize_preferences

    def spy(labels, eps, rng, *, mechanism=None):
        got["mech"], got["n"] = mechanism, len(labels)
        return real(labels, eps, rng, mechanism=mechanism)

    monkeypatch.setattr(dpo, "privatize_preferences", spy)
    cfg = dpo.DPOConfig(
        privacy="label", epsilon=2.0, privacy_unit="user", max_pairs_per_user=2, batch_size=4, lora_rank=2,
        max_length=24,
    )  # fmt: skip
    res = _train(base, cfg, UPairs(_users(4, 3)))
    assert isinstance(got["mech"], UserRandomizedResponse) and got["mech"].per_label_epsilon == 1.0
    assert got["n"] == 8 and res["n_pairs"] == 8 and res["steps"] == 2  # 4 users × first 2 pairs
    pr = res["privacy"]
    assert pr["privacy_event"] == got["mech"].event.to_dict()
    assert pr["privacy_event"]["unit"] == "user" and pr["privacy_event"]["count"] == 2
    assert pr["privacy_event"]["event"]["epsilon"] == 1.0
    assert pr["guarantee"]["epsilon"] == 2.0 and pr["flip_rate"] == pytest.approx(1 / (1 + math.e))


def test_epsilon_is_identical_across_optimizers_and_the_optimizer_is_used(base, monkeypatch):
    """The optimizer reads only the privatized gradient: the privacy record (event, accounting, guarantee) is
    the same for adam, adamw and sgd, while the trained policies differ (each optimizer really ran)."""
    made = []
    real = dpo.make_optimizer

    def spy(config, params):
        opt = real(config, params)
        made.append(type(opt).__name__)
        return opt

    monkeypatch.setattr(dpo, "make_optimizer", spy)
    recs, weights = [], []
    for opt in ("adam", "adamw", "sgd"):
        cfg = dpo.DPOConfig(
            privacy="sample", epsilon=4.0, delta=1e-3, batch_size=4, lora_rank=2, max_length=24, optimizer=opt
        )
        res = _train(base, cfg, UPairs(_users(12, 1)))
        recs.append(res["privacy"])
        weights.append(torch.cat([p.detach().reshape(-1) for p in res["model"].parameters()]))
    assert made == ["Adam", "AdamW", "SGD"]
    assert recs[0] == recs[1] == recs[2]
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])


def test_adamw_applies_decoupled_weight_decay():
    cfg = dpo.DPOConfig(privacy="sample", epsilon=1.0, optimizer="adamw", weight_decay=0.5, learning_rate=0.1)
    w = torch.nn.Parameter(torch.tensor([2.0]))
    opt = dpo.make_optimizer(cfg, [w])
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["weight_decay"] == 0.5
    w.grad = torch.zeros(1)  # zero (noised) gradient: only the decay moves w, by lr·λ·w
    opt.step()
    assert float(w.detach()) == pytest.approx(2.0 * (1 - 0.1 * 0.5))


# ---------------------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------------------


def _write(path, users, *, replace_user=None, flip_user=None):
    rows = [
        {"prompt": f"review {k}: ", "chosen": f"great film {k}!", "rejected": f"dull film {k}.", "user": u}
        for k, u in enumerate(users)
    ]
    if flip_user is not None:  # label neighbours: every label of one user reversed (the pairs are public)
        rows = [
            {**r, "chosen": r["rejected"], "rejected": r["chosen"]} if r["user"] == flip_user else r
            for r in rows
        ]
    if replace_user is not None:  # sample neighbours: all of one user's pairs replaced by one other pair
        rows = [r for r in rows if r["user"] != replace_user]
        rows.insert(
            1, {"prompt": "other: ", "chosen": "a quiet evening", "rejected": "loud!", "user": replace_user}
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "u.jsonl", _users(6, 3))
    (tmp_path / "nouser.jsonl").write_text(
        '{"chosen": "good", "rejected": "bad", "user": "a"}\n{"chosen": "fine", "rejected": "poor"}\n',
        encoding="utf-8",
    )

    def no_load(*a, **k):  # pragma: no cover - reached only if a bad input loads the model
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr("privalign.rlhf.train.load_base_model", no_load)
    return tmp_path


UBASE = ["dpo", "--data", "u.jsonl", "--out", "o", "--no-progress"]


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--privacy", "label", "--epsilon", "1", "--privacy-unit", "user"], ["--max-pairs-per-user"]),
        (
            ["--privacy", "label", "--epsilon", "1", "--max-pairs-per-user", "2"],
            ["--max-pairs-per-user", "2"],
        ),
        (
            ["--privacy", "label", "--epsilon", "1", "--privacy-unit", "user", "--max-pairs-per-user", "0"],
            ["--max-pairs-per-user", "0"],
        ),
        (
            [
                "--privacy",
                "label",
                "--flip-rate",
                "0.2",
                "--privacy-unit",
                "user",
                "--max-pairs-per-user",
                "2",
            ],
            ["--flip-rate", "--privacy-unit user", "per-label"],
        ),
        (["--privacy", "none", "--privacy-unit", "user", "--max-pairs-per-user", "2"], ["--privacy-unit"]),
        (
            ["--privacy", "sample", "--epsilon", "2", "--privacy-unit", "user", "--max-pairs-per-user", "2"]
            + ["--delta", "0.2", "--batch-size", "2"],
            ["--delta", "6 users"],
        ),
        (
            ["--privacy", "sample", "--epsilon", "2", "--privacy-unit", "user", "--max-pairs-per-user", "2"]
            + ["--batch-size", "7"],
            ["--batch-size", "users (6)"],
        ),
        (
            ["--privacy", "label", "--epsilon", "2", "--privacy-unit", "user", "--max-pairs-per-user", "2"]
            + ["--user-field", "annotator"],
            ["--data", "annotator"],
        ),
        (["--privacy", "sample", "--epsilon", "2", "--weight-decay", "0.1"], ["--weight-decay", "adamw"]),
        (
            ["--privacy", "sample", "--epsilon", "2", "--optimizer", "adamw", "--weight-decay", "-1"],
            ["--weight-decay", "-1"],
        ),
    ],
)
def test_bad_user_level_options(work, capsys, extra, needles):
    one_line_error(UBASE + extra, needles, capsys)
    assert not (work / "o").exists() and not (work / "o.partial").exists()


def test_pairs_without_a_user_are_refused(work, capsys):
    argv = ["dpo", "--data", "nouser.jsonl", "--out", "o", "--privacy", "label", "--epsilon", "1"]
    argv += ["--privacy-unit", "user", "--max-pairs-per-user", "2", "--batch-size", "1"]
    one_line_error(argv, ["--data", "'user'", ":2"], capsys)
    assert not (work / "o").exists() and not (work / "o.partial").exists()


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize(
    "privacy, extra",
    [
        ("label", ["--epsilon", "2", "--batch-size", "4"]),
        ("sample", ["--epsilon", "4", "--delta", "1e-3", "--batch-size", "2", "--optimizer", "adamw"]),
    ],
)
def test_dpo_cli_user_level_release_on_neighbouring_users(tmp_path, tiny_dir, capsys, privacy, extra):  # noqa: F811
    """Neighbouring datasets that differ in all of one user's pairs (label: every label of user u1 reversed;
    sample: u1's three pairs replaced by one other pair), different seeds: the manifests differ only in their
    creation time and data path; the event has unit 'user' and K; no seed, hash, loss or pair count of the
    user-level sample route (it would change with u1's data)."""
    from privalign.accounting.events import event_from_dict
    from privalign.release import check_dpo_manifest

    users = _users(6, 3)
    d = _write(tmp_path / "d.jsonl", users)
    dp = _write(
        tmp_path / "dp.jsonl",
        users,
        **({"flip_user": "u1"} if privacy == "label" else {"replace_user": "u1"}),
    )
    mans = []
    for k, (data, out) in enumerate(((d, tmp_path / "o1"), (dp, tmp_path / "o2"))):
        argv = ["dpo", "--data", str(data), "--out", str(out), "--privacy", privacy, *extra]
        argv += ["--privacy-unit", "user", "--max-pairs-per-user", "2"]
        argv += ["--base-model", str(tiny_dir), "--lora-rank", "2", "--max-length", "24"]
        argv += ["--seed", str(4321 + k), "--no-progress", "--json"]
        assert main(argv) == 0, capsys.readouterr().err
        cap = capsys.readouterr()
        assert "Traceback" not in cap.err
        on_disk = json.loads((out / "manifest.json").read_text())
        check_dpo_manifest(on_disk)
        keys = " ".join(_walk_keys(on_disk)).lower()
        for bad in ("seed", "sha256", "hash", "loss", "entropy"):
            assert bad not in keys, bad
        text = json.dumps(on_disk)
        assert "4321" not in text and "4322" not in text
        for f in (d, dp):
            for h in (hashlib.sha256, hashlib.sha1, hashlib.md5):
                assert h(f.read_bytes()).hexdigest() not in text
        mans.append(on_disk)
    a, b = ({k: v for k, v in m.items() if k != "created_at"} for m in mans)
    assert a["data"].pop("path") != b["data"].pop("path")
    assert a == b
    pr = mans[0]["privacy"]
    ev = event_from_dict(pr["privacy_event"])
    assert pr["privacy_unit"] == "user" and ev.unit == "user" and pr["max_pairs_per_user"] == 2
    assert mans[0]["config"]["privacy_unit"] == "user" and mans[0]["config"]["max_pairs_per_user"] == 2
    assert mans[0]["data"]["n_users"] == 6
    if privacy == "label":
        assert ev.count == 2 and pr["privacy_event"]["event"]["epsilon"] == 1.0  # K = 2, ε/K = 1
        assert mans[0]["data"]["n_pairs"] == 12 and pr["guarantee"]["epsilon"] == 2.0
    else:
        assert ev.event.unit == "user" and pr["accounting"]["sampling_probability"] == pytest.approx(2 / 6)
        assert "n_pairs" not in mans[0]["data"]  # 12 kept pairs in D, 11 in D′: not released
        assert mans[0]["config"]["optimizer"] == "adamw" and mans[0]["config"]["weight_decay"] == 0.01
