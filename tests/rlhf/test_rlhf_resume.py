"""``p2-rlhf`` resumption helpers (no model): which steps are evaluated, which per-checkpoint records are
reused (identity must match), and how earlier sessions' records are imported."""

from __future__ import annotations

import json

import numpy as np

from privalign.experiments.base import RunContext
from privalign.experiments.rlhf import (
    _curve,
    _eval_steps,
    _run_cell,
    _summarize,
    _train_identity,
    _train_stats,
    policy_seed,
)


def _cfg(**kw):
    cfg = {"seed": 42, "steps": 300, "eval_every": 50, "learning_rate": 1e-3, "prior_evals": ""}
    cfg.update(kw)
    return cfg


def test_eval_steps_every_k_and_the_last():
    assert _eval_steps(_cfg()) == [50, 100, 150, 200, 250, 300]
    assert _eval_steps(_cfg(steps=120, eval_every=50)) == [50, 100, 120]
    assert _eval_steps(_cfg(steps=3, eval_every=50)) == [3]


def test_identity_depends_on_policy_seed_and_training_config():
    ss = np.random.SeedSequence(42, spawn_key=(3,))
    cell = {"policy": "RRIHT@8"}
    a = _train_identity(cell, _cfg(), ss)
    assert a == _train_identity(cell, _cfg(num_threads=4), ss)  # not a training key
    assert a != _train_identity(cell, _cfg(learning_rate=5e-4), ss)
    assert a != _train_identity({"policy": "DenseRR@8"}, _cfg(), ss)
    assert a != _train_identity(cell, _cfg(), np.random.SeedSequence(42, spawn_key=(4,)))


def test_policy_seed_depends_on_the_name_not_the_position():
    # two processes that split the policy list must train exactly what the full run trains
    a = policy_seed(42, "RRIHT@8")
    assert a.generate_state(4).tolist() == policy_seed(42, "RRIHT@8").generate_state(4).tolist()
    others = [policy_seed(42, p).generate_state(4).tolist() for p in ("RRIHT@2", "DenseRR@8", "IHT")]
    assert a.generate_state(4).tolist() not in others
    assert policy_seed(43, "RRIHT@8").generate_state(4).tolist() != a.generate_state(4).tolist()
    # never the runner's index-based cell seeds
    assert all(
        a.generate_state(4).tolist() != np.random.SeedSequence(42, spawn_key=(i,)).generate_state(4).tolist()
        for i in range(20)
    )


def test_prior_records_are_imported_only_when_their_identity_matches(tmp_path):
    cell = {"policy": "RRIHT@8"}
    cfg = _cfg(steps=100, eval_every=50)
    prior = tmp_path / "prior" / "RRIHT_eps8"
    prior.mkdir(parents=True)
    (prior / "step-000050.json").write_text(json.dumps({"identity": "good", "step": 50}))
    (prior / "step-000100.json").write_text(json.dumps({"identity": "stale", "step": 100}))
    ctx = RunContext(run_dir=tmp_path / "run")
    assert [r and r["step"] for r in _curve(cell, cfg, ctx, "good")] == [None, None]  # no prior_evals
    curve = _curve(cell, {**cfg, "prior_evals": str(tmp_path / "prior")}, ctx, "good")
    assert [r and r["step"] for r in curve] == [50, None]  # step 100 must be evaluated again
    # the matching record was copied into this run; the stale one was not
    assert [r and r["step"] for r in _curve(cell, cfg, ctx, "good")] == [50, None]
    assert not (tmp_path / "run" / "evals" / "RRIHT_eps8" / "step-000100.json").exists()


def test_train_stats_average_the_logged_steps_of_the_interval():
    hist = [{"step": s, "reward": float(s), "kl": 0.1 * s} for s in range(1, 11)] + [
        {"step": 10, "loss": 1.0}
    ]
    st = _train_stats(hist, 5, 10)
    assert st["steps_logged"] == 5 and st["reward"] == 8.0 and abs(st["kl"] - 0.8) < 1e-12
    assert _train_stats(hist, 20, 30) == {
        "steps_logged": 0,
        "reward": None,
        "kl": None,
        "entropy": None,
        "completions/mean_length": None,
    }


def test_records_only_reports_an_incomplete_policy_as_pending_and_trains_nothing(tmp_path):
    cfg = _cfg(steps=100, eval_every=50, records_only=True, prior_evals=str(tmp_path / "prior"))
    cell = {"cell": "RRIHT@8", "policy": "RRIHT@8", "method": "RRIHT", "epsilon": 8.0}
    ident = _train_identity(cell, cfg, policy_seed(42, "RRIHT@8"))
    prior = tmp_path / "prior" / "RRIHT_eps8"
    prior.mkdir(parents=True)
    (prior / "step-000050.json").write_text(json.dumps({"identity": ident, "step": 50}))
    ctx = RunContext(run_dir=tmp_path / "run")
    # no data, no model: a call that tried to fit or train would fail here
    (rec,) = _run_cell(cell, cfg, ctx, np.random.SeedSequence(0))
    assert rec == {
        "kind": "pending",
        "policy": "RRIHT@8",
        "method": "RRIHT",
        "epsilon": 8.0,
        "steps_recorded": [50],
        "steps_planned": [50, 100],
    }
    summ = _summarize([rec], {**cfg, "eval_prompts": 64})
    assert summ["pending"] == [{"policy": "RRIHT@8", "steps_recorded": [50], "steps_planned": [50, 100]}]
    assert "RRIHT@8 (1/2 checkpoints)" in summ["measured"]
    assert summ["verdict"] == "inconclusive"


def test_records_only_without_a_reference_record_is_refused(tmp_path):
    import pytest

    from privalign.experiments.base import ExperimentError

    cfg = _cfg(records_only=True, prior_evals=str(tmp_path / "none"))
    ref = {"cell": "reference", "policy": "reference", "method": "reference", "epsilon": None}
    with pytest.raises(ExperimentError, match="records_only"):
        _run_cell(ref, cfg, RunContext(run_dir=tmp_path / "run"), np.random.SeedSequence(0))
