"""The reward models of the reward-model routes (best-of-n, GRPO, PrivBoN): one fit per (method, ε, seed),
shared by every route that uses it and cached in the run's cache.

Privacy:
  Each estimator states its own guarantee (linear ``RRIHT``/``DenseRR``: ε-label-DP; ``SampleDPIHT``,
  ``DPSGDLinear``: (ε, δ)-DP per pair; MiniLM ``TRM-label``: ε-label-DP, ``TRM-sample``: (ε, δ)-DP per pair;
  ``MLE``/``IHT``/``TRM-none``: none), under replace-one; the saved model holds public facts only, and the
  eval/GRPO prompts are checked against its private data
  (:func:`privalign.rlhf.prompts.check_prompts_disjoint`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from privalign.experiments.routes.base import Bench

__all__ = [
    "LABEL_DP",
    "LINEAR_NONPRIVATE",
    "LINEAR_PRIVATE",
    "RMS",
    "RM_KEYS",
    "RM_KINDS",
    "TRM",
    "fit_rm",
    "overlap_facts",
    "ref_scores",
    "rm_backbone",
    "rm_key",
]

LINEAR_PRIVATE = ("RRIHT", "DenseRR", "SampleDPIHT", "DPSGDLinear")
LINEAR_NONPRIVATE = ("MLE", "IHT")
TRM = {"TRM-sample": "sample", "TRM-label": "label", "TRM-none": "none"}
LABEL_DP = ("RRIHT", "DenseRR", "TRM-label")
#: every reward model, private or not
RMS = LINEAR_PRIVATE + LINEAR_NONPRIVATE + tuple(TRM)
#: every reward model and its privacy kind (the methods of the best-of-n and GRPO routes)
RM_KINDS = {m: ("label-DP" if m in LABEL_DP else "sample-DP") for m in (*LINEAR_PRIVATE, *TRM)} | {
    m: "non-private" for m in (*LINEAR_NONPRIVATE, "TRM-none")
}

#: the configuration keys of a reward-model fit: in every record identity of the frontier (a common key)
RM_KEYS = (
    "seed", "delta", "step_size", "radius", "alpha", "dpsgd_epochs", "dpsgd_batch", "dpsgd_clip", "dpsgd_lr",
    "sparsity", "n_features", "ngram_max", "trm_epochs", "trm_batch", "trm_lr", "trm_clip",
)  # fmt: skip


def rm_backbone(method: str) -> str:
    """The text encoder of reward model ``method``: all-MiniLM-L6-v2 (fine-tuned) for ``TRM-*``, hashed word
    n-grams for the linear ones (the family of the n-gram gold's features)."""
    from privalign.experiments.routes.labellers import MINILM, NGRAM

    return MINILM if method in TRM else NGRAM


def rm_key(method: str, eps: float | None, k: int) -> str:
    return f"rm:{method}@{eps}:{k}"


def fit_rm(method: str, eps: float | None, k: int, bench: Bench) -> dict[str, Any]:
    """Fit reward model ``method`` at ε (seed index ``k``; the same fit for every route that uses it), save
    it (public facts only), check the eval/GRPO prompts against its private data; cached per run."""
    key = rm_key(method, eps, k)
    if key in bench.cache:
        return bench.cache[key]
    bench.pending(f"reward model {method}@{eps} seed {k} would be fitted")
    from privalign.estimation.persistence import save_model
    from privalign.rlhf.prompts import check_prompts_disjoint
    from privalign.rlhf.rewards import PrivateReward

    cfg = bench.cfg
    d = bench.pairs()
    pairs = d["pairs"]
    ss = bench.seed(f"rm:{method}@{eps}", k)
    s_orient, s_fit = ss.spawn(2)
    n = len(pairs.prompts)
    if method in TRM:
        from privalign.estimation.transformer import DPTransformerRM

        orient = np.random.default_rng(s_orient).random(n) < 0.5  # True: (prompt, rejected, chosen), y = 1
        X = [
            (p, r, c) if o else (p, c, r)
            for p, c, r, o in zip(pairs.prompts, pairs.chosen, pairs.rejected, orient)
        ]
        y = orient.astype(int)
        est: Any = DPTransformerRM(
            privacy=TRM[method],
            epsilon=eps if eps is not None else 1.0,
            delta=cfg["delta"],
            batch_size=cfg["trm_batch"],
            epochs=cfg["trm_epochs"],
            learning_rate=cfg["trm_lr"],
            clip_norm=cfg["trm_clip"],
            random_state=np.random.default_rng(s_fit),
        )
        est.fit(X, y)
        fcfg = est.feature_map().get_config()
    else:
        from privalign.estimation.features import HashedNgramFeatures
        from privalign.estimation.preferences import PreferenceData
        from privalign.estimation.tuning import make_experiment_estimator

        fmap = HashedNgramFeatures(n_features=cfg["n_features"], ngram_range=(1, cfg["ngram_max"]))
        train = PreferenceData.from_text_pairs(
            pairs.prompts,
            pairs.chosen,
            pairs.rejected,
            fmap,
            prompt_ids=pairs.prompt_ids,
            random_state=np.random.default_rng(s_orient),
        )
        est = make_experiment_estimator(
            method,
            epsilon=math.inf if eps is None else eps,
            delta=cfg["delta"],
            sparsity=cfg["sparsity"],
            feature_bound=1.0,
            random_state=int(s_fit.generate_state(1)[0] >> 1),
            cfg={**cfg, "tune": False},
            n_train=n,
        )
        est.fit(train.X, train.y)
        fcfg = fmap.get_config()
    name = f"{method}_eps{eps}_seed{k}".replace("@", "_")
    path = save_model(
        est,
        bench.run_dir / "reward_models" / f"{name}.json",
        feature_config=fcfg,
        metadata={"data": str(d["path"]), "estimator": type(est).__name__, "n_train": n},
    )
    reward = PrivateReward(path)
    overlap = (
        check_prompts_disjoint([*d["eval"], *d["grpo"]], reward)
        if reward.is_private
        else {"checked": False, "why": "non-private reward model (checked by check_frontier_disjoint)"}
    )
    bench.cache[key] = {"reward": reward, "path": path, "overlap": overlap, "event": reward.event.to_dict()}
    return bench.cache[key]


def ref_scores(rm: dict, bench: Bench) -> np.ndarray:
    """The reward model's scores of the reference samples, ``(P, m)``; kept with the cached fit, so the main
    and the second gold of a route score them once."""
    if "ref_scores" not in rm:
        d, ref = bench.pairs(), bench.reference()
        rm["ref_scores"] = (
            rm["reward"]
            .score(
                [p for p, row in zip(d["eval"], ref["texts"]) for _ in row],
                [t for row in ref["texts"] for t in row],
            )
            .reshape(len(ref["texts"]), -1)
        )
        rm["ref_scores"].flags.writeable = False  # shared by the routes of this fit
    return rm["ref_scores"]


def overlap_facts(rm: dict) -> dict[str, Any]:
    """The prompt check's public facts (without the overlapping indices)."""
    return {k: v for k, v in rm["overlap"].items() if k != "overlapping_indices"}
