"""Private DPO: direct preference optimisation of a LoRA policy under label-DP or sample-DP.

Three routes, the same loop (``train_dpo``), the same task and the same ε:

* ``privacy="label"`` — **ε-label-DP.** Randomized response on the preference labels (keep each with
  probability e^ε/(1+e^ε), else swap chosen and rejected; the mechanism of RR-IHT,
  :func:`privalign.estimation.labels.privatize_labels`), then DPO with the *debiased* ("robust") loss for the
  known flip rate ρ = 1/(1+e^ε) (Chowdhury, Kini & Natarajan, "Provably Robust DPO", ICML 2024,
  arXiv:2403.00409, the rDPO loss; equation numbers unverified). TRL's ``DPOTrainer(loss_type="robust",
  label_smoothing=ρ)`` computes the same per-pair loss (checked against trl 1.16.0). Everything after
  randomized response reads the labels only through ỹ, so training is post-processing.
  Unit: one preference label (the texts are public). Relation: replace-one (one label changed).
  Guarantee: ε-DP (pure). Event: ``RandomizedResponseEvent(ε, unit="label")``.
* ``privacy="sample"`` — **(ε, δ)-DP, one comparison.** DP-SGD over the LoRA parameters: Poisson sampling
  with rate q = batch_size/n, per-comparison gradients from Opacus's ``GradSampleModule`` (the two sequences
  of a pair are summed, so the clipped unit is the comparison), clipping to ℓ2 norm C, Gaussian noise of std
  σ·C on the sum, division by the expected batch size, Adam (post-processing). σ is calibrated by privalign's
  PLD accountant under replace-one (:func:`privalign.estimation.baselines.calibrate_dpsgd_noise`, the
  accountant of ``DPSGDLinear``) and cross-checked against Opacus's RDP accountant
  (:func:`opacus_cross_check`).
  Unit: one comparison (prompt, chosen, rejected). Relation: replace-one. Guarantee: (ε, δ)-DP. Event:
  ``SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(σ)), steps, unit="sample")``.
* ``privacy="none"`` — the non-private reference (standard sigmoid DPO loss, shuffled batches).

The reference policy is the base model (the LoRA adapter disabled); its log-probabilities are computed once
before training. Notes: ``docs/privacy/dpo-label.md``, ``docs/privacy/dpo-sample.md``; user guide
``docs/rlhf.md``.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privalign._validation import check_epsilon_range
from privalign.errors import DataFormatError, PrivacyParameterError, UtilityWarning

__all__ = [
    "DPOConfig",
    "DPO_FORMAT",
    "read_dpo_pairs",
    "robust_dpo_loss",
    "privatize_preferences",
    "clip_and_noise",
    "sample_dp_accounting",
    "signal_to_noise_ceiling",
    "opacus_cross_check",
    "train_dpo",
    "dpo_policy",
]

DPO_FORMAT = "privalign.dpo/1"
PRIVACY_ROUTES = ("label", "sample", "none")
#: relative tolerance of the Opacus cross-check (see :func:`opacus_cross_check`)
CROSS_CHECK_RTOL = 0.05


def _fail(flag: str, msg: str) -> PrivacyParameterError:
    return PrivacyParameterError(f"The '{flag}' parameter {msg}")


def _finite_in(x: Any, lo: float, hi: float, *, lo_open: bool = True, hi_open: bool = True) -> bool:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(float(x)):
        return False
    x = float(x)
    return (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)


def _pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


@dataclass(frozen=True)
class DPOConfig:
    """Hyper-parameters of private DPO (all public; every one is recorded in the manifest).

    Args:
      privacy: ``"label"``, ``"sample"`` or ``"none"``.
      epsilon: ε (> 0, finite) for ``label``/``sample``; must be None for ``none``.
      delta: δ in (0, 1) for ``sample`` (default 1e-5; also refused at ≥ 1/n by :func:`train_dpo`); None
        otherwise.
      beta: DPO temperature β (> 0).
      learning_rate: Adam step size (> 0).
      batch_size: pairs per step (expected pairs per step under Poisson sampling).
      epochs: passes over the data; steps = epochs · ⌊n / batch_size⌋.
      max_length: tokens kept per sequence (prompt + response).
      lora_rank: LoRA rank r (α = 2r).
      clip_norm: per-comparison ℓ2 clipping norm C (``sample``).
    """

    privacy: str = "label"
    epsilon: float | None = None
    delta: float | None = None
    beta: float = 0.1
    learning_rate: float = 5e-4
    batch_size: int = 8
    epochs: int = 1
    max_length: int = 64
    lora_rank: int = 8
    clip_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.privacy not in PRIVACY_ROUTES:
            raise _fail("privacy", f"must be one of {list(PRIVACY_ROUTES)}. Got {self.privacy!r}.")
        self._check_budget()
        for name in ("beta", "learning_rate", "clip_norm"):
            if not _finite_in(getattr(self, name), 0.0, math.inf):
                raise _fail(name, f"must be a finite number > 0. Got {getattr(self, name)!r}.")
        for name in ("batch_size", "epochs", "lora_rank"):
            if not _pos_int(getattr(self, name)):
                raise _fail(name, f"must be an integer >= 1. Got {getattr(self, name)!r}.")
        if not (_pos_int(self.max_length) and self.max_length >= 4):
            raise _fail("max_length", f"must be an integer >= 4. Got {self.max_length!r}.")

    def _check_budget(self) -> None:
        if self.privacy == "none":
            if self.epsilon is not None or self.delta is not None:
                raise _fail("epsilon", "must not be given with privacy 'none' (no privacy, no budget).")
            return
        if not _finite_in(self.epsilon, 0.0, math.inf):
            raise _fail("epsilon", f"must be a finite number > 0. Got {self.epsilon!r}.")
        check_epsilon_range(self.epsilon, "epsilon")  # the one ε rule: [EPS_MIN, EPS_MAX], before any work
        if self.privacy == "label" and self.delta is not None:
            raise _fail("delta", "must not be given with privacy 'label' (randomized response is pure ε-DP).")
        if self.privacy == "sample":
            if self.delta is None:
                object.__setattr__(self, "delta", 1e-5)
            if not _finite_in(self.delta, 0.0, 1.0):
                raise _fail("delta", f"must be a number in (0, 1). Got {self.delta!r}.")

    @property
    def eps(self) -> float:
        """ε as a float (label/sample; validated non-None there)."""
        return float(self.epsilon) if self.epsilon is not None else math.inf

    @property
    def dlt(self) -> float:
        """δ as a float (0 where not given)."""
        return float(self.delta) if self.delta is not None else 0.0

    @property
    def flip_rate(self) -> float:
        """ρ = 1/(1 + e^ε) for ``label`` (0 otherwise)."""
        return 1.0 / (1.0 + math.exp(self.eps)) if self.privacy == "label" else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------


def read_dpo_pairs(path: str | Path) -> Any:
    """The pairs of a ``.jsonl`` preference file (``chosen``, ``rejected``, optional ``prompt``).

    Raises:
      FileNotFoundError: no such file.
      DataFormatError: empty file, a one-sided pair (an empty ``chosen`` or ``rejected``), or a pair whose two
        texts are identical (its DPO gradient is zero and it says nothing about a preference); the line is
        named.
    """
    from privalign.data.preferences_io import load_jsonl_pairs

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"The 'data' parameter must be an existing file. Got {str(path)!r}.")
    pairs = load_jsonl_pairs(p)
    for i, (c, r) in enumerate(zip(pairs.chosen, pairs.rejected, strict=True)):
        if not c.strip() or not r.strip():
            side = "chosen" if not c.strip() else "rejected"
            raise DataFormatError(
                f"{p}: pair {i + 1} is one-sided (empty '{side}' text); 'data' is unusable."
            )
        if c.strip() == r.strip():
            raise DataFormatError(
                f"{p}: pair {i + 1} has identical 'chosen' and 'rejected' texts; 'data' is unusable."
            )
    return pairs


def _encode_pairs(tok: Any, pairs: Any, max_length: int) -> dict[str, Any]:
    """Token ids of ``prompt + chosen`` and ``prompt + rejected`` (right padded) and the masks of the response
    tokens (the DPO log-probabilities sum over those only). The response keeps at least half the length."""
    import torch

    def enc(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    eos = tok.eos_token_id
    rows: list[tuple[list[int], int]] = []
    for side in ("chosen", "rejected"):
        for prompt, resp in zip(pairs.prompts, getattr(pairs, side), strict=True):
            p_ids, r_ids = enc(prompt), enc(resp) + ([eos] if eos is not None else [])
            r_ids = r_ids[: max(max_length - len(p_ids), max_length // 2)]
            p_ids = p_ids[max(0, len(p_ids) - (max_length - len(r_ids))) :] if p_ids else []
            if not p_ids:  # the first token has no prediction: start with EOS/BOS as a context token
                p_ids = [eos if eos is not None else 0]
                r_ids = r_ids[: max_length - 1]
            rows.append((p_ids + r_ids, len(p_ids)))
    # a public width: padding to the longest pair would let one pair's length change the shapes (and so the
    # floating-point arithmetic) of every other pair's gradient
    width = max_length
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos or 0)
    ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    resp = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (seq, start) in enumerate(rows):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        resp[i, start : len(seq)] = True
    n = len(pairs.prompts)
    return {"ids": ids, "attn": attn, "resp": resp, "n": n}


def sequence_logprobs(model: Any, ids: Any, attn: Any, resp: Any) -> Any:
    """Σ over response tokens of log π(token | prefix), one value per row."""
    import torch

    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1, :].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (lp * resp[:, 1:].to(lp.dtype)).sum(dim=-1)


# ---------------------------------------------------------------------------------------------------------
# the losses and the mechanisms
# ---------------------------------------------------------------------------------------------------------


def robust_dpo_loss(margin: Any, beta: float, flip_rate: float) -> Any:
    """Per-pair debiased DPO loss for labels flipped independently with known probability ρ = ``flip_rate``.

    With h = (log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l)) (the ``margin``) and
    ℓ(h) = −log σ(βh):  L̂(h) = [(1 − ρ)·ℓ(h) − ρ·ℓ(−h)] / (1 − 2ρ)  (Chowdhury et al. 2024, rDPO), so that
    E over the flip of L̂ equals ℓ on the true label: (1 − ρ)·L̂(h) + ρ·L̂(−h) = ℓ(h). ρ = 0 is plain DPO.

    Raises:
      PrivacyParameterError: ρ outside [0, 0.5) (at 0.5 the labels carry no information).
    """
    import torch.nn.functional as F

    rho = float(flip_rate)
    if not (math.isfinite(rho) and 0.0 <= rho < 0.5):
        raise _fail("flip_rate", f"must be in [0, 0.5). Got {flip_rate!r}.")
    clean = -F.logsigmoid(beta * margin)
    flipped = -F.logsigmoid(-beta * margin)
    return ((1.0 - rho) * clean - rho * flipped) / (1.0 - 2.0 * rho)


def privatize_preferences(
    labels: Any, epsilon: float, rng: np.random.Generator, *, mechanism: Any = None
) -> tuple[np.ndarray, float, Any]:
    """Randomized response on the preference labels (1 = the file's ``chosen`` is preferred).

    Guarantee: ε-label-DP; unit: one preference label; relation: replace-one (one label changed, texts
    public). ``mechanism`` replaces :class:`~privalign.mechanisms.RandomizedResponse` (audits pass a broken
    one); returns ``(ỹ, flip_rate, event)``.
    """
    from privalign.mechanisms.randomized_response import RandomizedResponse

    rr = mechanism if mechanism is not None else RandomizedResponse(epsilon, unit="label")
    y = rr(np.asarray(labels, dtype=np.int64), rng=rng)
    return np.asarray(y, dtype=np.int64), float(rr.flip_probability), rr.event


def clip_and_noise(
    per_sample: Sequence[Any], clip_norm: float, noise_multiplier: float, generator: Any
) -> list[Any]:
    """The Gaussian mechanism of one DP-SGD step: Σ_i clip_C(g_i) + N(0, (σC)² I), per parameter tensor.

    ``per_sample[k]`` has shape ``(m, *param_k.shape)`` (m comparisons, m may be 0 under Poisson sampling);
    the norm of g_i is taken over all tensors together. Replacing one comparison moves the sum by ≤ 2C.
    """
    import torch

    out = []
    if per_sample and per_sample[0].shape[0] > 0:
        flat = torch.cat([g.reshape(g.shape[0], -1) for g in per_sample], dim=1)
        factor = (clip_norm / (flat.norm(dim=1) + 1e-12)).clamp(max=1.0)
        sums = [torch.einsum("i,i...->...", factor, g) for g in per_sample]
    else:
        sums = [torch.zeros(g.shape[1:], dtype=g.dtype) for g in per_sample]
    for s in sums:
        noise = torch.randn(s.shape, generator=generator, dtype=s.dtype) * (noise_multiplier * clip_norm)
        out.append(s + noise)
    return out


def signal_to_noise_ceiling(n_params: int, noise_multiplier: float, batch_size: float, steps: int) -> float:
    """Upper bound on the signal-to-noise ratio of a whole DP-SGD run: ``B·√T / (σ·√d)``.

    Each step adds to the averaged gradient a clipped mean of norm ≤ C and Gaussian noise
    N(0, (σC/B)² I_d), whose norm concentrates at σC√d/B. Over T steps the signal sums to at most T·C (all
    steps aligned) while the noise sums to a Gaussian of norm ≈ σC√(dT)/B, so their ratio is at most
    ``B√T/(σ√d)`` whatever the learning rate (plain SGD view; Adam rescales both alike). This is an
    *isotropic* bound: it takes the noise over all d directions, while a gradient confined to a few directions
    sees only the noise in them (along the signal the ratio is B√T/σ, far larger), so a ceiling below 1 warns
    that the noise is large, not that the policy cannot move; measured: one schedule at 400 pairs did not
    move (docs/privacy/dpo-sample.md). Remedies: more data (a larger batch at the same ε), fewer trainable
    parameters (a smaller LoRA rank) or a larger ε. Uses public quantities only (the sizes, σ from the
    accountant).
    """
    if n_params < 1 or noise_multiplier <= 0 or batch_size <= 0 or steps < 1:
        raise PrivacyParameterError(
            "signal_to_noise_ceiling needs n_params ≥ 1, noise_multiplier > 0, batch_size > 0 and steps ≥ 1. "
            f"Got {n_params}, {noise_multiplier}, {batch_size}, {steps}."
        )
    return float(batch_size * math.sqrt(steps) / (noise_multiplier * math.sqrt(n_params)))


def sample_dp_accounting(epsilon: float, delta: float, n: int, batch_size: int, steps: int) -> dict[str, Any]:
    """Calibrate σ for (ε, δ) under replace-one (PLD) and cross-check with Opacus; the accounting record.

    Raises:
      PrivacyParameterError: the cross-check fails in the unsafe direction (:func:`opacus_cross_check`).
    """
    from privalign.estimation.baselines import calibrate_dpsgd_noise, dpsgd_epsilon

    q = batch_size / n
    sigma = calibrate_dpsgd_noise(epsilon, delta, q, steps)
    eps_pld = dpsgd_epsilon(sigma, q, steps, delta)
    return {
        "noise_multiplier": sigma,
        "sampling_probability": q,
        "steps": steps,
        "epsilon": eps_pld,
        "delta": delta,
        "how": "PLD accountant, replace-one (dp_accounting; calibrate_dpsgd_noise)",
        "cross_check": opacus_cross_check(sigma, q, steps, delta),
    }


def opacus_cross_check(
    noise_multiplier: float, q: float, steps: int, delta: float, *, rtol: float = CROSS_CHECK_RTOL
) -> dict[str, Any]:
    """ε of the same schedule by privalign's RDP accountant and by Opacus's, both under add/remove-one
    (the relation Opacus accounts; the Rényi bound of the sampled Gaussian, Mironov, Talwar & Zhang 2019).

    Both are upper bounds of the same quantity, and Opacus is evaluated at privalign's orders (its own default
    grid stops at α = 63, which at small ε, where the best order is larger, gave a bound ~30× looser and
    refused ε = 0.1 as a "failed cross-check"), so they must agree up to rounding. The unsafe
    direction is Opacus certifying a *larger* ε than privalign: privalign's accounting would then claim more
    privacy than an independent implementation can certify, so the configuration is refused when
    ε_opacus > (1 + rtol)·ε_privalign. Opacus below privalign only means privalign is conservative: recorded,
    not refused.
    """
    from opacus.accountants import RDPAccountant as OpacusRDP

    from privalign.accounting.events import GaussianEvent, PoissonSampledEvent, SelfComposedEvent
    from privalign.accounting.rdp import RDPAccountant

    ev = SelfComposedEvent(
        event=PoissonSampledEvent(
            sampling_probability=q,
            event=GaussianEvent(noise_multiplier=noise_multiplier, relation="add_remove_one"),
            relation="add_remove_one",
        ),
        count=steps,
        relation="add_remove_one",
    )
    ours = RDPAccountant(method="rdp")
    ours.compose(ev)
    absl = logging.getLogger("absl")  # dp_accounting logs each fractional order it drops (only looser)
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        eps_ours = float(ours.get_epsilon(delta))
    finally:
        absl.setLevel(level)
    op = OpacusRDP()
    op.history = [(float(noise_multiplier), float(q), int(steps))]
    with warnings.catch_warnings():  # "Optimal order is the largest alpha ...": a note on its grid, not ours
        warnings.simplefilter("ignore", UserWarning)
        eps_op = float(op.get_epsilon(delta, alphas=[float(a) for a in ours.orders]))
    ok = eps_op <= (1.0 + rtol) * eps_ours
    rec = {
        "relation": "add_remove_one",
        "privalign_rdp_epsilon": eps_ours,
        "opacus_rdp_epsilon": eps_op,
        "rtol": rtol,
        "unsafe_direction": "opacus > privalign",
        "agrees": ok,
    }
    if not ok:
        raise _fail(
            "epsilon",
            f"failed the accounting cross-check: Opacus's RDP accountant gives ε={eps_op:.6g} and "
            f"privalign's ε={eps_ours:.6g} for the same schedule (σ={noise_multiplier:.6g}, q={q:.6g}, "
            f"{steps} steps, δ={delta:.3g}); refusing to train on an accounting that may overstate privacy.",
        )
    return rec


# ---------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------


def _add_lora(model: Any, config: DPOConfig, gen: Any) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model

    from privalign.rlhf.train import LORA_TARGETS

    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=2 * config.lora_rank,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
        task_type="CAUSAL_LM",
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):  # peft's throw-away init draws from the global RNG
        model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if ".lora_A." in name:
                torch.nn.init.kaiming_uniform_(param, a=math.sqrt(5), generator=gen)
    return model


def _batches(config: DPOConfig, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Index sets of the steps: Poisson subsamples (rate b/n) for ``sample``, shuffled full batches else."""
    per_epoch = n // config.batch_size
    steps = config.epochs * per_epoch
    if config.privacy == "sample":
        q = config.batch_size / n
        return [np.flatnonzero(rng.random(n) < q) for _ in range(steps)]
    out: list[np.ndarray] = []
    for _ in range(config.epochs):
        perm = rng.permutation(n)
        out += [perm[k * config.batch_size : (k + 1) * config.batch_size] for k in range(per_epoch)]
    return out


def check_schedule(config: DPOConfig, n: int) -> int:
    """The number of steps; refuses a batch size that leaves no full step and a δ ≥ 1/n (``sample``)."""
    if n < 1:
        raise DataFormatError("The 'data' parameter holds no preference pairs.")
    if config.batch_size > n:
        raise _fail(
            "batch_size",
            f"must be at most the number of pairs ({n}) to make one full step. Got {config.batch_size}.",
        )
    if config.privacy == "sample" and float(config.delta or 0.0) >= 1.0 / n:
        raise _fail("delta", f"must be below 1/n = {1.0 / n:.3g} for {n} pairs. Got {config.delta!r}.")
    return config.epochs * (n // config.batch_size)


def _pair_margins(model: Any, data: dict[str, Any], idx: Any, ref: Any) -> Any:
    """h_i for the pairs ``idx`` (one forward pass over their 2m sequences); chosen/rejected by position."""
    import torch

    n = data["n"]
    rows = torch.cat([torch.as_tensor(idx), torch.as_tensor(idx) + n])
    lp = sequence_logprobs(model, data["ids"][rows], data["attn"][rows], data["resp"][rows]) - ref[rows]
    m = len(idx)
    return lp[:m] - lp[m:]


def _per_pair_grads(params: list[Any], m: int) -> list[Any]:
    """Opacus's per-row gradients (2m rows: chosen, then rejected) summed per pair: one comparison's
    gradient."""
    out = []
    for p in params:
        gs = p.grad_sample
        out.append(gs[:m] + gs[m:])
        p.grad_sample = None
    return out


def train_dpo(
    pairs: Any,
    config: DPOConfig,
    *,
    model: Any,
    tokenizer: Any,
    rng: np.random.Generator,
    progress: Callable[[int, int], None] | None = None,
    accounting: dict[str, Any] | None = None,
    on_step: Callable[[int, Any], None] | None = None,
) -> dict[str, Any]:
    """Train a LoRA policy with (private) DPO on ``pairs``; the model is modified in place.

    ``on_step(t, policy)`` is called after step ``t`` (1-based) with the live LoRA policy (adapter enabled),
    e.g. to evaluate checkpoints along training; it must leave the policy's weights unchanged and draw no
    randomness from ``rng`` or the global RNGs (then the training trajectory does not depend on it). Every
    iterate is a post-processing of the same mechanism's outputs, so evaluating it costs no privacy.

    Returns ``{"model": merged model, "privacy": {...}, "steps": int, "losses": [...],
    "signal_to_noise_ceiling": float | None}``; ``losses`` (the per-step training loss on private data) is
    an exact statistic of the private data and never goes into a release. The ceiling (sample-DP only, from
    public sizes; :func:`signal_to_noise_ceiling`) is below 1 when the noise swamps every step; a
    :class:`~privalign.errors.UtilityWarning` says so before the first step. Randomness comes only from
    ``rng`` (labels, sampling, LoRA init, noise).
    """
    import torch

    if not isinstance(config, DPOConfig):
        raise _fail("config", f"must be a DPOConfig. Got {type(config).__name__}.")
    n = len(pairs.prompts)
    steps = check_schedule(config, n)
    acct = accounting
    if config.privacy == "sample" and (
        acct is None
        or acct.get("steps") != steps
        or acct.get("sampling_probability") != config.batch_size / n
        or acct.get("delta") != config.dlt
    ):  # an accounting computed for another schedule is not used
        acct = sample_dp_accounting(config.eps, config.dlt, n, config.batch_size, steps)
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
    data = _encode_pairs(tokenizer, pairs, config.max_length)
    labels, event = np.ones(n, dtype=np.int64), None
    if config.privacy == "label":
        labels, _, event = privatize_preferences(labels, config.eps, rng)
    swap = torch.as_tensor(labels == 0)  # ỹ = 0: the pair is used as (rejected, chosen)
    for k in ("ids", "attn", "resp"):  # post-processing of ỹ: reorder the rows of swapped pairs
        t = data[k]
        c, r = t[:n].clone(), t[n:].clone()
        c[swap], r[swap] = t[n:][swap], t[:n][swap]
        data[k] = torch.cat([c, r])
    model.train()
    model = _add_lora(model, config, gen)
    with torch.no_grad(), model.disable_adapter():
        ref = torch.cat(
            [
                sequence_logprobs(
                    model, data["ids"][i : i + 16], data["attn"][i : i + 16], data["resp"][i : i + 16]
                )
                for i in range(0, 2 * n, 16)
            ]
        )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=config.learning_rate)
    batches = _batches(config, n, rng)
    losses: list[float] = []
    snr = None
    if config.privacy == "sample":
        assert acct is not None
        d = sum(int(p.numel()) for p in params)
        snr = signal_to_noise_ceiling(d, acct["noise_multiplier"], config.batch_size, steps)
        if snr < 1.0:
            warnings.warn(
                f"sample-DP DPO: the DP-SGD noise is large against the signal (isotropic signal-to-noise "
                f"ceiling B·√T/(σ·√d) = {snr:.3g} < 1 with B = {config.batch_size}, T = {steps}, σ = "
                f"{acct['noise_multiplier']:.3g}, d = {d} LoRA parameters): the policy may not move; more "
                "pairs or a larger batch size, a smaller LoRA rank, or a larger ε raise the ceiling.",
                UtilityWarning,
                stacklevel=2,
            )
    if config.privacy == "sample":
        from opacus import GradSampleModule

        gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)
        with warnings.catch_warnings():  # Opacus's hooks on the frozen embedding input: harmless, noisy
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            for t, idx in enumerate(batches):
                losses.append(_sample_dp_step(gsm, params, opt, data, idx, ref, config, acct, gen))
                if progress is not None:
                    progress(t + 1, steps)
                if on_step is not None:
                    on_step(t + 1, model)
                    model.train()
        gsm.cleanup()  # remove the hooks and the attributes Opacus added to the parameters
    else:
        for t, idx in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            loss = robust_dpo_loss(_pair_margins(model, data, idx, ref), config.beta, config.flip_rate).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(t + 1, steps)
            if on_step is not None:
                on_step(t + 1, model)
                model.train()
    merged = model.merge_and_unload()
    merged.eval()
    return {
        "model": merged,
        "privacy": _privacy(config, event, acct, n),
        "steps": steps,
        "losses": losses,
        "signal_to_noise_ceiling": snr,
    }


def _sample_dp_step(
    gsm: Any,
    params: list[Any],
    opt: Any,
    data: dict,
    idx: np.ndarray,
    ref: Any,
    config: DPOConfig,
    acct: Any,
    gen: Any,
) -> float:
    """One DP-SGD step on the Poisson subsample ``idx`` (possibly empty: then only noise)."""
    import torch

    opt.zero_grad(set_to_none=True)
    loss_val = float("nan")
    if len(idx):
        losses = robust_dpo_loss(_pair_margins(gsm, data, idx, ref), config.beta, 0.0)
        losses.sum().backward()
        per_pair = _per_pair_grads(params, len(idx))
        loss_val = float(losses.detach().mean())
    else:
        per_pair = [torch.zeros((0, *p.shape), dtype=p.dtype) for p in params]
    noisy = clip_and_noise(per_pair, config.clip_norm, acct["noise_multiplier"], gen)
    for p, g in zip(params, noisy, strict=True):
        p.grad = g / config.batch_size  # the expected batch size: a public constant
    opt.step()
    return loss_val


def _privacy(config: DPOConfig, event: Any, acct: dict[str, Any] | None, n: int) -> dict[str, Any]:
    """The release's privacy record (statement, event, guarantee, unit)."""
    from privalign.accounting.events import GaussianEvent, PoissonSampledEvent, SelfComposedEvent

    if config.privacy == "label":
        eps = config.eps
        return {
            "route": "label",
            "statement": (
                f"ε-label-DP with ε={eps:.6g}: randomized response on each preference label (flip rate "
                f"ρ={config.flip_rate:.6g}), then DPO with the debiased loss for ρ, which reads the labels "
                "only through their randomized version (post-processing). Privacy unit: one preference "
                "label; the prompts and response texts are treated as public; relation: replace-one (one "
                "label changed)."
            ),
            "privacy_event": event.to_dict(),
            "guarantee": {"epsilon": eps, "delta": 0.0, "how": "randomized response (pure ε-DP)"},
            "privacy_unit": "label",
            "relation": "replace_one",
            "flip_rate": config.flip_rate,
        }
    if config.privacy == "sample":
        assert acct is not None
        ev = SelfComposedEvent(
            event=PoissonSampledEvent(
                sampling_probability=acct["sampling_probability"],
                event=GaussianEvent(noise_multiplier=acct["noise_multiplier"], unit="sample"),
                unit="sample",
            ),
            count=acct["steps"],
            unit="sample",
        )
        return {
            "route": "sample",
            "statement": (
                f"(ε={acct['epsilon']:.6g}, δ={acct['delta']:.3g})-DP (target ε={config.eps:.6g})"
                ": DP-SGD on the LoRA parameters, Poisson sampling, per-comparison clipping and Gaussian "
                "noise, accounted by the PLD accountant under replace-one and cross-checked against Opacus. "
                "Privacy unit: one comparison (prompt, chosen, rejected); relation: replace-one."
            ),
            "privacy_event": ev.to_dict(),
            "guarantee": {"epsilon": acct["epsilon"], "delta": acct["delta"], "how": acct["how"]},
            "privacy_unit": "sample",
            "relation": "replace_one",
            "accounting": acct,
        }
    return {
        "route": "none",
        "statement": "No privacy guarantee: non-private DPO on the preference pairs.",
        "privacy_event": None,
        "guarantee": None,
        "privacy_unit": "none",
    }


# ---------------------------------------------------------------------------------------------------------
# the output directory
# ---------------------------------------------------------------------------------------------------------


def _check_out(out: Path) -> None:
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise _fail("out", f"must be a new or empty directory. Got {str(out)!r}, which holds files.")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        raise _fail(
            "out",
            f"has a leftover {str(partial)!r} from another run (running or interrupted); delete it first.",
        )


def dpo_policy(
    data: str | Path,
    out_dir: str | Path,
    config: DPOConfig,
    *,
    base_model: str | None = "smollm2",
    base: tuple[Any, Any, str] | None = None,
    rng: np.random.Generator | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Train with :func:`train_dpo` on the pairs of ``data`` and write ``out_dir`` atomically:
    ``manifest.json`` (release: public configuration, the privacy statement and event; no seed, no data hash,
    no training loss) and ``policy/`` (the merged model and its tokenizer, a plain HF directory usable by
    ``build-pool --model`` and ``serve``). Everything is built in ``OUT.partial`` and renamed at the end, so
    a failure leaves no ``OUT``.

    Args:
      rng: the only source of randomness (default: fresh OS entropy; a seed is never recorded).
      base: an already loaded ``(model, tokenizer, model_id)`` (the model is deep-copied).
    """
    import copy

    from privalign.models._resources import require
    from privalign.release import RELEASE_RULE, check_dpo_manifest

    out = Path(out_dir)
    _check_out(out)
    require("peft", purpose="privalign dpo (pip install 'privalign[rlhf]')")
    if config.privacy == "sample":
        require("opacus", purpose="privalign dpo --privacy sample (pip install 'privalign[rlhf]')")
    pairs = read_dpo_pairs(data)
    steps = check_schedule(config, len(pairs.prompts))
    acct = (  # before the model loads: a failed cross-check costs nothing
        sample_dp_accounting(config.eps, config.dlt, len(pairs.prompts), config.batch_size, steps)
        if config.privacy == "sample"
        else None
    )
    if base is None:
        from privalign.rlhf.train import load_base_model

        base = load_base_model(base_model)
        model = base[0]
    else:
        model = copy.deepcopy(base[0])
    tok, model_id = base[1], base[2]
    res = train_dpo(
        pairs,
        config,
        model=model,
        tokenizer=tok,
        rng=rng or np.random.default_rng(),
        progress=progress,
        accounting=acct,
    )
    from privalign.rlhf.train import _versions

    manifest = {
        "format": DPO_FORMAT,
        "status": "complete",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "privacy": res["privacy"],
        "data": {"path": str(data), "n_pairs": len(pairs.prompts)},
        "base_model": model_id,
        "algorithm": (
            "DPO with a LoRA adapter (peft) on the attention and MLP projections; reference = the base model "
            "(adapter disabled), log-probabilities precomputed; "
            + {
                "label": "randomized response on the labels + debiased (robust) DPO loss",
                "sample": "DP-SGD (Opacus per-sample gradients, Poisson sampling, clipping, Gaussian noise)",
                "none": "standard sigmoid DPO loss (non-private)",
            }[config.privacy]
        ),
        "config": config.to_dict(),
        "steps": res["steps"],
        "versions": {**_versions(), "opacus": _opacus_version()},
        "policy_dir": "policy",
        "release": RELEASE_RULE,
    }
    check_dpo_manifest(manifest)
    tmp = out.with_name(out.name + ".partial")
    try:
        tmp.mkdir(parents=True)
        merged = res["model"]
        if hasattr(merged.config, "quantization_config"):
            del merged.config.quantization_config
        merged.save_pretrained(tmp / "policy", safe_serialization=True)
        tok.save_pretrained(tmp / "policy")
        (tmp / "manifest.json").write_text(
            json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8"
        )
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        **manifest,
        "policy_dir": str((out / "policy").resolve()),
        "model": merged,
        "losses": res["losses"],
    }


def _opacus_version() -> str | None:
    from privalign.models._resources import package_version

    return package_version("opacus")
