"""Evaluating aligned policies: samples with log-probabilities, KL(policy ‖ reference), gold reward, win rates
against the reference policy with paired bootstrap intervals, and best-of-N at equal KL.

* :func:`sample_with_logprobs`: ``n`` samples per prompt from a causal LM by plain ancestral sampling
  (temperature 1, no truncation; candidate ``j`` of prompt ``i`` has its own ``torch.Generator`` seeded by
  :func:`privalign.models.generators.candidate_seed`), with the summed log-probability of each sampled token
  sequence (EOS included) under the policy (read off the logits each token was drawn from) and, optionally,
  under a reference model (one forward pass, completion positions only). Rows of all prompts are sampled
  together (``batch_rows`` per ``generate``): a CPU reads the weights once per token for the whole batch.
* KL: ``KL(π ‖ π_ref) = E_{y∼π}[log π(y|x) − log π_ref(y|x)]``, estimated by the sample mean over prompts and
  samples (unbiased for the sequence-level KL of the length-capped sampler), with its standard error.
* Best-of-N from the reference: ``KL ≤ log N − (N − 1)/N`` (the usual analytic value, an upper bound on the
  true KL; Beirami et al. 2024), so RL and BoN can be drawn on one gold-reward-vs-KL axis.
* Win rate vs the reference policy: per prompt, the probability that a policy sample's gold reward beats a
  reference sample's (ties ½), averaged over prompts; a 95% percentile bootstrap over prompts (paired: the
  same resampled prompts for both policies; :func:`privalign.stats.paired_bootstrap_ci`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from privalign._validation import check_int
from privalign.stats import paired_bootstrap_ci

__all__ = [
    "sample_with_logprobs",
    "kl_estimate",
    "bon_kl",
    "win_probability",
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
    batch_rows: int = 128,
    reference_rows: int = 16,
) -> dict[str, Any]:
    """``n`` samples per prompt with their log-probabilities (see the module docstring).

    The ``len(prompts) × n`` rows are sampled ``batch_rows`` at a time (prompts left-padded, one
    ``generate`` call per batch; row ``(i, j)`` draws only from its own generator, so its tokens do not depend
    on the batching, up to floating-point rounding of the logits). The policy's log-probability of each
    sampled token is read off the logits the sampler drew it from (no second forward pass); the reference's
    comes from one forward pass per ``reference_rows`` rows, scoring only the completion positions.

    Args:
      batch_rows: rows per ``generate`` call (≥ 1); larger is faster on a CPU (one pass over the weights
        serves more rows) and holds ``batch_rows × vocabulary`` floats per step.
      reference_rows: rows per reference forward pass (≥ 1); holds ``reference_rows × (max_new_tokens + 1)
        × vocabulary`` floats of logits.

    Returns:
      ``{"texts": P×n list, "logp": (P, n), "logp_ref": (P, n) or None, "num_tokens": (P, n)}``.
    """
    import torch
    from transformers import LogitsProcessorList

    from privalign.models.generators.base import SamplingParams, candidate_seed

    n = check_int(n, "n", low=1)
    batch_rows = check_int(batch_rows, "batch_rows", low=1)
    reference_rows = check_int(reference_rows, "reference_rows", low=1)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, top_k=0, top_p=1.0)
    eos = model.generation_config.eos_token_id or tokenizer.eos_token_id
    eos_set = {eos} if isinstance(eos, int) else set(eos)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_set))
    P = len(prompts)
    texts: list[list[str]] = [[""] * n for _ in range(P)]
    lp, lpr, ntok = np.zeros((P, n)), np.zeros((P, n)), np.zeros((P, n), int)
    model.eval()
    if reference is not None:
        reference.eval()
    ids = [list(tokenizer(p)["input_ids"]) for p in prompts]
    rows = [(i, j) for i in range(P) for j in range(n)]
    for b0 in range(0, len(rows), batch_rows):
        chunk = rows[b0 : b0 + batch_rows]
        L = max(len(ids[i]) for i, _ in chunk)
        inp = torch.full((len(chunk), L), pad, dtype=torch.long)
        pmask = torch.zeros((len(chunk), L), dtype=torch.long)
        for r, (i, _) in enumerate(chunk):  # left padding, as generate expects for a decoder-only model
            inp[r, L - len(ids[i]) :] = torch.tensor(ids[i], dtype=torch.long)
            pmask[r, L - len(ids[i]) :] = 1
        sampler = _ScoredRowSampler(
            torch, [torch.Generator().manual_seed(candidate_seed(seed, i, j)) for i, j in chunk], params
        )
        with torch.inference_mode():
            out = model.generate(
                input_ids=inp,
                attention_mask=pmask,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                num_beams=1,
                pad_token_id=pad,
                eos_token_id=list(eos_set),
                logits_processor=LogitsProcessorList([sampler]),
            )
            new = out[:, L:]
            mask = torch.ones_like(new, dtype=torch.bool)
            for r, (i, j) in enumerate(chunk):
                toks = new[r].tolist()
                k = next((t for t, v in enumerate(toks) if v in eos_set), None)
                if k is not None:
                    mask[r, k + 1 :] = False  # the EOS itself was sampled: it counts
                ntok[i, j] = len(toks) if k is None else k
                texts[i][j] = tokenizer.decode(toks[: ntok[i, j]], skip_special_tokens=True)
            step_logp = torch.stack(sampler.logps[: new.shape[1]], dim=1)  # (rows, new tokens)
            pol = (step_logp * mask).sum(dim=1).numpy()
            ref = None
            if reference is not None:
                ref = _completion_logp(
                    torch, reference, out, torch.cat([pmask, mask.long()], 1), new, mask, reference_rows
                )
            for r, (i, j) in enumerate(chunk):
                lp[i, j] = pol[r]
                if ref is not None:
                    lpr[i, j] = ref[r]
    return {
        "texts": texts,
        "logp": lp,
        "logp_ref": lpr if reference is not None else None,
        "num_tokens": ntok,
    }


class _ScoredRowSampler:
    """:class:`~privalign.models.generators.base._RowSampler` (one generator per row, the same draws), which
    also keeps each step's ``log softmax(scores)`` at the sampled tokens: the sampled sequence's
    log-probability under the distribution it was drawn from (temperature 1, no truncation)."""

    def __init__(self, torch: Any, generators: list[Any], params: Any) -> None:
        from privalign.models.generators.base import _RowSampler

        self.torch = torch
        self.sampler = _RowSampler(torch, generators, params)
        self.logps: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        out = self.sampler(input_ids, scores)
        chosen = out.argmax(dim=-1, keepdim=True)  # the one finite (0) entry of each row
        logits = scores.float()
        self.logps.append(
            (logits.gather(-1, chosen) - self.torch.logsumexp(logits, dim=-1, keepdim=True))[:, 0]
        )
        return out


def _completion_logp(torch: Any, model: Any, seq: Any, attn: Any, new: Any, mask: Any, rows: int) -> Any:
    """Summed log-probability under ``model`` of the completion tokens ``new`` (the last ``new.shape[1]``
    columns of ``seq``; left-padded prompts, ``attn`` masks padding and tokens after EOS), ``rows`` rows per
    forward pass; logits only at the completion positions."""
    K = new.shape[1]
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)  # positions count from each row's first real token
    out = []
    for s in range(0, seq.shape[0], rows):
        logits = (
            model(
                input_ids=seq[s : s + rows],
                attention_mask=attn[s : s + rows],
                position_ids=pos[s : s + rows],
                logits_to_keep=K + 1,
            )
            .logits[:, :-1]
            .float()
        )
        tok = new[s : s + rows, :, None]
        logp = (logits.gather(-1, tok) - torch.logsumexp(logits, dim=-1, keepdim=True))[..., 0]
        out.append((logp * mask[s : s + rows]).sum(dim=1))
    return torch.cat(out).numpy()


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
