"""PROPS — PROgressively Private Self-alignment (Teku, Tian, Bhattacharjee, Chakraborty, Bedi & Tandon,
"PROPS: Progressively Private Self-alignment of Large Language Models", arXiv:2508.06783v2, 2025): label-DP
DPO in stages.

Algorithm (as implemented; the details we could not confirm in the paper are marked [our choice]):
  1. Split the private pairs into S ≥ 2 disjoint stages by a public, data-independent permutation.
  2. Randomized response at ε on **every** label, once (ỹ_i = y_i w.p. 1 − ρ, ρ = 1/(1 + e^ε)).
  3. Stage 1: DPO with the debiased (robust) loss for ρ on stage 1's ỹ (:func:`privalign.rlhf.dpo.train_dpo`,
     ``privacy="label"``, whose randomized response *is* step 2 for those labels).
  4. Stage k + 1: the stage-k policy π_k gives each stage-(k+1) pair its preference probability
     p̂_i = σ(β·[(log π_k − log π_base)(chosen) − (log π_k − log π_base)(rejected)]) (the DPO implicit reward);
     the label used is the maximum-a-posteriori label given ỹ_i and the prior p̂_i:
     ŷ_i = 1 iff p̂_i·P(ỹ_i | y = 1) ≥ (1 − p̂_i)·P(ỹ_i | y = 0)  (the paper's "MLE" refinement). Stage k + 1
     continues from π_k with plain DPO on ŷ [our choice: the refined labels' error rate is unknown, so no
     debiasing applies].

Privacy:
  Unit: one pair's label (texts public). Relation: replace-one (one label changed). Guarantee: ε-label-DP.
  Every label is released once through ε-randomized response; everything else (the stage-1 model, the
  relabelling, later stages) is a function of the public texts, the public split and the vector ỹ of
  randomized labels: post-processing. Equivalently, by parallel composition over the disjoint stages, each
  label's only use is its own stage's randomized response. Event: ``RandomizedResponseEvent(ε)`` (the same
  event as label-DP DPO: the stages add no privacy cost).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["props_relabel", "props_stages", "train_props"]


def props_relabel(rr_labels: Any, prior: Any, flip_rate: float) -> np.ndarray:
    """The MAP label given randomized labels ỹ (1: the listed order is the preference) and a prior
    P(y = 1) per pair: ŷ = 1 iff prior·P(ỹ | 1) ≥ (1 − prior)·P(ỹ | 0). A function of ỹ and public values.

    Raises:
      ValueError: mismatched shapes, a prior outside [0, 1] or ρ outside [0, 0.5).
    """
    y = np.asarray(rr_labels).astype(np.int64)
    p = np.asarray(prior, dtype=np.float64)
    rho = float(flip_rate)
    if y.shape != p.shape or not np.all((p >= 0) & (p <= 1)) or not 0.0 <= rho < 0.5:
        raise ValueError("props_relabel: labels and prior must be aligned, prior in [0, 1], ρ in [0, 0.5).")
    like1 = np.where(y == 1, 1.0 - rho, rho)
    like0 = np.where(y == 0, 1.0 - rho, rho)
    return (p * like1 >= (1.0 - p) * like0).astype(np.int64)


def props_stages(n: int, stages: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A public, data-independent split of ``range(n)`` into ``stages`` disjoint index arrays."""
    if stages < 2 or n < stages:
        raise ValueError(f"PROPS needs 2 ≤ stages ≤ n; got stages={stages}, n={n}.")
    return [np.sort(a) for a in np.array_split(rng.permutation(n), stages)]


def _subset(pairs: Any, idx: np.ndarray, flip: np.ndarray | None = None) -> Any:
    from privalign.data.preferences_io import TextPairs

    ch = [pairs.chosen[i] for i in idx]
    rj = [pairs.rejected[i] for i in idx]
    if flip is not None:  # ŷ = 0: the pair is used as (rejected, chosen)
        ch, rj = (
            [r if f else c for c, r, f in zip(ch, rj, flip)],
            [c if f else r for c, r, f in zip(ch, rj, flip)],
        )
    return TextPairs([pairs.prompts[i] for i in idx], ch, rj, [pairs.prompt_ids[i] for i in idx], "props")


def _preference_prob(
    policy: Any, base: Any, tok: Any, pairs: Any, beta: float, max_length: int
) -> np.ndarray:
    """σ(β·(implicit reward of the listed first − second)) under ``policy`` against ``base``."""
    import torch

    from privalign.rlhf.dpo import _encode_pairs, sequence_logprobs

    data = _encode_pairs(tok, pairs, max_length)
    n = data["n"]
    out = []
    with torch.no_grad():
        for m in (policy, base):
            m.eval()
            lp = torch.cat(
                [
                    sequence_logprobs(
                        m, data["ids"][i : i + 16], data["attn"][i : i + 16], data["resp"][i : i + 16]
                    )
                    for i in range(0, 2 * n, 16)
                ]
            )
            out.append(lp.double().numpy())
    r = out[0] - out[1]
    margin = beta * (r[:n] - r[n:])
    return 1.0 / (1.0 + np.exp(-margin))


def train_props(
    pairs: Any,
    config: Any,
    *,
    stages: int,
    model: Any,
    tokenizer: Any,
    rng: np.random.Generator,
    on_step: Callable[[int, Any], None] | None = None,
) -> dict[str, Any]:
    """PROPS (module docstring) with ``config`` a label-DP :class:`~privalign.rlhf.dpo.DPOConfig` (its ε,
    β, schedule per stage). ``on_step(t, policy)`` gets a global step count across stages. Returns
    ``{"model", "privacy", "stages": [{"pairs", "steps", "flips_vs_rr"}...]}``; ``flips_vs_rr`` (how many
    refined labels differ from ỹ) is a statistic of private labels and never goes into a release."""
    from dataclasses import replace

    from privalign.rlhf.dpo import DPOConfig, check_schedule, privatize_preferences, train_dpo

    if not isinstance(config, DPOConfig) or config.privacy != "label":
        raise ValueError("train_props: config must be a DPOConfig with privacy='label'.")
    n = len(pairs.prompts)
    split = props_stages(n, stages, rng)
    base = copy.deepcopy(model)
    offset = 0

    def shifted(t: int, policy: Any) -> None:
        if on_step is not None:
            on_step(offset + t, policy)

    # stage 1: randomized response + robust DPO (train_dpo's label route randomizes these labels)
    res = train_dpo(
        _subset(pairs, split[0]), config, model=model, tokenizer=tokenizer, rng=rng, on_step=shifted
    )
    policy, privacy = res["model"], res["privacy"]
    info = [{"pairs": len(split[0]), "steps": res["steps"]}]
    offset += res["steps"]
    plain = replace(config, privacy="none", epsilon=None, delta=None)
    for idx in split[1:]:
        sub = _subset(pairs, idx)
        rr, rho, _ = privatize_preferences(np.ones(len(idx), dtype=np.int64), config.eps, rng)  # ε-RR, once
        prior = _preference_prob(policy, base, tokenizer, sub, config.beta, config.max_length)
        yhat = props_relabel(rr, prior, rho)
        check_schedule(plain, len(idx))
        res = train_dpo(
            _subset(pairs, idx, flip=(yhat == 0)),
            plain,
            model=policy,
            tokenizer=tokenizer,
            rng=rng,
            on_step=shifted,
        )
        policy = res["model"]
        info.append({"pairs": len(idx), "steps": res["steps"], "flips_vs_rr": int((yhat != rr).sum())})
        offset += res["steps"]
    privacy = {
        **privacy,
        "statement": (
            f"ε-label-DP with ε={config.eps:.6g} (PROPS, {stages} stages): each label randomized once "
            "at ε (flip rate ρ = 1/(1+e^ε)); stage 1 robust DPO on its randomized labels, each later stage "
            "relabels its pairs from its randomized labels and the previous stage's policy "
            "(post-processing). Unit: one preference label; texts public; relation: replace-one."
        ),
    }
    return {"model": policy, "privacy": privacy, "stages": info, "steps": offset}
