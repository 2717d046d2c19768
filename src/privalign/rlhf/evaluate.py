"""Evaluating aligned policies: samples with log-probabilities, KL(policy ‖ reference), gold reward, win rates
against the reference policy with paired bootstrap intervals, and best-of-N at equal KL.

* :func:`sample_with_logprobs`: ``n`` samples per prompt from a causal LM by plain ancestral sampling
  (temperature 1, no truncation; candidate ``j`` of prompt ``i`` has its own ``torch.Generator`` seeded by
  :func:`privalign.models.generators.candidate_seed`), with the summed log-probability of each sampled token
  sequence (EOS included) under the policy and, optionally, under a reference model.
* KL: ``KL(π ‖ π_ref) = E_{y∼π}[log π(y|x) − log π_ref(y|x)]``, estimated by the sample mean over prompts and
  samples (unbiased for the sequence-level KL of the length-capped sampler), with its standard error.
* Best-of-N from the reference: ``KL ≤ log N − (N − 1)/N`` (the usual analytic value, an upper bound on the
  true KL; Beirami et al. 2024), so RL and BoN can be drawn on one gold-reward-vs-KL axis.
* Win rate vs the reference policy: per prompt, the probability that a policy sample's gold reward beats a
  reference sample's (ties ½), averaged over prompts; a 95% percentile bootstrap over prompts (paired: the
  same resampled prompts for both policies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from privalign._validation import check_int

__all__ = [
    "sample_with_logprobs",
    "kl_estimate",
    "bon_kl",
    "win_probability",
    "paired_bootstrap_ci",
    "best_of_n_gold",
    "sparse_vs_dense_verdict",
]


def sample_with_logprobs(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    n: int,
    *,
    max_new_tokens: int,
    seed: int,
    reference: Any = None,
    prompt_batch: int = 1,
) -> dict[str, Any]:
    """``n`` samples per prompt with their log-probabilities (see the module docstring).

    ``prompt_batch`` prompts are generated together (left-padded, positions from the attention mask): the
    same per-candidate generators, so the same samples up to floating-point rounding, several times faster
    on a CPU (the weights are read once per token step for all rows). ``1`` (the default) is one prompt at a
    time.

    Returns:
      ``{"texts": P×n list, "logp": (P, n), "logp_ref": (P, n) or None, "num_tokens": (P, n)}``.
    """
    import torch
    from transformers import LogitsProcessorList

    from privalign.models.generators.base import SamplingParams, _RowSampler, candidate_seed

    n = check_int(n, "n", low=1)
    pb = check_int(prompt_batch, "prompt_batch", low=1)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, top_k=0, top_p=1.0)
    eos = model.generation_config.eos_token_id or tokenizer.eos_token_id
    eos_set = {eos} if isinstance(eos, int) else set(eos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_set))
    P = len(prompts)
    texts: list[list[str]] = []
    lp, lpr, ntok = np.zeros((P, n)), np.zeros((P, n)), np.zeros((P, n), int)
    model.eval()
    if reference is not None:
        reference.eval()
    for i0 in range(0, P, pb):
        chunk = list(range(i0, min(P, i0 + pb)))
        gens = [torch.Generator().manual_seed(candidate_seed(seed, i, j)) for i in chunk for j in range(n)]
        ids, am = _left_padded(tokenizer, [prompts[i] for i in chunk for _ in range(n)], pad)
        L = ids.shape[1]
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=am,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                num_beams=1,
                pad_token_id=pad,
                eos_token_id=list(eos_set),
                logits_processor=LogitsProcessorList([_RowSampler(torch, gens, params)]),
            )
            new = out[:, L:]
            mask = torch.ones_like(new, dtype=torch.bool)
            rows_txt = []
            for r in range(new.shape[0]):
                i, j = chunk[r // n], r % n
                row = new[r].tolist()
                k = next((t for t, v in enumerate(row) if v in eos_set), None)
                if k is not None:
                    mask[r, k + 1 :] = False  # the EOS itself was sampled: it counts
                ntok[i, j] = len(row) if k is None else k
                rows_txt.append(tokenizer.decode(row[: ntok[i, j]], skip_special_tokens=True))
            texts += [rows_txt[c * n : (c + 1) * n] for c in range(len(chunk))]
            attn = torch.cat([am, mask.long()], dim=1)
            pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
            for m, dst in ((model, lp), (reference, lpr)):
                if m is None:
                    continue
                kw = {"position_ids": pos} if pb > 1 else {}
                logits = m(input_ids=out, attention_mask=attn, **kw).logits[:, L - 1 : -1].float()
                logp = torch.log_softmax(logits, dim=-1).gather(-1, new[..., None])[..., 0]
                dst[chunk] = (logp * mask).sum(dim=1).numpy().reshape(len(chunk), n)
    return {
        "texts": texts,
        "logp": lp,
        "logp_ref": lpr if reference is not None else None,
        "num_tokens": ntok,
    }


def _left_padded(tokenizer: Any, texts: list[str], pad: int) -> tuple[Any, Any]:
    """Token ids and attention mask of ``texts``, left-padded with ``pad`` (one text: no padding)."""
    import torch

    enc = [list(tokenizer(t)["input_ids"]) for t in texts]
    width = max(len(e) for e in enc)
    ids = torch.full((len(enc), width), int(pad), dtype=torch.long)
    am = torch.zeros((len(enc), width), dtype=torch.long)
    for r, e in enumerate(enc):
        ids[r, width - len(e) :] = torch.tensor(e, dtype=torch.long)
        am[r, width - len(e) :] = 1
    return ids, am


def kl_estimate(logp: np.ndarray, logp_ref: np.ndarray) -> tuple[float, float]:
    """``(mean, standard error)`` of ``log π − log π_ref`` over all samples (prompts × samples)."""
    d = (np.asarray(logp, float) - np.asarray(logp_ref, float)).ravel()
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else 0.0


def bon_kl(n: int) -> float:
    """``log N − (N − 1)/N``: the analytic KL of best-of-N to the base policy (an upper bound)."""
    n = check_int(n, "n", low=1)
    return float(math.log(n) - (n - 1) / n)


def win_probability(gold_a: np.ndarray, gold_b: np.ndarray) -> np.ndarray:
    """Per prompt, P(a sample of A beats a sample of B) by gold reward, ties ½: ``(P, nA)``, ``(P, nB)`` →
    ``(P,)``."""
    a = np.asarray(gold_a, float)[:, :, None]
    b = np.asarray(gold_b, float)[:, None, :]
    return (a > b).mean(axis=(1, 2)) + 0.5 * (a == b).mean(axis=(1, 2))


def paired_bootstrap_ci(
    per_prompt: np.ndarray, *, n_boot: int, rng: np.random.Generator, alpha: float = 0.05
) -> tuple[float, float, float]:
    """``(lo, hi, se)``: the (1 − alpha) percentile bootstrap interval of the mean over prompts (rows
    resampled)."""
    x = np.asarray(per_prompt, float)
    idx = rng.integers(0, x.shape[0], size=(check_int(n_boot, "n_boot", low=10), x.shape[0]))
    boot = x[idx].mean(axis=1)
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi), float(boot.std(ddof=1))


def best_of_n_gold(selector: np.ndarray, gold: np.ndarray, ns: Sequence[int]) -> list[dict[str, float]]:
    """Best-of-N from the reference samples, for each N: the ``M`` samples of every prompt are cut into
    ``⌊M / N⌋`` disjoint blocks of N (in order); each block's pick is the selector's maximum (ties: average
    over the tied candidates). Returns the mean gold reward of the picks, the analytic KL, and the exact
    probability that a pick beats one random candidate of its block
    (:func:`privalign.alignment.win_rate.bon_win_probability`); N = 1 gives the reference policy's mean gold
    reward over all samples and win rate ½."""
    from privalign.alignment.win_rate import bon_win_probability

    selector = np.asarray(selector, float)
    gold = np.asarray(gold, float)
    M = selector.shape[1]
    out = []
    for n in ns:
        n = check_int(n, "ns", low=1, high=M)
        picked, wins = [], []
        for b in range(M // n):
            s, g = selector[:, b * n : (b + 1) * n], gold[:, b * n : (b + 1) * n]
            top = s >= s.max(axis=1, keepdims=True) - 1e-12 * np.maximum(
                1.0, np.abs(s).max(axis=1, keepdims=True)
            )
            picked.append((g * top).sum(1) / top.sum(1))
            wins.append(bon_win_probability(s, g))
        pp = np.mean(picked, axis=0)
        out.append(
            {
                "n": int(n),
                "kl": bon_kl(n),
                "gold": float(pp.mean()),
                "win_rate": float(np.mean(wins)),
                "blocks": M // n,
                "per_prompt_gold": [float(v) for v in pp],
            }
        )
    return out


def sparse_vs_dense_verdict(
    sparse: dict[str, Any], dense: dict[str, Any], *, n_boot: int, rng: np.random.Generator, k: int = 1
) -> tuple[str, str]:
    """Is the sparse method's policy better by gold reward at no more KL than the dense method's?

    Inputs are records with ``per_prompt_gold`` (mean gold of the policy's samples per prompt, same prompts in
    the same order), ``kl`` and ``kl_se``. Rule (α = 0.05, two-sided 95% paired percentile bootstrap over
    prompts of the gold difference sparse − dense; KL tolerance τ = 2·sqrt(se_s² + se_d²)):

    * ``holds``: interval above 0 and ``kl_sparse ≤ kl_dense + τ`` (higher gold reward at no more KL);
    * ``does not hold``: the (1 − 0.05/k) interval below 0 and ``kl_dense ≤ kl_sparse + τ`` (the dense method
      dominates), k = the number of comparisons the caller makes (Bonferroni: the caller's "does not hold"
      fires on any one of them; k = 1 for a single comparison);
    * ``inconclusive`` otherwise (interval covers 0, or the higher-reward policy also moved further from the
      reference). Power is stated as the difference detectable with ≈80% power, 2.8 × bootstrap SE.
    """
    a = np.asarray(sparse["per_prompt_gold"], float)
    b = np.asarray(dense["per_prompt_gold"], float)
    if a.shape != b.shape:
        raise ValueError(f"per_prompt_gold shapes differ: {a.shape} vs {b.shape}")
    state = rng.bit_generator.state
    lo, hi, se = paired_bootstrap_ci(a - b, n_boot=n_boot, rng=rng)
    if k > 1:  # the same bootstrap draws, read at the Bonferroni level
        after = rng.bit_generator.state
        rng.bit_generator.state = state
        _, hi_k, _ = paired_bootstrap_ci(a - b, n_boot=n_boot, rng=rng, alpha=0.05 / k)
        rng.bit_generator.state = after
    else:
        hi_k = hi
    diff = float((a - b).mean())
    tau = 2.0 * math.sqrt(float(sparse.get("kl_se", 0.0)) ** 2 + float(dense.get("kl_se", 0.0)) ** 2)
    ks, kd = float(sparse["kl"]), float(dense["kl"])
    if lo > 0 and ks <= kd + tau:
        v = "holds"
    elif hi_k < 0 and kd <= ks + tau:
        v = "does not hold"
    else:
        v = "inconclusive"
    mde = 2.8 * se
    msg = (
        f"gold(sparse) − gold(dense) = {diff:+.4f} [95% CI {lo:+.4f}, {hi:+.4f}"
        + (
            f"; upper end of the {100 * (1 - 0.05 / k):.2f}% CI (Bonferroni over {k}) {hi_k:+.4f}"
            if k > 1
            else ""
        )
        + f"] over {a.size} prompts; KL "
        f"sparse {ks:.3f} ± {sparse.get('kl_se', 0.0):.3f}, dense {kd:.3f} ± {dense.get('kl_se', 0.0):.3f} "
        f"nats; detectable difference at ≈80% power: {mde:.4f}"
        + (" (underpowered: |diff| < that)" if abs(diff) < mde else "")
    )
    return v, msg
