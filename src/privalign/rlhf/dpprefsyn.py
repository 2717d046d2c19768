"""DPPrefSyn as a policy trainer (Gao & Yang, "Differentially Private Preference Data Synthesis for Large
Language Model Alignment", ICML 2026, arXiv:2605.30808v1): the private preference model
(:class:`privalign.estimation.dpprefsyn.DPPrefSynModel`: DP-PCA → DP k-means → per-cluster linear
Bradley–Terry by DP-SGD) labels the policy's own completions of PUBLIC prompts, and non-private DPO trains on
those synthetic pairs.

Algorithm (docs/privacy/dpprefsyn.md has the pseudocode and the proof sketch):
  1. φ(prompt, response): the base policy's last hidden state averaged over the response's tokens (the
     response's own representation under the public base model [our choice; the paper embeds with a
     separate public encoder]); each private pair gives x_i = φ(prompt, chosen) − φ(prompt, rejected).
  2. The private stages at (ε, δ), split ε/8 (DP-PCA) + ε/8 (DP k-means) + 3ε/4 (DP-SGD), δ/3 each
     (:data:`privalign.estimation.dpprefsyn.SPLIT`; the public code's ε split).
  3. For each public prompt, ``candidates`` completions sampled from the base policy; a cluster drawn by the
     released weights scores them with its released linear head; the synthetic pair is (highest, lowest)
     [a prompt whose candidates all tie keeps its first two, in order: its DPO gradient is zero when the two
     texts are equal, and the number of synthetic pairs, hence DPO's schedule, stays public].
  4. Non-private DPO (:func:`privalign.rlhf.dpo.train_dpo`, ``privacy="none"``) on the synthetic pairs.

Privacy:
  Unit: one preference pair (prompt, both texts, label) of the private data (sample-DP). Relation:
  replace-one. Guarantee: (ε, δ)-DP by basic composition of the three private stages (ε₁ + ε₂ + ε₃ = ε,
  δ₁ + δ₂ + δ₃ ≤ δ; Dwork & Roth 2014, Thm 3.16). Steps 3-4 read only the released model (components,
  centres, noisy sizes, heads), the public base policy and the public prompts: post-processing. φ is a fixed
  public map applied to one record at a time, so a replaced pair changes one row of x. Event:
  ``ComposedEvent`` of the stages' ``ApproxDPEvent`` guarantees, composed by
  :class:`~privalign.accounting.accountant.ApproxDPAccountant`; the stages' own mechanism events (Gaussian,
  zCDP-composed Gaussian releases, Poisson-sampled Gaussian DP-SGD) are kept beside it (``stage_events``) so
  each share can be re-accounted.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

    from privalign.data.preferences_io import TextPairs

__all__ = ["DPPrefSynSettings", "preference_differences", "response_features", "train_dpprefsyn"]


class _Tokenizer(Protocol):
    eos_token_id: int | None
    pad_token_id: int | None

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Mapping[str, list[int]]: ...


class DPPrefSynSettings:
    """DPPrefSyn's public settings [the public code's defaults in brackets]: ``n_components`` k [20],
    ``n_clusters`` K [5], ``candidates`` per public prompt [the paper samples several responses per prompt],
    ``max_new_tokens`` of each candidate, ``max_length`` of φ's input (prompt + response tokens),
    ``kmeans_iterations``, ``dpsgd_epochs``."""

    def __init__(
        self,
        *,
        n_components: int = 20,
        n_clusters: int = 5,
        candidates: int = 4,
        max_new_tokens: int = 48,
        max_length: int = 128,
        kmeans_iterations: int = 5,
        dpsgd_epochs: float = 4.0,
    ) -> None:
        from privalign._validation import check_int

        self.n_components = check_int(n_components, "n_components", low=1)
        self.n_clusters = check_int(n_clusters, "n_clusters", low=1)
        self.candidates = check_int(candidates, "candidates", low=2)
        self.max_new_tokens = check_int(max_new_tokens, "max_new_tokens", low=1)
        self.max_length = check_int(max_length, "max_length", low=2)
        self.kmeans_iterations = check_int(kmeans_iterations, "kmeans_iterations", low=1)
        self.dpsgd_epochs = float(dpsgd_epochs)


def _encode(tok: _Tokenizer, prompt: str, response: str, max_length: int) -> tuple[list[int], int]:
    """``prompt + response`` token ids (the response keeps at least half of ``max_length``) and where the
    response starts."""

    def enc(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    p_ids, r_ids = enc(prompt), enc(response)
    if not r_ids:  # an empty response: its representation is the EOS/pad token's after the prompt
        r_ids = [tok.eos_token_id if tok.eos_token_id is not None else 0]
    r_ids = r_ids[: max(max_length - len(p_ids), max_length // 2)]
    p_ids = p_ids[max(0, len(p_ids) - (max_length - len(r_ids))) :] if p_ids else []
    return p_ids + r_ids, len(p_ids)


def response_features(
    model: torch.nn.Module,
    tokenizer: _Tokenizer,
    prompts: Sequence[str],
    responses: Sequence[str],
    *,
    max_length: int,
    batch: int = 16,
) -> np.ndarray:
    """φ(prompt, response) per row: the model's last hidden state averaged over the response's tokens
    (``(n, hidden)`` float64). A fixed map of one (prompt, response) at a time (the padding width is the
    public ``max_length``, so a row does not depend on the other rows)."""
    import torch

    if len(prompts) != len(responses):
        raise ValueError("response_features: prompts and responses must be aligned.")
    rows = [_encode(tokenizer, p, r, max_length) for p, r in zip(prompts, responses)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    out: list[np.ndarray] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for b0 in range(0, len(rows), batch):
            chunk = rows[b0 : b0 + batch]
            ids = torch.full((len(chunk), max_length), int(pad), dtype=torch.long)
            attn = torch.zeros((len(chunk), max_length), dtype=torch.long)
            resp = torch.zeros((len(chunk), max_length), dtype=torch.float64)
            for i, (seq, start) in enumerate(chunk):
                ids[i, : len(seq)] = torch.tensor(seq)
                attn[i, : len(seq)] = 1
                resp[i, start : len(seq)] = 1.0
            h = model(input_ids=ids, attention_mask=attn, output_hidden_states=True).hidden_states[-1]
            h = h.double() * resp[:, :, None]
            out.append((h.sum(dim=1) / resp.sum(dim=1, keepdim=True)).numpy())
    model.train(was_training)
    return np.concatenate(out, axis=0) if out else np.zeros((0, 0))


def preference_differences(
    model: torch.nn.Module, tokenizer: _Tokenizer, pairs: TextPairs, *, max_length: int
) -> np.ndarray:
    """x_i = φ(prompt, chosen) − φ(prompt, rejected), one row per private pair (``pairs``: a
    :class:`~privalign.data.preferences_io.TextPairs`)."""
    prompts = list(pairs.prompts)
    ch = response_features(model, tokenizer, prompts, list(pairs.chosen), max_length=max_length)
    rj = response_features(model, tokenizer, prompts, list(pairs.rejected), max_length=max_length)
    return ch - rj


def _statement(
    epsilon: float, delta: float, budgets: list[tuple[float, float]], settings: DPPrefSynSettings
) -> str:
    (e1, d1), (e2, d2), (e3, d3) = budgets
    return (
        f"(ε, δ)-DP with ε={epsilon:.6g}, δ={delta:.3g} (DPPrefSyn, Gao & Yang arXiv:2605.30808v1): DP-PCA "
        f"(ε₁={e1:.6g}, δ₁={d1:.3g}) → DP k-means (ε₂={e2:.6g}, δ₂={d2:.3g}, K={settings.n_clusters}) → "
        f"per-cluster linear Bradley–Terry by DP-SGD (ε₃={e3:.6g}, δ₃={d3:.3g}) on the chosen − rejected "
        "representation differences, composed by basic composition; the released model labels the base "
        f"policy's {settings.candidates} completions of each public prompt and non-private DPO trains on "
        "those synthetic pairs (post-processing). Unit: one preference pair; relation: replace-one."
    )


def train_dpprefsyn(
    pairs: TextPairs,
    public_prompts: Sequence[str],
    config: object,
    *,
    epsilon: float,
    delta: float,
    model: torch.nn.Module,
    tokenizer: _Tokenizer,
    rng: np.random.Generator,
    settings: DPPrefSynSettings | None = None,
    on_step: Callable[[int, object], None] | None = None,
) -> dict[str, object]:
    """DPPrefSyn (module docstring) at (``epsilon``, ``delta``) on the private ``pairs``; ``config`` is a
    non-private :class:`~privalign.rlhf.dpo.DPOConfig` (β, schedule) for the DPO on the synthetic pairs, one
    per public prompt. ``model`` is the base policy (trained in place; its copy before training computes φ
    and samples the candidates).

    Returns ``{"model", "privacy", "steps", "synthetic"}``: ``privacy`` holds public facts only (the event,
    the guarantee, the split, the statement); ``synthetic`` (the synthetic pairs, a function of DP outputs
    and public data) is for inspection.

    Raises:
      ValueError: ``config`` is not a non-private DPOConfig, or no public prompt.
    """
    from privalign.data.preferences_io import TextPairs
    from privalign.estimation.dpprefsyn import DPPrefSynModel
    from privalign.rlhf.dpo import DPOConfig, check_schedule, train_dpo
    from privalign.rlhf.evaluate import sample_with_logprobs

    if not isinstance(config, DPOConfig) or config.privacy != "none":
        raise ValueError(
            "train_dpprefsyn: config must be a DPOConfig with privacy='none' (the synthetic DPO)."
        )
    if not public_prompts:
        raise ValueError("train_dpprefsyn: no public prompts to synthesize pairs on.")
    s = settings or DPPrefSynSettings()
    base = copy.deepcopy(model)
    diffs = preference_differences(base, tokenizer, pairs, max_length=s.max_length)
    k = min(s.n_components, diffs.shape[1])  # the hidden size is public
    dp = DPPrefSynModel(
        epsilon=epsilon,
        delta=delta,
        n_components=k,
        n_clusters=s.n_clusters,
        kmeans_iterations=s.kmeans_iterations,
        dpsgd_epochs=s.dpsgd_epochs,
        random_state=rng,
    ).fit(diffs)
    # ---- post-processing: public prompts, the public base policy and the released model only ----
    prompts = list(public_prompts)
    samples = sample_with_logprobs(
        base, tokenizer, prompts, s.candidates, max_new_tokens=s.max_new_tokens, seed=int(rng.integers(2**31))
    )
    texts: list[list[str]] = samples["texts"]
    feats = [
        response_features(base, tokenizer, [p] * len(row), row, max_length=s.max_length)
        for p, row in zip(prompts, texts)
    ]
    picks = dp.synthesize(feats, rng=rng)
    chosen, rejected = [], []
    for row, pick in zip(texts, picks):
        b, w = pick if pick is not None else (0, 1)  # all candidates tie: the first two, in order
        chosen.append(row[b])
        rejected.append(row[w])
    synthetic = TextPairs(prompts, chosen, rejected, list(range(len(prompts))), "dpprefsyn-synthetic")
    check_schedule(config, len(prompts))
    res = train_dpo(synthetic, config, model=model, tokenizer=tokenizer, rng=rng, on_step=on_step)
    total = dp.guarantee_  # ApproxDPAccountant over the three stages (basic composition)
    budgets = dp.budgets()
    privacy = {
        "privacy_event": dp.privacy_event_.to_dict(),
        "stage_events": [e.to_dict() for e in dp.stage_events_],
        "guarantee": {"epsilon": float(total[0]), "delta": float(total[1])},
        "split": {
            "stages": ["dp_pca", "dp_kmeans", "dp_sgd"],
            "epsilon": [e for e, _ in budgets],
            "delta": [d for _, d in budgets],
        },
        "statement": _statement(float(epsilon), float(delta), budgets, s),
    }
    return {"model": res["model"], "privacy": privacy, "steps": res["steps"], "synthetic": synthetic}
