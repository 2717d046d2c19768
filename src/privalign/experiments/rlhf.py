"""Paper 2, private RLHF end to end (``p2-rlhf``): policies trained with RL (TRL GRPO + LoRA on
SmolLM2-135M-Instruct) against private reward models, judged by a gold reward model that never saw the private
pairs — the CPU analogue of the paper's P2-6 ("PPO-aligned policy: higher reward at the same KL for sparse
methods").

* **Prompts** (public): held-out IMDb openings (:func:`privalign.rlhf.prompts.imdb_rl_prompts`): the first
  ``train_prompts`` for RL, the next ``eval_prompts`` for evaluation; all inside the first ``reserve``
  prompts.
* **Private preference pairs**: :func:`privalign.rlhf.prompts.heldout_imdb_pairs` — IMDb (positive, negative)
  review pairs from the prompt part of ``imdb_split`` minus the ``reserve`` prompt reviews, plus the proxy
  part of ``imdb_reward_split``: disjoint from every RL/eval prompt (checked again with
  :func:`~privalign.rlhf.prompts.check_prompts_disjoint`) and from the MiniLM gold model's training reviews.
* **Reward models**: one per entry of ``policies`` (``METHOD@EPS`` for the private ones, ``IHT``/``MLE``
  non-private), binary hashed n-grams of the response, fitted with the paper-2 estimators and saved under
  ``RUN/reward_models/``; each policy is post-processing of its reward model (same ε, δ, unit).
* **Cell** = fit the reward model (:func:`_fit_reward_model`) → train the policy (:func:`_train_policy`),
  evaluated at every ``eval_every`` steps and the last (:func:`_evaluate_policy`, from a trainer callback) →
  the record (:func:`_policy_record`: the last checkpoint's evaluation plus the curve). Each evaluation is
  written to ``RUN/evals/POLICY/step-N.json`` with an identity hash; records from an earlier session
  (``prior_evals``) are reused, and a policy whose checkpoints all have records is not trained again.
* **Evaluation**: ``eval_samples`` samples per eval prompt; gold = MiniLM gold (``P(positive)``); KL(π ‖
  π_ref) from the samples' log-probabilities; win rate against ``reference_samples`` reference samples per
  prompt with a 95% paired bootstrap interval over prompts; best-of-N (N in ``bon_ns``) from the same
  reference samples with the same reward model, at KL ≤ log N − (N − 1)/N, so RL and BoN share the
  gold-reward-vs-KL axes.
* **Verdict** (:func:`rlhf_verdict`): sparse vs dense at each ε (RRIHT vs DenseRR, label-DP; SampleDPIHT vs
  DPSGDLinear, sample-DP) by :func:`privalign.rlhf.evaluate.sparse_vs_dense_verdict`; three-valued, states
  power. The quick configuration trains for a handful of steps on a handful of prompts: it is underpowered by
  design.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from privalign.experiments.base import Experiment, ExperimentError, RunContext
from privalign.experiments.config import Field
from privalign.experiments.record_store import RecordStore, identity, repo_path
from privalign.experiments.runner import read_results

__all__ = [
    "EXPERIMENTS",
    "parse_policy",
    "policy_seed",
    "rlhf_equal_kl_verdict",
    "rlhf_verdict",
    "SPARSE_DENSE",
]

PRIVATE = ("SampleDPIHT", "RRIHT", "DenseRR", "DPSGDLinear")
NONPRIVATE = ("IHT", "MLE")
#: (sparse, dense) pairs compared at equal ε and equal privacy unit.
SPARSE_DENSE = (("RRIHT", "DenseRR"), ("SampleDPIHT", "DPSGDLinear"))
GOLD_DESC = (
    "MiniLM gold: logistic regression on MiniLM embeddings (pools/imdb-gold-minilm-logreg.json), P(positive)"
)


def parse_policy(spec: str) -> tuple[str, float | None]:
    """``"RRIHT@8"`` → ``("RRIHT", 8.0)``; ``"IHT"`` → ``("IHT", None)``.

    Raises:
      ExperimentError: unknown method, missing/extra ε, or ε ≤ 0.
    """
    name, _, eps = str(spec).partition("@")
    if name in NONPRIVATE and not eps:
        return name, None
    if name not in PRIVATE:
        raise ExperimentError(
            f"p2-rlhf: config key 'policies': {spec!r}: method must be one of {PRIVATE + NONPRIVATE}."
        )
    try:
        e = float(eps)
    except ValueError:
        raise ExperimentError(
            f"p2-rlhf: config key 'policies': {spec!r}: a private method needs '@EPSILON' (e.g. RRIHT@8)."
        ) from None
    if not (e > 0 and math.isfinite(e)):
        raise ExperimentError(f"p2-rlhf: config key 'policies': {spec!r}: ε must be a finite number > 0.")
    return name, e


def _schema() -> dict[str, Field]:
    from privalign.experiments.config import estimator_fields

    s = {k: v for k, v in estimator_fields().items() if k != "methods"}
    s.update(
        {
            "policies": Field(
                "list[str]",
                [
                    "RRIHT@8",
                    "RRIHT@2",
                    "DenseRR@8",
                    "DenseRR@2",
                    "SampleDPIHT@8",
                    "SampleDPIHT@2",
                    "DPSGDLinear@8",
                    "DPSGDLinear@2",
                    "IHT",
                ],
                "reward models (METHOD@EPS or IHT/MLE)",
            ),
            "sparsity": Field("int", 32, "s for the IHT methods", low=1),
            "n_features": Field("int", 4096, "hashed n-gram dimension d", low=2),
            "ngram_max": Field("int", 1, "largest word n-gram", low=1),
            "reserve": Field(
                "int",
                200,
                "IMDb prompts kept out of the private pairs (RL + eval prompts come from them)",
                low=2,
            ),
            "train_prompts": Field("int", 64, "RL prompts (the first of the held-out order)", low=1),
            "eval_prompts": Field("int", 64, "evaluation prompts (the next ones)", low=2),
            "pair_max_chars": Field(
                "int", 1000, "private review pairs truncated to this many characters", low=10
            ),
            "steps": Field("int", 100, "GRPO optimiser steps per policy", low=1),
            "eval_every": Field(
                "int",
                50,
                "checkpoint and evaluate the policy every this many GRPO steps (and at the last)",
                low=1,
            ),
            "prior_evals": Field(
                "str",
                "",
                "directory of per-checkpoint evaluation records from an earlier session (RUN/evals layout, "
                "e.g. docs/results/p2-rlhf/evals); records with a matching identity are reused",
            ),
            "records_only": Field(
                "bool",
                False,
                "summarise the per-checkpoint records that exist (here or under prior_evals) and train "
                "nothing: a policy without all its records is reported as pending (a partial run's "
                "figure and verdict)",
            ),
            "beta": Field("float", 0.05, "KL coefficient to the reference policy (> 0)", low=1e-12),
            "learning_rate": Field("float", 2e-4, "LoRA learning rate", low=1e-12),
            "num_generations": Field("int", 4, "samples per prompt in a GRPO group", low=2),
            "prompts_per_step": Field("int", 2, "prompts per GRPO step", low=1),
            "max_new_tokens": Field("int", 16, "completion length", low=1),
            "lora_rank": Field("int", 16, "LoRA rank", low=1),
            "eval_samples": Field("int", 4, "samples per eval prompt from each trained policy", low=1),
            "reference_samples": Field(
                "int", 16, "samples per eval prompt from the reference policy (≥ max bon_ns)", low=1
            ),
            "bon_ns": Field("list[int]", [1, 2, 4, 8, 16], "best-of-N sizes", low=1),
            "gold": Field(
                "str", "pools/imdb-gold-minilm-logreg.json", "gold reward (LinearRewardScorer JSON)"
            ),
            "kl_budgets": Field(
                "list[float]",
                [0.5, 1.0, 2.0],
                "KL budgets [nats] of the equal-KL comparison (rlhf_equal_kl_verdict)",
                low=1e-12,
            ),
            "equivalence_margin": Field(
                "float", 0.02, "equal-KL comparison: a tie is shown within ± this gold", low=1e-12
            ),
            "n_bootstrap": Field("int", 2000, "bootstrap resamples over prompts", low=100),
            "num_threads": Field("int", 1, "torch CPU threads", low=1),
        }
    )
    return s


def _gold_path(cfg: dict) -> Path:
    return repo_path(cfg["gold"])


def _preflight(cfg: dict, ctx: RunContext) -> None:
    from privalign.experiments.manifest import file_sha256
    from privalign.models._resources import require

    for spec in cfg["policies"]:
        parse_policy(spec)
    if len(set(cfg["policies"])) != len(cfg["policies"]):
        raise ExperimentError("p2-rlhf: config key 'policies' has duplicates.")
    if cfg["train_prompts"] + cfg["eval_prompts"] > cfg["reserve"]:
        raise ExperimentError(
            f"p2-rlhf: train_prompts + eval_prompts = {cfg['train_prompts'] + cfg['eval_prompts']} must be "
            f"<= reserve = {cfg['reserve']} (every RL/eval prompt must be held out from the private pairs)."
        )
    if max(cfg["bon_ns"]) > cfg["reference_samples"]:
        raise ExperimentError(
            f"p2-rlhf: max(bon_ns) = {max(cfg['bon_ns'])} > reference_samples = {cfg['reference_samples']}."
        )
    g = _gold_path(cfg)
    if not g.is_file():
        raise ExperimentError(f"p2-rlhf: the gold model {g} does not exist (config key 'gold').")
    for mod in ("trl", "peft", "torch", "transformers"):
        require(mod, purpose="p2-rlhf (pip install 'privalign[rlhf]')")
    ctx.inputs["gold"] = {"path": str(g), "sha256": file_sha256(g), "what": GOLD_DESC}
    ctx.inputs["prompts"] = {
        "source": "IMDb openings, prompt part of imdb_split (privalign.data.datasets.imdb_prompts)",
        "train": [0, cfg["train_prompts"]],
        "eval": [cfg["train_prompts"], cfg["train_prompts"] + cfg["eval_prompts"]],
    }
    ctx.inputs["private_pairs"] = {
        "source": "privalign.rlhf.prompts.heldout_imdb_pairs(reserve, pair_max_chars, seed)",
        "file": "RUN/data/pairs.jsonl",
    }


def _data(cfg: dict, ctx: RunContext) -> dict:
    if "data" not in ctx.cache:
        from privalign.estimation.features import HashedNgramFeatures
        from privalign.estimation.preferences import PreferenceData
        from privalign.models.scorers import LinearRewardScorer
        from privalign.rlhf.prompts import heldout_imdb_pairs, imdb_rl_prompts

        ss = np.random.SeedSequence(cfg["seed"], spawn_key=(2**21,))
        s_pairs, s_orient = ss.spawn(2)
        path = ctx.run_dir / "data" / "pairs.jsonl"
        prov = heldout_imdb_pairs(
            path,
            reserve=cfg["reserve"],
            max_chars=cfg["pair_max_chars"],
            seed=int(s_pairs.generate_state(1)[0]),
        )
        from privalign.data.preferences_io import load_jsonl_pairs

        pairs = load_jsonl_pairs(path)
        fmap = HashedNgramFeatures(n_features=cfg["n_features"], ngram_range=(1, cfg["ngram_max"]))
        train = PreferenceData.from_text_pairs(
            pairs.prompts,
            pairs.chosen,
            pairs.rejected,
            fmap,
            prompt_ids=pairs.prompt_ids,
            random_state=np.random.default_rng(s_orient),
        )
        tr_p, tr_info = imdb_rl_prompts(cfg["train_prompts"])
        ev_p, ev_info = imdb_rl_prompts(cfg["eval_prompts"], offset=cfg["train_prompts"])
        ctx.cache["data"] = {
            "pairs_path": path,
            "pairs_prov": prov,
            "train": train,
            "fmap": fmap,
            "train_prompts": tr_p,
            "train_info": tr_info,
            "eval_prompts": ev_p,
            "eval_info": ev_info,
            "gold": LinearRewardScorer.load(_gold_path(cfg)),
        }
    return ctx.cache["data"]


def _base(cfg: dict, ctx: RunContext):
    from privalign.rlhf.train import load_base_model_once

    return load_base_model_once(ctx.cache, num_threads=cfg["num_threads"])


def _cells(cfg: dict, ctx: RunContext) -> list[dict]:
    cells: list[dict[str, Any]] = [
        {"cell": "reference", "policy": "reference", "method": "reference", "epsilon": None}
    ]
    for spec in cfg["policies"]:
        m, e = parse_policy(spec)
        cells.append({"cell": spec, "policy": spec, "method": m, "epsilon": e})
    return cells


def _eval_seed(cfg: dict) -> int:
    return int(np.random.SeedSequence(cfg["seed"], spawn_key=(2**22,)).generate_state(1)[0] >> 1)


def _reference_record(cfg: dict, ctx: RunContext) -> dict:
    for r in read_results(ctx.run_dir):
        if r.get("kind") == "reference":
            return r
    raise ExperimentError(
        "p2-rlhf: the reference cell has no record yet (it runs first)."
    )  # pragma: no cover


def policy_seed(root_seed: int, policy: str) -> np.random.SeedSequence:
    """The seed of one policy's cell, derived from the root seed and the policy's *name* (not its position
    in ``policies``), so a subset of the policies, or the same policies in another order, trains exactly the
    same reward models and policies: two processes can split the list and their per-checkpoint records are
    reused by the full run (same identity)."""
    import hashlib

    key = int.from_bytes(hashlib.sha256(str(policy).encode()).digest()[:4], "big")
    return np.random.SeedSequence(root_seed, spawn_key=(2**23, key))


def _run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    """A cell: the reference policy's samples, or fit reward model → train policy (evaluated at every
    checkpoint) → the policy's record (its last checkpoint, plus the whole gold-vs-KL curve)."""
    if cell["policy"] == "reference":
        return [_reference_cached(cfg, ctx)]
    ss = policy_seed(cfg["seed"], cell["policy"])
    s_fit, s_rl = ss.spawn(2)
    ident = _train_identity(cell, cfg, ss)
    if cfg.get("records_only"):
        recorded = _curve(cell, cfg, ctx, ident)
        if any(r is None for r in recorded):
            return [_pending_record(cell, cfg, recorded)]
    fitted = _fit_reward_model(cell, cfg, ctx, s_fit)
    curve = _train_policy(cell, cfg, ctx, fitted, s_rl, ident)
    return [_policy_record(cell, cfg, ctx, fitted, curve)]


def _pending_record(cell: dict, cfg: dict, curve: list[dict | None]) -> dict:
    """A policy that ``records_only`` could not summarise: which checkpoints have records so far."""
    return {
        "kind": "pending",
        "policy": cell["policy"],
        "method": cell["method"],
        "epsilon": cell["epsilon"],
        "steps_recorded": [s for s, r in zip(_eval_steps(cfg), curve) if r is not None],
        "steps_planned": _eval_steps(cfg),
    }


#: Configuration keys that determine the reference policy's evaluation samples.
_REF_KEYS = (
    "seed",
    "reserve",
    "train_prompts",
    "eval_prompts",
    "reference_samples",
    "max_new_tokens",
    "gold",
)


def _reference_cached(cfg: dict, ctx: RunContext) -> dict:
    """The reference cell, reused from ``RUN/evals/reference.json`` or ``prior_evals`` when its identity
    matches (sampling 16 completions for each eval prompt is the costliest evaluation of a run)."""
    ident = identity({k: cfg.get(k) for k in _REF_KEYS})
    store = _store(cfg, ctx)
    rec = store.get("reference.json", ident)
    if rec is not None:
        rec.pop("identity", None)
        return rec
    if cfg.get("records_only"):
        raise ExperimentError(
            "p2-rlhf: records_only = true but there is no reference record with this configuration's "
            f"identity in {store.root} or prior_evals = {cfg.get('prior_evals')!r}; run without records_only."
        )
    rec = _reference_cell(cfg, ctx)
    store.put("reference.json", rec, ident)
    return rec


def _reference_cell(cfg: dict, ctx: RunContext) -> dict:
    from privalign.rlhf.evaluate import sample_with_logprobs

    d = _data(cfg, ctx)
    model, tok, mid = _base(cfg, ctx)
    P = len(d["eval_prompts"])
    t0 = time.perf_counter()
    s = sample_with_logprobs(
        model,
        tok,
        d["eval_prompts"],
        cfg["reference_samples"],
        max_new_tokens=cfg["max_new_tokens"],
        seed=_eval_seed(cfg),
    )
    gold = d["gold"].score([t for row in s["texts"] for t in row]).reshape(P, -1)
    return {
        "kind": "reference",
        "policy": "reference",
        "method": "reference",
        "epsilon": None,
        "unit": "—",
        "base_model": mid,
        "texts": s["texts"],
        "gold": gold.tolist(),
        "kl": 0.0,
        "kl_se": 0.0,
        "gold_mean": float(gold.mean()),
        "per_prompt_gold": gold.mean(axis=1).tolist(),
        "n_prompts": P,
        "eval_seconds": time.perf_counter() - t0,
        "root_seed": cfg["seed"],
        "eval_prompts_info": d["eval_info"],
        "train_prompts_info": d["train_info"],
        "private_pairs": {**d["pairs_prov"], "n_pairs": int(d["train"].y.shape[0])},
    }


def _fit_reward_model(cell: dict, cfg: dict, ctx: RunContext, s_fit: np.random.SeedSequence) -> dict:
    """Fit the cell's reward model on the private pairs, save it (a release: public facts only) and check
    that the RL/eval prompts are disjoint from its private data."""
    from privalign.estimation.persistence import save_model
    from privalign.estimation.tuning import make_experiment_estimator
    from privalign.rlhf.prompts import check_prompts_disjoint
    from privalign.rlhf.rewards import PrivateReward

    d = _data(cfg, ctx)
    train = d["train"]
    eps = math.inf if cell["epsilon"] is None else cell["epsilon"]
    est = make_experiment_estimator(
        cell["method"],
        epsilon=eps,
        delta=cfg["delta"],
        sparsity=cfg["sparsity"],
        feature_bound=1.0,
        random_state=int(s_fit.generate_state(1)[0] >> 1),
        cfg=cfg,
        n_train=int(train.y.shape[0]),
    )
    est.fit(train.X, train.y)
    name = _policy_name(cell)
    rm_path = save_model(
        est,
        ctx.run_dir / "reward_models" / f"{name}.json",
        feature_config=d["fmap"].get_config(),
        # the model file is a release: public facts only (the exact training accuracy stays in this
        # research run's results, which are not a release: docs/privacy/release.md)
        metadata={
            "data": str(d["pairs_path"]),
            "estimator": type(est).__name__,
            "n_train": int(train.y.shape[0]),
        },
    )
    reward = PrivateReward(rm_path)
    overlap = (
        check_prompts_disjoint([*d["train_prompts"], *d["eval_prompts"]], reward)
        if reward.is_private
        else {"checked": False, "why": "non-private reward model"}
    )
    return {
        "est": est,
        "rm_path": rm_path,
        "reward": reward,
        "overlap": overlap,
        "rm_train_accuracy": float(est.score(train.X, train.y)),
    }


def _policy_name(cell: dict) -> str:
    return str(cell["policy"]).replace("@", "_eps")


#: Configuration keys that change a policy's training or its evaluation (a per-checkpoint record is reused
#: only if they, the cell's seed and the policy agree).
_IDENT_KEYS = (
    "seed", "delta", "step_size", "radius", "alpha", "dpsgd_epochs", "dpsgd_batch", "dpsgd_clip", "dpsgd_lr",
    "sparsity", "n_features", "ngram_max", "reserve", "train_prompts", "eval_prompts", "pair_max_chars",
    "steps", "eval_every", "beta", "learning_rate", "num_generations", "prompts_per_step", "max_new_tokens",
    "lora_rank", "eval_samples", "reference_samples", "gold",
)  # fmt: skip


def _train_identity(cell: dict, cfg: dict, ss: np.random.SeedSequence) -> str:
    return identity(
        {
            "policy": cell["policy"],
            "cell_seed": [str(ss.entropy), [int(k) for k in ss.spawn_key]],
            "config": {k: cfg.get(k) for k in _IDENT_KEYS},
        }
    )


def _eval_steps(cfg: dict) -> list[int]:
    """The GRPO steps at which the policy is checkpointed and evaluated (every ``eval_every``, and the
    last)."""
    return sorted({*range(cfg["eval_every"], cfg["steps"] + 1, cfg["eval_every"]), cfg["steps"]})


def _store(cfg: dict, ctx: RunContext) -> RecordStore:
    """The run's evaluation records (``RUN/evals``), backed by ``prior_evals`` (an earlier session's
    ``RUN/evals``, e.g. the committed ``docs/results/p2-rlhf/evals``)."""
    return ctx.records("evals", prior=cfg.get("prior_evals"))


def _step_key(cell: dict, step: int) -> str:
    return f"{_policy_name(cell)}/step-{step:06d}.json"


def _curve(cell: dict, cfg: dict, ctx: RunContext, ident: str) -> list[dict | None]:
    """This policy's per-checkpoint records with identity ``ident`` (``None`` where a step has none), from
    this run or ``prior_evals`` (copied into this run)."""
    store = _store(cfg, ctx)
    return [store.get(_step_key(cell, s), ident) for s in _eval_steps(cfg)]


def _train_policy(
    cell: dict, cfg: dict, ctx: RunContext, fitted: dict, s_rl: np.random.SeedSequence, ident: str
) -> list[dict]:
    """GRPO on the cell's reward model, evaluated at every checkpoint (:func:`_eval_steps`); each
    evaluation is written to ``RUN/evals/POLICY/step-N.json`` as it is made. Resumable: the trainer
    continues from its newest checkpoint, and a checkpoint already evaluated (a record with this
    identity, here or under ``prior_evals``) is not evaluated again; training is skipped altogether when
    every checkpoint has its record. Returns the records in step order."""
    from privalign.rlhf.train import AlignConfig, align_policy

    curve = _curve(cell, cfg, ctx, ident)
    if all(r is not None for r in curve):
        return [r for r in curve if r is not None]
    model, tok, mid = _base(cfg, ctx)
    acfg = AlignConfig(
        steps=cfg["steps"],
        beta=cfg["beta"],
        learning_rate=cfg["learning_rate"],
        num_generations=cfg["num_generations"],
        prompts_per_step=cfg["prompts_per_step"],
        max_new_tokens=cfg["max_new_tokens"],
        lora_rank=cfg["lora_rank"],
        lora_alpha=2.0 * cfg["lora_rank"],
        seed=int(s_rl.generate_state(1)[0] >> 33),
        save_steps=cfg["eval_every"],
    )
    pol_dir = ctx.run_dir / "policies" / _policy_name(cell)
    d = _data(cfg, ctx)
    align_policy(
        fitted["reward"],
        d["train_prompts"],
        d["train_info"],
        pol_dir,
        acfg,
        base=(model, tok, mid),
        overlap_check=fitted["overlap"],
        save_policy=False,
        progress=ctx.progress if ctx.progress is not None else sys.stderr.isatty(),
        callbacks=[_checkpoint_evaluator(cell, cfg, ctx, fitted, ident)],
    )
    for ckpt in (pol_dir / "checkpoints").glob("checkpoint-*"):  # keep the manifest, drop the optimiser state
        shutil.rmtree(ckpt, ignore_errors=True)
    curve = _curve(cell, cfg, ctx, ident)
    missing = [s for s, r in zip(_eval_steps(cfg), curve) if r is None]
    if missing:  # pragma: no cover - the evaluator writes every step it is called at
        raise ExperimentError(f"p2-rlhf: {cell['policy']}: no evaluation record for steps {missing}.")
    return [r for r in curve if r is not None]


def _checkpoint_evaluator(cell: dict, cfg: dict, ctx: RunContext, fitted: dict, ident: str) -> Any:
    """A transformers ``TrainerCallback`` that evaluates the live policy at each step of
    :func:`_eval_steps` lacking a record (sampling uses its own seeded generators, so the training
    trajectory does not depend on whether a step was evaluated), and prints progress with an ETA."""
    from transformers import TrainerCallback

    steps = set(_eval_steps(cfg))
    store = _store(cfg, ctx)
    ref = _reference_record(cfg, ctx)
    remaining_policies = _policies_after(cell, cfg)

    class _Evaluator(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = self.last = time.perf_counter()
            self.first_step: int | None = None
            self.last_step: int | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            step = int(state.global_step)
            if self.first_step is None:
                self.first_step = self.last_step = step - 1
            if step % 10 == 0 or step in steps:
                _print_progress(cell, cfg, step, self.first_step, self.t0, remaining_policies)
            if step not in steps:
                return
            if store.get(_step_key(cell, step), ident) is not None:
                return
            trained = (time.perf_counter() - self.last, step - int(self.last_step or 0))
            rec = _evaluate_policy(model, cfg, ctx, fitted, ref, step)
            model.train()
            self.last, self.last_step = time.perf_counter(), step
            rec.update(
                train_seconds=trained[0],
                train_seconds_steps=trained[1],
                policy=cell["policy"],
                step=step,
                train=_train_stats(state.log_history, step - cfg["eval_every"], step),
                written_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            )
            store.put(_step_key(cell, step), rec, ident)

    return _Evaluator()


def _policies_after(cell: dict, cfg: dict) -> int:
    pols = list(cfg["policies"])
    return len(pols) - 1 - pols.index(cell["policy"]) if cell["policy"] in pols else 0


def _print_progress(
    cell: dict, cfg: dict, step: int, first: int | None, t0: float, remaining_policies: int
) -> None:
    """One line on stderr: the policy's step, the measured seconds per step (evaluations included) and the
    ETA of the policy and of the whole run (the policies after it at the same pace)."""
    done = step - (first or 0)
    if done <= 0:
        return
    per = (time.perf_counter() - t0) / done
    eta_pol = per * (cfg["steps"] - step)
    eta_run = eta_pol + per * cfg["steps"] * remaining_policies
    bar = "#" * int(20 * step / cfg["steps"])
    print(
        f"p2-rlhf {cell['policy']}: [{bar:<20}] step {step}/{cfg['steps']}, {per:.1f} s/step; ETA policy "
        f"{eta_pol / 60:.0f} min, run {eta_run / 3600:.1f} h ({remaining_policies} policies after this)",
        file=sys.stderr,
        flush=True,
    )


def _train_stats(history: list[dict], lo: int, hi: int) -> dict:
    """Mean training reward / KL (TRL's per-token KL) of the logged steps in (lo, hi]."""
    rows = [h for h in history if "reward" in h and lo < h.get("step", -1) <= hi]
    out: dict[str, Any] = {"steps_logged": len(rows)}
    for k in ("reward", "kl", "entropy", "completions/mean_length"):
        v = [float(h[k]) for h in rows if isinstance(h.get(k), int | float)]
        out[k] = float(np.mean(v)) if v else None
    return out


def _evaluate_policy(policy: Any, cfg: dict, ctx: RunContext, fitted: dict, ref: dict, step: int) -> dict:
    """The policy on the eval prompts: gold reward, KL to the reference, win rate against the reference
    samples (95% paired bootstrap over prompts), and best-of-N from the reference samples by the same
    reward model."""
    from privalign.rlhf.evaluate import (
        best_of_n_gold,
        kl_estimate,
        sample_with_logprobs,
        win_probability,
    )
    from privalign.stats import paired_bootstrap_ci

    d = _data(cfg, ctx)
    model, tok, _ = _base(cfg, ctx)
    boot_rng = np.random.default_rng(np.random.SeedSequence(cfg["seed"], spawn_key=(2**23, step)))
    P = len(d["eval_prompts"])
    t0 = time.perf_counter()
    s = sample_with_logprobs(
        policy,
        tok,
        d["eval_prompts"],
        cfg["eval_samples"],
        max_new_tokens=cfg["max_new_tokens"],
        seed=_eval_seed(cfg),
        reference=model,
    )
    gold = d["gold"].score([t for row in s["texts"] for t in row]).reshape(P, -1)
    kl, kl_se = kl_estimate(s["logp"], s["logp_ref"])
    ref_gold = np.asarray(ref["gold"], float)
    w = win_probability(gold, ref_gold)
    lo, hi, se = paired_bootstrap_ci(w, n_boot=cfg["n_bootstrap"], rng=boot_rng)
    glo, ghi, _ = paired_bootstrap_ci(
        gold.mean(axis=1) - ref_gold.mean(axis=1), n_boot=cfg["n_bootstrap"], rng=boot_rng
    )
    sel = (
        fitted["reward"]
        .score(
            [p for p, row in zip(d["eval_prompts"], ref["texts"]) for _ in row],
            [t for row in ref["texts"] for t in row],
        )
        .reshape(P, -1)
    )
    bon = best_of_n_gold(sel, ref_gold, cfg["bon_ns"])
    return {
        "kl": kl,
        "kl_se": kl_se,
        "gold_mean": float(gold.mean()),
        "per_prompt_gold": gold.mean(axis=1).tolist(),
        "gold_gain": float(gold.mean() - ref_gold.mean()),
        "gold_gain_ci": [glo, ghi],
        "per_prompt_win": w.tolist(),
        "win_rate": float(w.mean()),
        "win_ci": [lo, hi],
        "win_se": se,
        "bon": [{k: v for k, v in b.items() if k != "per_prompt_gold"} for b in bon],
        "n_prompts": P,
        "eval_samples": cfg["eval_samples"],
        "mean_tokens": float(np.mean(s["num_tokens"])),
        "examples": [row[0] for row in s["texts"][:3]],
        "eval_seconds": time.perf_counter() - t0,
    }


def _policy_record(cell: dict, cfg: dict, ctx: RunContext, fitted: dict, curve: list[dict]) -> dict:
    """The results record of a trained policy: its last checkpoint's evaluation, the fit's facts and the
    whole curve (one point per checkpoint)."""
    from privalign.estimation.registry import privacy_text

    last = curve[-1]
    reward = fitted["reward"]
    train_log = [c.get("train") or {} for c in curve]
    return {
        **{k: v for k, v in last.items() if k not in ("identity", "train", "written_at")},
        "kind": "policy",
        "policy": cell["policy"],
        "method": cell["method"],
        "epsilon": cell["epsilon"],
        "unit": privacy_text(cell["method"]),
        "privacy_event": reward.event.to_dict(),
        "reward_model": str(fitted["rm_path"]),
        "reward_model_sha256": reward.sha256,
        "overlap_check": {k: v for k, v in fitted["overlap"].items() if k != "overlapping_indices"},
        "rm_train_accuracy": fitted["rm_train_accuracy"],
        "train_reward_first": train_log[0].get("reward"),
        "train_reward_last": train_log[-1].get("reward"),
        "train_kl_last": train_log[-1].get("kl"),
        "steps": int(last["step"]),
        "curve": [
            {
                "step": c["step"],
                "kl": c["kl"],
                "kl_se": c["kl_se"],
                "gold": c["gold_mean"],
                "gold_gain": c["gold_gain"],
                "gold_gain_ci": c["gold_gain_ci"],
                "win_rate": c["win_rate"],
                "win_ci": c["win_ci"],
                "train_kl_per_token": (c.get("train") or {}).get("kl"),
                "train_reward": (c.get("train") or {}).get("reward"),
                "per_prompt_gold": c["per_prompt_gold"],
            }
            for c in curve
        ],
        "eval_seconds": float(sum(c.get("eval_seconds", 0.0) for c in curve)),
        # wall time of the training steps measured in the sessions that ran them (not of the steps
        # recovered from earlier records' checkpoints re-trained)
        "train_seconds": float(sum(c.get("train_seconds", 0.0) for c in curve)),
        "root_seed": cfg["seed"],
        "n_bootstrap": cfg["n_bootstrap"],
        "kl_budgets": list(cfg["kl_budgets"]),
        "equivalence_margin": cfg["equivalence_margin"],
    }


def _bon_at_kl(bon: list[dict], kl: float) -> float | None:
    """Gold reward of best-of-N linearly interpolated at ``kl`` on the BoN curve (None beyond its largest
    N)."""
    xs = [b["kl"] for b in bon]
    ys = [b["gold"] for b in bon]
    kl = max(kl, 0.0)  # a Monte Carlo KL estimate can fall below 0; the true KL cannot
    if not xs or kl < xs[0] or kl > xs[-1]:
        return None
    return float(np.interp(kl, xs, ys))


def rlhf_verdict(
    records: list[dict], *, n_boot: int | None = None, seed: int | None = None
) -> tuple[str, str]:
    """Claim P2-6 (analogue): sparse private reward models give policies with higher gold reward at no more KL
    than dense ones, at every ε and privacy unit present (pairs :data:`SPARSE_DENSE`).

    Per (pair, ε) the rule of :func:`privalign.rlhf.evaluate.sparse_vs_dense_verdict` with k = the number of
    comparisons (its "does not hold" reads the (1 − 0.05/k) interval: Bonferroni, since the overall verdict
    fires on any one); overall ``does not hold`` if any comparison does not hold, ``holds`` if all hold, else
    ``inconclusive`` (also when no pair is present).
    """
    from privalign.rlhf.evaluate import sparse_vs_dense_verdict

    pol = {(r["method"], r["epsilon"]): r for r in records if r.get("kind") == "policy"}
    if not pol:
        return "inconclusive", "no policy records"
    first = next(iter(pol.values()))
    B = int(n_boot or first.get("n_bootstrap", 2000))
    rng = np.random.default_rng(
        np.random.SeedSequence(
            int(seed if seed is not None else first.get("root_seed", 0)), spawn_key=(2**24,)
        )
    )
    verdicts, parts = [], []
    todo = [
        (a, b, eps)
        for a, b in SPARSE_DENSE
        for eps in sorted({e for (m, e) in pol if m == a and e is not None}, reverse=True)
        if (b, eps) in pol
    ]
    for a, b, eps in todo:  # Bonferroni over the len(todo) comparisons on the "does not hold" branch
        v, msg = sparse_vs_dense_verdict(pol[(a, eps)], pol[(b, eps)], n_boot=B, rng=rng, k=len(todo))
        verdicts.append(v)
        parts.append(f"{a} vs {b} at ε = {eps:g}: {v} ({msg})")
    if not verdicts:
        return "inconclusive", "no (sparse, dense) pair at a common ε among " + ", ".join(
            f"{m}@{e}" for m, e in pol
        )
    steps = first.get("steps")
    from privalign.experiments.verdicts import Outcome, all_of

    v = all_of(verdicts)

    facts = {
        "comparisons": len(verdicts),
        "sparse_better": verdicts.count("holds"),
        "dense_better": verdicts.count("does not hold"),
        "steps": steps,
        "why": "underpowered",
    }
    return Outcome(
        v,
        f"{steps} GRPO steps per policy, {first.get('n_prompts')} eval prompts | " + " | ".join(parts),
        facts,
    )


def _kl_path(rec: dict, ref: dict) -> tuple[np.ndarray, list[np.ndarray], list[Any]]:
    """A policy's path on the gold-vs-KL axes: the reference (KL 0) and then its checkpoints (its last
    point alone when the record carries no per-prompt curve); per point the ``(1, prompts)`` gold."""
    pts = [c for c in rec.get("curve") or [] if c.get("per_prompt_gold") is not None]
    if not pts:
        pts = [{"step": rec.get("steps"), "kl": rec["kl"], "per_prompt_gold": rec["per_prompt_gold"]}]
    kls = np.array([0.0] + [float(c["kl"]) for c in pts])
    mats = [np.asarray(ref["per_prompt_gold"], float)[None, :]] + [
        np.asarray(c["per_prompt_gold"], float)[None, :] for c in pts
    ]
    return kls, mats, [0] + [c["step"] for c in pts]


def rlhf_equal_kl_verdict(
    records: list[dict], *, budgets: list[float] | None = None, margin: float | None = None
):
    """Claim P2-6 (GRPO arm) at equal KL: at each KL budget the sparse method's policy reaches more gold
    reward than the dense method's at the same ε (pairs :data:`SPARSE_DENSE`).

    A policy's path is the reference (KL 0) followed by its checkpoints; its gold at KL ≤ b is the best
    point of the path within b, a segment that crosses b counting as the mixture of its end policies that
    spends b (:func:`privalign.stats.best_on_path`). A budget is compared when at least one
    of the two paths reaches it (otherwise it repeats a smaller one). Per (pair, ε, budget), the difference
    sparse − dense with a paired percentile bootstrap over the evaluation prompts (one RL seed per policy:
    the interval holds the prompts' variance, not the RL seed's; the KL estimates are taken as given):

    * ``holds``: its 95% interval is above 0;
    * ``does not hold``: its Bonferroni (1 − 0.05/k) interval, k = the number of comparisons, is below 0
      or inside ± ``margin`` (a tie shown);
    * ``inconclusive`` otherwise.

    Overall: ``does not hold`` if any comparison does not hold (family-wise α = 0.05 through the
    Bonferroni level), ``holds`` if every one holds (an intersection-union test: each at 0.05), else
    ``inconclusive`` (also with no comparison). States the difference detectable at ≈ 80% power.
    """
    from scipy import stats

    from privalign.experiments.verdicts import Outcome, all_of
    from privalign.stats import best_on_path, bootstrap_diff, interval, stream, within

    ref = next((r for r in records if r.get("kind") == "reference"), None)
    pol = {(r["method"], r["epsilon"]): r for r in records if r.get("kind") == "policy"}
    if ref is None or not pol:
        return Outcome("inconclusive", "no reference or policy records", {"comparisons": []})
    first = next(iter(pol.values()))
    budgets = [float(b) for b in (budgets or first.get("kl_budgets") or [0.5, 1.0, 2.0])]
    margin = float(margin if margin is not None else first.get("equivalence_margin", 0.02))
    B = int(first.get("n_bootstrap", 2000))
    todo = []
    for i, (a, b) in enumerate(SPARSE_DENSE):
        for eps in sorted({e for (m, e) in pol if m == a and e is not None}, reverse=True):
            if (b, eps) not in pol:
                continue
            pa, pb = _kl_path(pol[(a, eps)], ref), _kl_path(pol[(b, eps)], ref)
            reach = max(float(pa[0].max()), float(pb[0].max()))
            todo += [(i, a, b, eps, bud, pa, pb) for bud in budgets if bud <= reach]
    k = len(todo)
    comps = []
    for i, a, b, eps, bud, pa, pb in todo:
        got_a, got_b = best_on_path(*pa, bud), best_on_path(*pb, bud)
        assert got_a is not None and got_b is not None  # every path starts at the reference, KL 0
        (Wa, wa), (Wb, wb) = got_a, got_b
        rng = stream(int(first.get("root_seed", 0)), 2**24, 1, i, int(eps * 1000), int(bud * 1000))
        d = bootstrap_diff(rng, Wa, Wb, B)
        lo, hi = interval(d)
        lo_k, hi_k = interval(d, k=k)
        v = (
            "holds"
            if lo > 0
            else ("does not hold" if hi_k < 0 or within(lo_k, hi_k, margin) else "inconclusive")
        )
        comps.append(
            {
                "sparse": a,
                "dense": b,
                "epsilon": eps,
                "budget": bud,
                "sparse_gold": float(Wa.mean()),
                "dense_gold": float(Wb.mean()),
                "sparse_at": wa,
                "dense_at": wb,
                "diff": float(Wa.mean() - Wb.mean()),
                "ci": [lo, hi],
                "ci_bonferroni": [lo_k, hi_k],
                "se": float(d.std(ddof=1)),
                "prompts": int(Wa.shape[1]),
                "verdict": v,
            }
        )
    if not comps:
        return Outcome(
            "inconclusive",
            "no (sparse, dense) pair at a common ε with a path reaching a KL budget",
            {"comparisons": [], "budgets": budgets},
        )
    vs = [c["verdict"] for c in comps]
    v = all_of(vs)
    mdd = (float(stats.norm.ppf(0.975)) + float(stats.norm.ppf(0.8))) * max(c["se"] for c in comps)
    parts = [
        f"{c['sparse']} vs {c['dense']} at ε = {c['epsilon']:g}, KL ≤ {c['budget']:g}: "
        f"{c['sparse_gold']:.3f} vs {c['dense_gold']:.3f}, {c['diff']:+.4f} [95% CI {c['ci'][0]:+.4f}, "
        f"{c['ci'][1]:+.4f}; Bonferroni over {k} {c['ci_bonferroni'][0]:+.4f}, "
        f"{c['ci_bonferroni'][1]:+.4f}]: {c['verdict']}"
        for c in comps
    ]
    msg = (
        "at equal KL (each policy's best point on its path at KL ≤ budget; 1 RL seed, "
        f"{comps[0]['prompts']} prompts): "
        + " | ".join(parts)
        + f"; detectable difference at ≈80% power: {mdd:.4f}; tie margin ± {margin:g}"
    )
    return Outcome(v, msg, {"comparisons": comps, "budgets": budgets, "margin": margin, "mdd": mdd})


def _summarize(records: list[dict], cfg: dict) -> dict:
    ref = next((r for r in records if r.get("kind") == "reference"), None)
    table = []
    for r in records:
        if r.get("kind") != "policy":
            continue
        table.append(
            {
                "policy": r["policy"],
                "method": r["method"],
                "epsilon": r["epsilon"],
                "unit": r["unit"],
                "kl": r["kl"],
                "kl_se": r["kl_se"],
                "gold": r["gold_mean"],
                "gold_gain": r["gold_gain"],
                "gold_gain_ci": r["gold_gain_ci"],
                "win_rate": r["win_rate"],
                "win_ci": r["win_ci"],
                "bon_gold_at_equal_kl": _bon_at_kl(r["bon"], r["kl"]),
                "bon": [
                    {"n": b["n"], "kl": b["kl"], "gold": b["gold"], "win_rate": b["win_rate"]}
                    for b in r["bon"]
                ],
                "train_reward": [r["train_reward_first"], r["train_reward_last"]],
                "steps": r["steps"],
                "curve": [{k: v for k, v in c.items() if k != "per_prompt_gold"} for c in r.get("curve", [])],
                "train_seconds": r["train_seconds"],
                "rm_train_accuracy": r["rm_train_accuracy"],
            }
        )
    v, m = rlhf_verdict(records)
    eq = rlhf_equal_kl_verdict(records)
    underpowered = cfg["steps"] < 50 or cfg["eval_prompts"] < 32
    pending = [
        {k: r[k] for k in ("policy", "steps_recorded", "steps_planned")}
        for r in records
        if r.get("kind") == "pending"
    ]
    if pending:
        m += " | not yet trained (no complete record): " + ", ".join(
            f"{p['policy']} ({len(p['steps_recorded'])}/{len(p['steps_planned'])} checkpoints)"
            for p in pending
        )
    return {
        "table": table,
        "pending": pending,
        "reference_gold": ref["gold_mean"] if ref else None,
        "verdict": v,
        "measured": m
        + (" | quick/underpowered configuration: few RL steps and few prompts" if underpowered else ""),
        "equal_kl": {"verdict": eq[0], "measured": eq[1], "comparisons": eq.facts["comparisons"]},
        "gold": GOLD_DESC,
        "private_pairs": ref.get("private_pairs") if ref else None,
        "note": (
            "win rate = P(policy sample beats a reference sample by gold reward), ties ½, 95% paired "
            "bootstrap over prompts; KL = Monte Carlo estimate of KL(policy ‖ reference) in nats; best-of-N "
            "KL = log N − (N−1)/N (an upper bound); each policy inherits its reward model's (ε, δ) and "
            "privacy unit (post-processing)"
        ),
    }


def _plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import STYLE, new_figure, save_figure

    recs = read_results(run_dir)
    pols = [r for r in recs if r.get("kind") == "policy"]
    ref = next((r for r in recs if r.get("kind") == "reference"), None)
    if not pols or ref is None:
        return []
    fig, (ax, ax2) = new_figure(2, 1, width=6.0, height=4.6)
    colors: dict[str, str] = {}
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for r in pols:
        colors.setdefault(
            r["method"], STYLE.get(r["method"], {}).get("color", palette[len(colors) % len(palette)])
        )
    for r in pols:
        c = colors[r["method"]]
        lab = f"{r['method']}" + (f" ε={r['epsilon']:g}" if r["epsilon"] is not None else " (non-private)")
        ls = "--" if (r["epsilon"] or math.inf) >= 8 else ":"
        ax.plot(
            [b["kl"] for b in r["bon"]], [b["gold"] for b in r["bon"]], ls, color=c, alpha=0.7, linewidth=1
        )
        pts = r.get("curve") or []
        if len(pts) > 1:  # the policy's path along training: reference → checkpoints
            ax.plot(
                [0.0] + [p["kl"] for p in pts],
                [ref["gold_mean"]] + [p["gold"] for p in pts],
                "-",
                color=c,
                alpha=0.9,
                linewidth=1,
                marker=".",
            )
        ci = r["gold_gain_ci"]
        ax.errorbar(
            [r["kl"]],
            [r["gold_mean"]],
            xerr=[[2 * r["kl_se"]], [2 * r["kl_se"]]],
            yerr=[[r["gold_gain"] - ci[0]], [ci[1] - r["gold_gain"]]],
            fmt="o" if r["epsilon"] is None or r["epsilon"] >= 8 else "s",
            color=c,
            capsize=2,
            label=f"RL: {lab}",
        )
    ax.plot([0], [ref["gold_mean"]], "k*", markersize=10, label="reference policy")
    ax.set_xlabel("KL(policy ‖ reference) [nats]  (BoN: log N − (N−1)/N)")
    ax.set_ylabel("gold reward (MiniLM P(positive))")
    ax.set_title(
        f"RL (solid: checkpoints; bars at the last: 95% paired CI of the gold gain, ±2 SE of KL)\n"
        f"vs best-of-N from the reference (dashed/dotted), "
        f"{ref['n_prompts']} held-out IMDb prompts",
        fontsize=8,
    )
    ax.legend(fontsize=6, loc="best")
    names = [r["policy"] for r in pols]
    ax2.bar(
        range(len(pols)),
        [r["win_rate"] for r in pols],
        color=[colors[r["method"]] for r in pols],
        alpha=0.8,
        yerr=[[r["win_rate"] - r["win_ci"][0] for r in pols], [r["win_ci"][1] - r["win_rate"] for r in pols]],
        capsize=3,
    )
    ax2.axhline(0.5, color="k", linestyle="--", linewidth=0.9)
    ax2.set_xticks(range(len(pols)), names, fontsize=7, rotation=30)
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("win rate vs reference (gold), 95% paired bootstrap")
    ax2.set_title(f"{pols[0]['steps']} GRPO steps per policy", fontsize=9)
    fig.tight_layout()
    return [save_figure(fig, run_dir, "rlhf_gold_vs_kl")]


EXPERIMENTS: dict[str, Experiment] = {
    "p2-rlhf": Experiment(
        "p2-rlhf",
        "Private RLHF: GRPO policies on private reward models — gold reward vs KL, win rates, "
        "best-of-N at equal KL (IMDb, SmolLM2-135M)",
        "paper2",
        _schema,
        _preflight,
        _cells,
        _run_cell,
        _summarize,
        _plot,
    ),
}
