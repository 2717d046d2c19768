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

**User level** (``privacy_unit="user"``, ``max_pairs_per_user`` = K; issue 39): every pair names its user;
each user keeps the first K of their pairs in file order
(:func:`privalign.estimation.users.bound_contributions`, before anything else), and ε protects one *user*,
all of their pairs together.

* ``label`` at user level — **ε-DP for the user's labels.** Randomized response on each label at ε/K
  (:class:`privalign.mechanisms.UserRandomizedResponse`), the robust loss debiased at ρ = 1/(1+e^{ε/K}); a
  user's ≤ K randomized labels compose to ε (Dwork & Roth 2014, Thm 3.16). Unit: one user (their labels; the
  texts and who gave which pair are public). Relation: replace-one user. Event:
  ``user_level_event(RandomizedResponseEvent(ε/K), K)`` = ``SelfComposedEvent(..., count=K, unit="user")``.
* ``sample`` at user level — **(ε, δ)-DP for the user.** User-level DP-SGD (McMahan, Ramage, Talwar & Zhang,
  "Learning Differentially Private Recurrent Language Models", ICLR 2018, arXiv:1710.06963v3, Algorithm 1
  with the per-user clipping of its flat estimator): Poisson sampling of *users* at q = batch_size/n_users;
  a sampled user's gradient is the sum of the per-pair gradients of their ≤ K pairs, clipped **once** to C;
  Gaussian noise σC on the sum of the users' clipped gradients; division by the expected number of users per
  step. One user is one sampled unit, so the accountant, the calibration and the Opacus cross-check are those
  of the record route with n = n_users (δ must be < 1/n_users). Unit: one user (all of their pairs, texts and
  labels). Relation: replace-one user (any or all of one user's ≤ K pairs replaced, their number too).
  Event: ``SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(σ)), steps, unit="user")``; K is stated
  beside it (``privacy.max_pairs_per_user``). The release states the number of users, never the number of
  pairs kept (it changes with one user's data).

**Optimizer** (``optimizer``): ``adam`` (default), ``adamw`` (decoupled weight decay ``weight_decay``,
``torch.optim.AdamW``; the optimizer Chen, Tang, Liu & Xu, "Improved Algorithms for Differentially Private
Language Model Alignment", arXiv:2505.08849v1, report best for private DPO at ε = 2–5) or ``sgd``. Each reads
the data only through the privatized gradient (sample) or the randomized labels (label): post-processing, the
same ε. Not confirmed: the primary text of arXiv:2505.08849 was not available here; a secondary summary says
its DP-AdamW also subtracts the noise variance from the second moment (the DP-AdamBC correction of Tang,
Shpilevskiy & Lécuyer, arXiv:2312.14334) and scales the step by √((1−β₁^{t+1})/(1−β₂^{t+1})); neither is
implemented (``adamw`` is plain AdamW on the noisy gradient; LIMITATIONS.md).

The reference policy is the base model (the LoRA adapter disabled); its log-probabilities are computed once
before training. Notes: ``docs/privacy/dpo-label.md``, ``docs/privacy/dpo-sample.md``,
``docs/privacy/dpo-user.md``; user guide ``docs/rlhf.md``.
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
from typing import TYPE_CHECKING, Any

import numpy as np

from privalign._validation import check_epsilon_range
from privalign.errors import DataFormatError, PrivacyParameterError, UtilityWarning

if TYPE_CHECKING:
    from privalign.accounting.events import SelfComposedEvent

__all__ = [
    "DPOConfig",
    "DPO_FORMAT",
    "read_dpo_pairs",
    "robust_dpo_loss",
    "privatize_preferences",
    "clip_and_noise",
    "clip_and_noise_by_unit",
    "prepare_units",
    "sample_dp_accounting",
    "signal_to_noise_ceiling",
    "opacus_cross_check",
    "train_dpo",
    "make_optimizer",
    "dpo_policy",
]

DPO_FORMAT = "privalign.dpo/1"
PRIVACY_ROUTES = ("label", "sample", "none")
PRIVACY_UNITS = ("record", "user")
OPTIMIZERS = ("adam", "adamw", "sgd")
#: AdamW's decoupled weight decay when none is given (torch.optim.AdamW's default)
DEFAULT_WEIGHT_DECAY = 0.01
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
      clip_norm: per-comparison ℓ2 clipping norm C (``sample``; per user at user level).
      privacy_unit: ``"record"`` (one label / one comparison) or ``"user"`` (all of one user's pairs; needs
        ``max_pairs_per_user``; ``batch_size`` then counts expected *users* per step under ``sample``).
      max_pairs_per_user: K ≥ 1, only with ``privacy_unit="user"``.
      optimizer: ``"adam"``, ``"adamw"`` or ``"sgd"`` (post-processing: the same ε).
      weight_decay: AdamW's decoupled weight decay λ ≥ 0 (``adamw`` only; default 0.01).
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
    privacy_unit: str = "record"
    max_pairs_per_user: int | None = None
    optimizer: str = "adam"
    weight_decay: float | None = None

    def __post_init__(self) -> None:
        if self.privacy not in PRIVACY_ROUTES:
            raise _fail("privacy", f"must be one of {list(PRIVACY_ROUTES)}. Got {self.privacy!r}.")
        self._check_budget()
        self._check_unit()
        self._check_optimizer()
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

    def _check_unit(self) -> None:
        if self.privacy_unit not in PRIVACY_UNITS:
            raise _fail("privacy_unit", f"must be one of {list(PRIVACY_UNITS)}. Got {self.privacy_unit!r}.")
        k = self.max_pairs_per_user
        if self.privacy_unit == "record":
            if k is not None:
                raise _fail("max_pairs_per_user", f"is used only with privacy unit 'user'. Got {k!r}.")
            return
        if self.privacy == "none":
            raise _fail(
                "privacy_unit",
                "'user' needs a private route (label or sample); privacy 'none' protects no unit.",
            )
        if not _pos_int(k):
            raise _fail("max_pairs_per_user", f"must be an integer >= 1 with privacy unit 'user'. Got {k!r}.")
        if self.privacy == "label":  # ε/K must itself be a valid ε (before any work)
            from privalign.mechanisms.user_level import UserRandomizedResponse

            try:
                _ = UserRandomizedResponse(self.eps, max_contributions=int(k or 1)).per_label
            except PrivacyParameterError as exc:
                raise _fail(
                    "epsilon",
                    f"divided by max_pairs_per_user {k} gives an invalid per-label epsilon ({exc}). "
                    f"Got {self.epsilon!r}.",
                ) from None

    def _check_optimizer(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise _fail("optimizer", f"must be one of {list(OPTIMIZERS)}. Got {self.optimizer!r}.")
        if self.optimizer != "adamw":
            if self.weight_decay is not None:
                raise _fail(
                    "weight_decay",
                    "is AdamW's decoupled weight decay: only with optimizer 'adamw'. "
                    f"Got {self.weight_decay!r}.",
                )
            return
        if self.weight_decay is None:
            object.__setattr__(self, "weight_decay", DEFAULT_WEIGHT_DECAY)
        if not _finite_in(self.weight_decay, 0.0, math.inf, lo_open=False):
            raise _fail("weight_decay", f"must be a finite number >= 0. Got {self.weight_decay!r}.")

    @property
    def user_level(self) -> bool:
        """Whether ε protects one user (``privacy_unit="user"``)."""
        return self.privacy_unit == "user"

    @property
    def per_label_epsilon(self) -> float:
        """The ε of each label's randomized response: ε/K at user level, ε otherwise (label route)."""
        return self.eps / self.max_pairs_per_user if self.user_level and self.max_pairs_per_user else self.eps

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
        """ρ = 1/(1 + e^ε) for ``label`` (1/(1 + e^{ε/K}) at user level; 0 otherwise)."""
        return 1.0 / (1.0 + math.exp(self.per_label_epsilon)) if self.privacy == "label" else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------


def read_dpo_pairs(path: str | Path, *, user_field: str | None = None) -> Any:
    """The pairs of a ``.jsonl`` preference file (``chosen``, ``rejected``, optional ``prompt``; with
    ``user_field``, every line's user in that field, read into ``.users``).

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
    pairs = load_jsonl_pairs(p, user_field=user_field)
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


@dataclass(frozen=True)
class Units:
    """The pairs a run trains on and who owns each: ``pairs`` (after contribution bounding at user level),
    ``owner[i]`` (the sampling unit of pair i: i itself at record level, its user's index at user level),
    ``n_units`` (the size of the population that is sampled or batched: pairs, or users under user-level
    ``sample``) and ``n_users`` (None at record level)."""

    pairs: Any
    owner: np.ndarray
    n_units: int
    n_users: int | None


class _Subset:
    def __init__(self, pairs: Any, keep: np.ndarray, users: list[str]) -> None:
        self.prompts = [pairs.prompts[i] for i in keep]
        self.chosen = [pairs.chosen[i] for i in keep]
        self.rejected = [pairs.rejected[i] for i in keep]
        self.users = [users[i] for i in keep]


def prepare_units(pairs: Any, config: DPOConfig, *, user_field: str = "user") -> Units:
    """Bound each user's contributions (user level) and name each pair's sampling unit.

    At user level every pair must name its user (``pairs.users``; refused otherwise, naming the first pair
    without one: :func:`privalign.estimation.users.check_users`), then each user keeps the first K of their
    pairs in order (:func:`privalign.estimation.users.bound_contributions`), a rule that reads no other user's
    data. Users are numbered by first appearance. At record level nothing changes.

    Raises:
      DataFormatError: a pair without a usable user id (user level).
    """
    n = len(pairs.prompts)
    if not config.user_level:
        return Units(pairs, np.arange(n, dtype=np.int64), n, None)
    from privalign.estimation.users import bound_contributions, check_users

    users = check_users(getattr(pairs, "users", None), "data", user_field)
    keep = bound_contributions(users, int(config.max_pairs_per_user or 1))
    kept = _Subset(pairs, keep, users)
    ids: dict[str, int] = {}
    owner = np.asarray([ids.setdefault(u, len(ids)) for u in kept.users], dtype=np.int64)
    n_users = len(ids)
    return Units(kept, owner, n_users if config.privacy == "sample" else len(keep), n_users)


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


def clip_and_noise_by_unit(
    per_pair: Sequence[Any], owners: Any, clip_norm: float, noise_multiplier: float, generator: Any
) -> list[Any]:
    """One DP-SGD step's Gaussian mechanism with one clipped gradient per *unit*: Σ_u clip_C(Σ_{i∈u} g_i) +
    N(0, (σC)² I).

    ``per_pair[k]`` has shape ``(m, *param_k.shape)``; ``owners`` (m integers) names the unit of each row.
    The rows of a unit are summed first, then each unit's sum is clipped once (:func:`clip_and_noise`).
    At record level every row is its own unit (the sum of one row is that row, exactly); at user level a
    unit is a user, so replacing all of one user's pairs moves the sum by ≤ 2C, whatever K (McMahan et al.
    2018, arXiv:1710.06963v3). Clipping each pair instead would let one user move it by 2KC.
    """
    import torch

    own = np.asarray(owners, dtype=np.int64).reshape(-1)
    m = per_pair[0].shape[0] if per_pair else 0
    if len(own) != m:
        raise _fail("owners", f"must name one unit per gradient row ({m}). Got {len(own)}.")
    if m == 0:
        return clip_and_noise(per_pair, clip_norm, noise_multiplier, generator)
    uniq, inv = np.unique(own, return_inverse=True)
    if len(uniq) == m and np.array_equal(uniq, own):  # one row per unit, in order: nothing to sum
        return clip_and_noise(per_pair, clip_norm, noise_multiplier, generator)
    index = torch.as_tensor(inv.reshape(-1))
    per_unit = [
        torch.zeros((len(uniq), *g.shape[1:]), dtype=g.dtype, device=g.device).index_add_(0, index, g)
        for g in per_pair
    ]
    return clip_and_noise(per_unit, clip_norm, noise_multiplier, generator)


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


def _batches(
    config: DPOConfig, n: int, rng: np.random.Generator, owner: np.ndarray | None = None
) -> list[np.ndarray]:
    """Index sets (of pairs) of the steps: Poisson subsamples of the ``n`` units (rate b/n) for ``sample`` —
    every pair of a sampled unit (``owner``: the unit of each pair; a pair is its own unit by default) —,
    shuffled full batches of pairs else."""
    per_epoch = n // config.batch_size
    steps = config.epochs * per_epoch
    if config.privacy == "sample":
        q = config.batch_size / n
        if owner is None or len(owner) == n and np.array_equal(owner, np.arange(n)):
            return [np.flatnonzero(rng.random(n) < q) for _ in range(steps)]
        return [np.flatnonzero(np.isin(owner, np.flatnonzero(rng.random(n) < q))) for _ in range(steps)]
    out: list[np.ndarray] = []
    for _ in range(config.epochs):
        perm = rng.permutation(n)
        out += [perm[k * config.batch_size : (k + 1) * config.batch_size] for k in range(per_epoch)]
    return out


def check_schedule(config: DPOConfig, n: int) -> int:
    """The number of steps; refuses a batch size that leaves no full step and a δ ≥ 1/n (``sample``).

    ``n`` is the number of units batched or sampled (:attr:`Units.n_units`): pairs, or users under user-level
    ``sample``."""
    what = "users" if config.user_level and config.privacy == "sample" else "pairs"
    if n < 1:
        raise DataFormatError("The 'data' parameter holds no preference pairs.")
    if config.batch_size > n:
        raise _fail(
            "batch_size",
            f"must be at most the number of {what} ({n}) to make one full step. Got {config.batch_size}.",
        )
    if config.privacy == "sample" and float(config.delta or 0.0) >= 1.0 / n:
        raise _fail("delta", f"must be below 1/n = {1.0 / n:.3g} for {n} {what}. Got {config.delta!r}.")
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
    user_field: str = "user",
) -> dict[str, Any]:
    """Train a LoRA policy with (private) DPO on ``pairs``; the model is modified in place.

    At user level (``config.privacy_unit == "user"``) ``pairs.users`` names each pair's user (``user_field``
    is only named in the refusal of a pair without one); contributions are bounded first
    (:func:`prepare_units`).

    ``on_step(t, policy)`` is called after step ``t`` (1-based) with the live LoRA policy (adapter enabled),
    e.g. to evaluate checkpoints along training; it must leave the policy's weights unchanged and draw no
    randomness from ``rng`` or the global RNGs (then the training trajectory does not depend on it). Every
    iterate is a post-processing of the same mechanism's outputs, so evaluating it costs no privacy.

    Returns ``{"model": merged model, "privacy": {...}, "steps": int, "losses": [...],
    "signal_to_noise_ceiling": float | None, "n_pairs": pairs trained on, "n_users": users or None}``
    (``n_pairs`` at user-level sample-DP depends on one user's data: not for a release); ``losses`` (the
    per-step training loss on private data) is
    an exact statistic of the private data and never goes into a release. The ceiling (sample-DP only, from
    public sizes; :func:`signal_to_noise_ceiling`) is below 1 when the noise swamps every step; a
    :class:`~privalign.errors.UtilityWarning` says so before the first step. Randomness comes only from
    ``rng`` (labels, sampling, LoRA init, noise).
    """
    import torch

    if not isinstance(config, DPOConfig):
        raise _fail("config", f"must be a DPOConfig. Got {type(config).__name__}.")
    units = prepare_units(pairs, config, user_field=user_field)  # user level: bounded before anything else
    pairs = units.pairs
    n = len(pairs.prompts)
    steps = check_schedule(config, units.n_units)
    acct = accounting
    if config.privacy == "sample" and (
        acct is None
        or acct.get("steps") != steps
        or acct.get("sampling_probability") != config.batch_size / units.n_units
        or acct.get("delta") != config.dlt
    ):  # an accounting computed for another schedule is not used
        acct = sample_dp_accounting(config.eps, config.dlt, units.n_units, config.batch_size, steps)
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
    data = _encode_pairs(tokenizer, pairs, config.max_length)
    labels, event = np.ones(n, dtype=np.int64), None
    if config.privacy == "label" and config.user_level:  # each label at ε/K: a user's ≤ K labels cost ε
        from privalign.mechanisms.user_level import UserRandomizedResponse

        urr = UserRandomizedResponse(config.eps, max_contributions=int(config.max_pairs_per_user or 1))
        labels, _, event = privatize_preferences(labels, config.eps, rng, mechanism=urr)
    elif config.privacy == "label":
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
    opt = make_optimizer(config, params)
    batches = _batches(config, units.n_units, rng, units.owner)
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
                losses.append(
                    _sample_dp_step(gsm, params, opt, data, idx, ref, config, acct, gen, units.owner[idx])
                )
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
        "n_pairs": n,
        "n_users": units.n_users,
    }


def make_optimizer(config: DPOConfig, params: list[Any]) -> Any:
    """The optimizer of ``config.optimizer`` at ``config.learning_rate``: Adam, AdamW (decoupled weight decay
    ``config.weight_decay``; Loshchilov & Hutter, ICLR 2019, arXiv:1711.05101v3) or plain SGD (no momentum).
    It sees only the privatized gradient (sample) or gradients of the randomized labels' loss (label):
    post-processing, so the choice does not change ε."""
    import torch

    if config.optimizer == "adamw":
        wd = float(config.weight_decay or 0.0)
        return torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=wd)
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.learning_rate)
    return torch.optim.Adam(params, lr=config.learning_rate)


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
    owners: Any = None,
) -> float:
    """One DP-SGD step on the Poisson subsample ``idx`` (possibly empty: then only noise); ``owners`` (the
    unit of each pair of ``idx``; default: each pair its own) groups the per-pair gradients before clipping
    (:func:`clip_and_noise_by_unit`)."""
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
    own = np.asarray(idx if owners is None else owners)
    noisy = clip_and_noise_by_unit(per_pair, own, config.clip_norm, acct["noise_multiplier"], gen)
    for p, g in zip(params, noisy, strict=True):
        p.grad = g / config.batch_size  # the expected batch size (pairs or users): a public constant
    opt.step()
    return loss_val


def _privacy(config: DPOConfig, event: Any, acct: dict[str, Any] | None, n: int) -> dict[str, Any]:
    """The release's privacy record (statement, event, guarantee, unit)."""

    if config.user_level:
        return _user_privacy(config, event, acct)
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
        ev = _dpsgd_event(acct["sampling_probability"], acct["noise_multiplier"], acct["steps"], "sample")
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


def _dpsgd_event(q: float, noise_multiplier: float, steps: int, unit: str) -> SelfComposedEvent:
    """DP-SGD's event: ``steps`` Poisson-sampled (rate q) Gaussian steps; the unit one comparison or one
    user."""
    from privalign.accounting.events import GaussianEvent, PoissonSampledEvent, SelfComposedEvent

    return SelfComposedEvent(
        event=PoissonSampledEvent(
            sampling_probability=q,
            event=GaussianEvent(noise_multiplier=noise_multiplier, unit=unit),
            unit=unit,
        ),
        count=steps,
        unit=unit,
    )


def _user_privacy(config: DPOConfig, event: Any, acct: dict[str, Any] | None) -> dict[str, Any]:
    """The privacy record at user level (unit ``user``, K stated)."""

    k = int(config.max_pairs_per_user or 1)
    if config.privacy == "label":
        return {
            "route": "label",
            "statement": (
                f"ε-DP per user with ε={config.eps:.6g}: each user keeps at most K={k} pairs (the first K "
                "in file order); randomized response on each of their labels at "
                f"ε/K={config.per_label_epsilon:.6g} (flip rate ρ={config.flip_rate:.6g}), so a user's "
                "labels together cost ε; then DPO with the debiased loss for ρ (post-processing). Privacy "
                "unit: one user (all of their labels); the prompts, the response texts and which user gave "
                "which pair are treated as public; relation: replace-one user."
            ),
            "privacy_event": event.to_dict(),
            "guarantee": {"epsilon": config.eps, "delta": 0.0, "how": "randomized response at ε/K, K-fold"},
            "privacy_unit": "user",
            "relation": "replace_one",
            "flip_rate": config.flip_rate,
            "max_pairs_per_user": k,
            "per_label_epsilon": config.per_label_epsilon,
        }
    assert acct is not None
    ev = _dpsgd_event(acct["sampling_probability"], acct["noise_multiplier"], acct["steps"], "user")
    return {
        "route": "sample",
        "statement": (
            f"(ε={acct['epsilon']:.6g}, δ={acct['delta']:.3g})-DP per user (target ε={config.eps:.6g}): "
            f"user-level DP-SGD on the LoRA parameters (McMahan et al. 2018): each user keeps at most K={k} "
            "pairs (the first K in file order); Poisson sampling of users, each sampled user's gradient "
            "summed over their pairs and clipped once, Gaussian noise, accounted by the PLD accountant under "
            "replace-one with one user as the unit and cross-checked against Opacus. Privacy unit: one user "
            "(all of their pairs); relation: replace-one user."
        ),
        "privacy_event": ev.to_dict(),
        "guarantee": {"epsilon": acct["epsilon"], "delta": acct["delta"], "how": acct["how"]},
        "privacy_unit": "user",
        "relation": "replace_one",
        "accounting": acct,
        "max_pairs_per_user": k,
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
    user_field: str = "user",
) -> dict[str, Any]:
    """Train with :func:`train_dpo` on the pairs of ``data`` and write ``out_dir`` atomically:
    ``manifest.json`` (release: public configuration, the privacy statement and event; no seed, no data hash,
    no training loss) and ``policy/`` (the merged model and its tokenizer, a plain HF directory usable by
    ``build-pool --model`` and ``serve``). Everything is built in ``OUT.partial`` and renamed at the end, so
    a failure leaves no ``OUT``.

    Args:
      rng: the only source of randomness (default: fresh OS entropy; a seed is never recorded).
      base: an already loaded ``(model, tokenizer, model_id)`` (the model is deep-copied).
      user_field: the JSONL field naming each pair's user (read only at user level).

    At user level the manifest's ``data`` states the number of users (and, for ``label``, whose pairs are
    public, the number of pairs kept); under user-level ``sample`` the number of pairs is not stated: it
    changes with one user's data.
    """
    import copy

    from privalign.models._resources import require
    from privalign.release import RELEASE_RULE, check_dpo_manifest

    out = Path(out_dir)
    _check_out(out)
    require("peft", purpose="privalign dpo (pip install 'privalign[rlhf]')")
    if config.privacy == "sample":
        require("opacus", purpose="privalign dpo --privacy sample (pip install 'privalign[rlhf]')")
    pairs = read_dpo_pairs(data, user_field=user_field if config.user_level else None)
    units = prepare_units(pairs, config, user_field=user_field)
    steps = check_schedule(config, units.n_units)
    acct = (  # before the model loads: a failed cross-check costs nothing
        sample_dp_accounting(config.eps, config.dlt, units.n_units, config.batch_size, steps)
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
        user_field=user_field,
    )
    from privalign.rlhf.train import _versions

    manifest = {
        "format": DPO_FORMAT,
        "status": "complete",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "privacy": res["privacy"],
        "data": _data_facts(data, config, res),
        "base_model": model_id,
        "algorithm": (
            "DPO with a LoRA adapter (peft) on the attention and MLP projections; reference = the base model "
            "(adapter disabled), log-probabilities precomputed; "
            + {
                "label": "randomized response on the labels + debiased (robust) DPO loss",
                "sample": "DP-SGD (Opacus per-sample gradients, Poisson sampling, clipping, Gaussian noise)",
                "none": "standard sigmoid DPO loss (non-private)",
            }[config.privacy]
            + (
                {
                    "label": "; user level: at most K pairs per user, each label at ε/K",
                    "sample": "; user level: at most K pairs per user, Poisson sampling of users, each "
                    "user's gradient summed over their pairs and clipped once",
                }[config.privacy]
                if config.user_level
                else ""
            )
            + f"; optimizer {config.optimizer}"
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


def _data_facts(data: str | Path, config: DPOConfig, res: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``data``: the path and public sizes (never the pairs kept under user-level sample)."""
    if not config.user_level:
        return {"path": str(data), "n_pairs": res["n_pairs"]}
    if config.privacy == "label":  # the pairs and their users are public under label privacy
        return {"path": str(data), "n_pairs": res["n_pairs"], "n_users": res["n_users"]}
    return {"path": str(data), "n_users": res["n_users"]}


def _opacus_version() -> str | None:
    from privalign.models._resources import package_version

    return package_version("opacus")
