"""Scorers: texts → rewards (float64 arrays), batched.

Proxy rewards (what best-of-N optimises): :class:`LinearRewardScorer` (a linear reward over a public feature
map, e.g. one fit by ``privalign.estimation``), :class:`HFRewardModelScorer` (a local sequence-
classification reward-model directory), :class:`VaderScorer` (VADER sentiment) and
:class:`ProfanityScorer` (``alt-profanity-check``).

True rewards (verifiers, ``score`` in {0, 1}, plus ``predict``): :class:`GSM8KVerifier` (final number),
:class:`MATHVerifier` (last ``\\boxed{}``), :class:`MMLUVerifier` (spec §5.2 regex).

Every scorer has ``score(texts, *, contexts=None) -> np.ndarray`` where ``contexts[i]`` is a dict for text
``i`` (e.g. ``{"prompt": ..., "gt_answer": ...}``); verifiers require ``gt_answer``. ``describe()`` returns
JSON metadata for pool manifests.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from privalign._validation import check_choice, check_int
from privalign.data.answers import extract_boxed
from privalign.errors import DataFormatError, PrivacyParameterError
from privalign.models._resources import package_version, require, set_offline

__all__ = [
    "Scorer",
    "LinearRewardScorer",
    "HFRewardModelScorer",
    "VaderScorer",
    "ProfanityScorer",
    "GSM8KVerifier",
    "MATHVerifier",
    "MMLUVerifier",
    "extract_gsm8k_answer",
    "extract_mmlu_letter",
    "LINEAR_FORMAT",
    "FormatUpgradeWarning",
    "read_reward_model",
    "load_reward_model",
    "upgrade_reward_model",
]

LINEAR_FORMAT = "privalign-linear-reward/1"  # the old format of LinearRewardScorer.save (still read)


@runtime_checkable
class Scorer(Protocol):
    name: str

    def score(self, texts: Sequence[str], *, contexts: Sequence[dict] | None = None) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


def _texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise PrivacyParameterError(
            "The 'texts' parameter must be a sequence of strings, not a single string."
        )
    return [t if isinstance(t, str) else str(t) for t in texts]


def _contexts(contexts: Sequence[dict] | None, n: int, need: str | None = None) -> list[dict]:
    if contexts is None:
        if need:
            raise PrivacyParameterError(
                f"The 'contexts' parameter is required: each text needs a '{need}' entry."
            )
        return [{}] * n
    ctx = list(contexts)
    if len(ctx) != n:
        raise PrivacyParameterError(
            f"The 'contexts' parameter must have one entry per text ({n}). Got {len(ctx)}."
        )
    if need:
        for i, c in enumerate(ctx):
            if c.get(need) is None:
                raise PrivacyParameterError(
                    f"The 'contexts' parameter must give '{need}' for every text; missing at index {i}."
                )
    return ctx


# ----------------------------------------------------------------------------------------------
# Linear reward over a feature map
# ----------------------------------------------------------------------------------------------
class LinearRewardScorer:
    """``r(x) = link(φ(x)·w + b)`` for a public feature map φ: the one linear reward model of privalign.

    The same object scores pools (``build-pool``/``rescore-pool`` ``--proxy-reward linear:PATH``) and serves
    (``privalign serve --reward-model PATH`` calls it as ``scorer(prompt, texts)``), so the service featurises
    text exactly as the trainer did: φ(k, a) = ``feature_map.transform_pairs`` when the map uses the prompt,
    else ``feature_map.transform(texts)``; with the identity link and intercept 0 the scores are exactly the
    fitted estimator's ``predict_reward`` of those rows.

    Args:
      feature_map: An object with ``transform(texts)`` (dense or scipy.sparse rows), e.g.
        ``privalign.estimation.features.HashedNgramFeatures`` or
        ``privalign.models.features.EmbeddingFeatures``.
      coef: Weight vector ``w`` (length = feature dimension).
      intercept: ``b``.
      link: ``"identity"`` or ``"sigmoid"`` (a probability in [0, 1], e.g. a logistic-regression gold model).
      batch_size: Texts per transform call.
      name: Identifier recorded in manifests.
      privacy_event: the privacy event of the fit (a dict, ``event.to_dict()``), or ``None`` (no claim).
    """

    def __init__(
        self,
        feature_map: Any,
        coef: Any,
        *,
        intercept: float = 0.0,
        link: str = "identity",
        batch_size: int = 1024,
        name: str = "linear",
        privacy_event: dict | None = None,
    ) -> None:
        self.feature_map = feature_map
        self.coef = np.asarray(coef, dtype=np.float64).ravel()
        if not np.all(np.isfinite(self.coef)):
            raise PrivacyParameterError("The 'coef' parameter must contain only finite values.")
        self.intercept = float(intercept)
        self.link = check_choice(link, "link", ("identity", "sigmoid"))
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.name = name
        self.privacy_event = privacy_event
        self.metadata: dict[str, Any] = {}
        self.estimator: str | None = None

    def score(self, texts: Sequence[str], *, contexts: Sequence[dict] | None = None) -> np.ndarray:
        from privalign.estimation.base import matvec

        texts = _texts(texts)
        ctx = _contexts(contexts, len(texts))
        pairs = bool(getattr(self.feature_map, "use_prompt", False))
        out = np.empty(len(texts), dtype=np.float64)
        for s in range(0, len(texts), self.batch_size):
            chunk = texts[s : s + self.batch_size]
            if pairs:
                prompts = [str(c.get("prompt") or "") for c in ctx[s : s + self.batch_size]]
                X = self.feature_map.transform_pairs(prompts, chunk)
            else:
                X = self.feature_map.transform(chunk)
            if X.shape[1] != self.coef.shape[0]:
                raise PrivacyParameterError(
                    f"The feature map gives {X.shape[1]} features but 'coef' has "
                    f"{self.coef.shape[0]} entries."
                )
            z = matvec(X, self.coef) + self.intercept
            out[s : s + len(z)] = z
        if self.link == "sigmoid":
            out = 0.5 * (1.0 + np.tanh(0.5 * out))  # numerically stable logistic
        return out

    def __call__(self, prompt: str, texts: Sequence[str]) -> np.ndarray:
        """The service's scorer interface: the reward of each candidate ``texts[i]`` for ``prompt``."""
        texts = _texts(texts)
        return self.score(texts, contexts=[{"prompt": prompt}] * len(texts))

    def describe(self) -> dict[str, Any]:
        """Public description for manifests. A model that carries a privacy event (a private fit, e.g. by
        ``privalign fit-reward``) is described with :func:`privalign.release.public_metadata` only: the
        file's noise seed, exact held-out accuracy and the like never reach a pool manifest. A model without
        one (a non-private reference such as the shipped gold models, fit on public data) keeps its whole
        metadata."""
        fm = (
            self.feature_map.get_config()
            if hasattr(self.feature_map, "get_config")
            else repr(self.feature_map)
        )
        from privalign.estimation.transformer import describe_feature_config

        fm = describe_feature_config(fm)  # a transformer map's weights: summarised, not copied
        from privalign.release import public_metadata

        meta = self.metadata if self.privacy_event is None else public_metadata(self.metadata)
        return {
            "scorer": "linear",
            "name": self.name,
            "feature_map": fm,
            "link": self.link,
            "dim": int(self.coef.shape[0]),
            "estimator": self.estimator,
            "privacy_event": self.privacy_event,
            "metadata": meta,
        }

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, *, metadata: dict | None = None, dtype: str = "<f8") -> Path:
        """Write the model in the reward-model format (``privalign.reward_model`` version 2, see
        :mod:`privalign.estimation.persistence`) atomically. ``dtype="<f4"`` halves the file (not
        lossless)."""
        from privalign.estimation.persistence import FORMAT, VERSION, write_reward_model

        if not hasattr(self.feature_map, "get_config"):
            raise PrivacyParameterError("The feature map must have get_config() to be saved.")
        dtype = check_choice(dtype, "dtype", ("<f8", "<f4"))
        coef = np.ascontiguousarray(self.coef, dtype=dtype)
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "estimator": None,
            "params": {},
            "coef": {
                "dtype": dtype,
                "shape": [int(coef.shape[0])],
                "b64": base64.b64encode(coef.tobytes()).decode("ascii"),
            },
            "intercept": self.intercept,
            "link": self.link,
            "fitted": {},
            "privacy_event": self.privacy_event,
            "feature_config": self.feature_map.get_config(),
            "metadata": metadata or self.metadata,
        }
        return write_reward_model(doc, path)

    @classmethod
    def load(cls, path: str | os.PathLike, **kwargs: Any) -> LinearRewardScorer:
        """Load a reward-model file: the current format (``privalign.reward_model`` v2, written by
        ``fit-reward``, ``fit-imdb-reward`` and :meth:`save`), or, with a :class:`FormatUpgradeWarning` that
        names the upgrade command, the two older formats that hold the same information
        (``privalign.reward_model`` v1 and ``privalign-linear-reward/1``).

        Raises:
          FileNotFoundError: no such file.
          DataFormatError: not a reward-model file, or the retired service weights format (the message
            says how to replace it); the message names the file and the field.
        """
        doc = read_reward_model(path)
        from privalign.estimation.features import feature_map_from_config
        from privalign.models.features import MODEL_FEATURE_MAPS

        p = Path(path)
        try:
            c = doc["coef"]
            coef = np.frombuffer(
                base64.b64decode(c["b64"], validate=True), dtype=np.dtype(c["dtype"])
            ).astype(np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataFormatError(f"{p}: field 'coef' is malformed ({exc}).") from exc
        if not doc.get("feature_config"):
            raise DataFormatError(
                f"{p}: field 'feature_config' is missing; cannot featurise text for this reward model."
            )
        try:
            fm = feature_map_from_config(doc["feature_config"], kinds=MODEL_FEATURE_MAPS)
        except (TypeError, ValueError) as exc:
            raise DataFormatError(f"{p}: field 'feature_config' is malformed ({exc}).") from exc
        try:
            sc = cls(
                fm,
                coef,
                intercept=float(doc.get("intercept") or 0.0),
                link=doc.get("link") or "identity",
                name=str(doc.get("name") or p.stem),
                privacy_event=doc.get("privacy_event"),
                **kwargs,
            )
        except PrivacyParameterError as exc:
            raise DataFormatError(f"{p}: {exc}") from exc
        sc.metadata = dict(doc.get("metadata") or {})
        sc.estimator = doc.get("estimator")
        return sc


class FormatUpgradeWarning(UserWarning):
    """A file was read in an older privalign format; the message gives the command that rewrites it."""


def read_reward_model(path: str | os.PathLike) -> dict[str, Any]:
    """The reward-model document at ``path`` in the current schema (``privalign.reward_model`` v2), converting
    the older formats in memory (with a :class:`FormatUpgradeWarning`). See
    :meth:`LinearRewardScorer.load`."""
    import warnings

    from privalign.estimation.persistence import FORMAT, VERSION

    p = Path(path)
    if p.is_dir():
        raise DataFormatError(f"{p} is a directory, not a reward-model file.")
    if not p.is_file():
        raise FileNotFoundError(f"The reward-model file {p} does not exist.")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{p}: not a JSON reward-model file ({exc}).") from exc
    if not isinstance(doc, dict):
        raise DataFormatError(
            f"{p}: not a reward-model file (a JSON {type(doc).__name__}, expected an object)."
        )
    from privalign.release import public_seed_evidence, refit_command, warn_if_not_releasable

    warn_if_not_releasable(doc, p)
    upgrade = (
        f"`privalign upgrade-reward-model {p} --out NEW.json` rewrites it in the current format "
        f"({FORMAT} v{VERSION})"
        if not public_seed_evidence(doc)
        else f"its noise seed is public, so it cannot be upgraded: refit it ({refit_command(doc)})"
    )
    fmt = doc.get("format")
    if fmt == FORMAT and doc.get("version") == VERSION:
        return doc
    if fmt == FORMAT and doc.get("version") == 1:
        warnings.warn(
            f"{p} is a version-1 reward model; it loads unchanged (intercept 0, identity link). {upgrade}.",
            FormatUpgradeWarning,
            stacklevel=3,
        )
        return {
            **doc,
            "version": VERSION,
            "name": doc.get("estimator") or p.stem,
            "intercept": 0.0,
            "link": "identity",
        }
    if fmt == FORMAT:
        raise DataFormatError(
            f"{p}: field 'version' is {doc.get('version')!r}; this privalign reads versions 1 and {VERSION}: "
            "upgrade privalign."
        )
    if fmt == LINEAR_FORMAT:
        warnings.warn(
            f"{p} is in the old {LINEAR_FORMAT!r} format; it loads unchanged (no privacy event). {upgrade}.",
            FormatUpgradeWarning,
            stacklevel=3,
        )
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": doc.get("name") or p.stem,
            "estimator": None,
            "params": {},
            "coef": doc.get("coef"),
            "intercept": doc.get("intercept", 0.0),
            "link": doc.get("link", "identity"),
            "fitted": {},
            "privacy_event": None,
            "feature_config": doc.get("feature_config"),
            "metadata": doc.get("metadata") or {},
        }
    if "weights" in doc and "n_features" in doc:
        raise DataFormatError(
            f"{p}: this is the retired service weights format ('n_features'/'weights' over BLAKE2b-signed, "
            "l2-normalised n-grams), which no trainer writes and whose features differ from the trainer's; "
            "it cannot be converted. "
            "Fit a model with `privalign fit-reward --data ... --method ... --out rm.json` and serve it with "
            "`privalign serve --reward-model rm.json`."
        )
    raise DataFormatError(
        f"{p}: field 'format' must be {FORMAT!r}. Got {fmt!r}; not a privalign reward-model file."
    )


def load_reward_model(path: str | os.PathLike) -> LinearRewardScorer:
    """Shorthand for :meth:`LinearRewardScorer.load`."""
    return LinearRewardScorer.load(path)


def upgrade_reward_model(path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Rewrite a reward-model file of an older format in the current one: the coefficients keep their stored
    dtype and bytes; estimator, public parameters, fitted attributes and privacy event are kept. Whatever
    else a release may not hold (:mod:`privalign.release`: exact held-out or validation accuracies) is
    removed; the removed field paths are in :func:`upgrade_reward_model_report`.

    A private (or privalign-estimator) file whose noise seed or data hash was ever written down (a non-null
    ``random_state``, ``seed_entropy`` or hash field, a ``fit-reward`` file from before the release
    boundary, the model shipped at commit a836a1f) is refused: whoever holds any copy replays its fit, so
    no rewrite makes its privacy event true. Refit it (:func:`privalign.release.public_seed_evidence`).

    Raises:
      ReleaseBoundaryError: such a file (one line naming what was found and the refit command); nothing is
        written."""
    return upgrade_reward_model_report(path, out)[0]


def upgrade_reward_model_report(path: str | os.PathLike, out: str | os.PathLike) -> tuple[Path, list[str]]:
    """:func:`upgrade_reward_model`, returning ``(path written, field paths removed)``."""
    import warnings

    from privalign.errors import PrivacyWarning
    from privalign.release import refuse_public_seed, sanitize_reward_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FormatUpgradeWarning)
        warnings.simplefilter("ignore", PrivacyWarning)  # what it warns of is refused or removed below
        doc = read_reward_model(path)
        # A file whose noise seed (or data hash) was ever written down is refitted, never upgraded: removing
        # the field from this copy does not take it back from the others (issue 36).
        refuse_public_seed(doc, path)
        # Check it as the loader will (coefficients, feature map) before writing anything: a malformed
        # source must fail naming the source, and leave no half-converted file behind.
        LinearRewardScorer.load(path)
    from privalign.estimation.persistence import write_reward_model

    clean, dropped = sanitize_reward_model(doc)
    return write_reward_model(clean, out), dropped


# ----------------------------------------------------------------------------------------------
# Local HF sequence-classification reward model
# ----------------------------------------------------------------------------------------------
class HFRewardModelScorer:
    """A local ``AutoModelForSequenceClassification`` directory as a reward model (score = logit 0, or
    ``logits[:, label]`` if ``label`` is given). Input format ``"plain"`` = ``"{prompt}\\n\\n{text}"`` when a
    context has a ``prompt``, else the text alone (spec §5.2).

    Args:
      model_dir: Local directory with ``config.json``, weights and a tokenizer. Never downloaded.
      batch_size: Texts per forward pass.
      max_length: Truncation length.
      label: Logit column to use (default 0, as ``logits.squeeze(-1)`` for 1-label reward models).
      include_prompt: Prepend ``contexts[i]["prompt"]``.
      device: torch device.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        batch_size: int = 32,
        max_length: int = 512,
        label: int = 0,
        include_prompt: bool = True,
        device: str = "cpu",
    ) -> None:
        set_offline()
        self._torch = require("torch", purpose="HFRewardModelScorer")
        tr = require("transformers", purpose="HFRewardModelScorer")
        d = Path(model_dir).expanduser()
        if not (d / "config.json").is_file():
            raise FileNotFoundError(
                f"The reward-model directory {d} has no config.json (model_dir={str(model_dir)!r})."
            )
        self.model_dir = d
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.max_length = check_int(max_length, "max_length", low=2)
        self.label = check_int(label, "label", low=0)
        self.include_prompt = include_prompt
        self.device = device
        self.tokenizer = tr.AutoTokenizer.from_pretrained(str(d), local_files_only=True)
        self.model = (
            tr.AutoModelForSequenceClassification.from_pretrained(str(d), local_files_only=True)
            .to(device)
            .eval()
        )
        self.name = f"hf:{d.name}"

    def score(self, texts: Sequence[str], *, contexts: Sequence[dict] | None = None) -> np.ndarray:
        texts = _texts(texts)
        ctx = _contexts(contexts, len(texts))
        inputs = [
            f"{c['prompt']}\n\n{t}" if self.include_prompt and c.get("prompt") else t
            for t, c in zip(texts, ctx)
        ]
        torch = self._torch
        out = np.empty(len(inputs), dtype=np.float64)
        for s in range(0, len(inputs), self.batch_size):
            enc = self.tokenizer(
                inputs[s : s + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
            )
            with torch.inference_mode():
                logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits
            out[s : s + logits.shape[0]] = logits[:, self.label].float().cpu().numpy()
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "scorer": "hf",
            "model_dir": str(self.model_dir),
            "label": self.label,
            "max_length": self.max_length,
            "transformers": package_version("transformers"),
        }


# ----------------------------------------------------------------------------------------------
# VADER and profanity
# ----------------------------------------------------------------------------------------------
class VaderScorer:
    """VADER sentiment (Hutto & Gilbert 2014). ``output="unit"`` maps the compound score c ∈ [−1, 1] to
    (c + 1)/2 ∈ [0, 1]; ``"compound"`` returns c. Cheap and easily gamed (exclamation marks, capitals,
    sentiment words), which is why it serves as the *proxy* reward of the IMDb pool."""

    def __init__(self, output: str = "unit") -> None:
        self.output = check_choice(output, "output", ("unit", "compound"))
        mod = require("vaderSentiment.vaderSentiment", purpose="VaderScorer")
        self._an = mod.SentimentIntensityAnalyzer()
        self.name = f"vader-{self.output}"

    def score(self, texts: Sequence[str], *, contexts: Sequence[dict] | None = None) -> np.ndarray:
        c = np.array([self._an.polarity_scores(t)["compound"] for t in _texts(texts)], dtype=np.float64)
        return (c + 1.0) / 2.0 if self.output == "unit" else c

    def describe(self) -> dict[str, Any]:
        return {"scorer": "vader", "output": self.output, "vaderSentiment": package_version("vaderSentiment")}


class ProfanityScorer:
    """``alt-profanity-check`` probability that a text is offensive (in [0, 1]). ``invert=True`` returns
    1 − p (a "cleanliness" reward)."""

    def __init__(self, invert: bool = False) -> None:
        self._pc = require("profanity_check", purpose="ProfanityScorer")
        self.invert = bool(invert)
        self.name = "clean" if invert else "profanity"

    def score(self, texts: Sequence[str], *, contexts: Sequence[dict] | None = None) -> np.ndarray:
        texts = _texts(texts)
        if not texts:
            return np.zeros(0)
        p = np.asarray(self._pc.predict_prob(texts), dtype=np.float64)
        return 1.0 - p if self.invert else p

    def describe(self) -> dict[str, Any]:
        return {
            "scorer": "profanity",
            "invert": self.invert,
            "alt-profanity-check": package_version("alt-profanity-check"),
        }


# ----------------------------------------------------------------------------------------------
# Verifiers
# ----------------------------------------------------------------------------------------------
_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _to_number(s: str | None) -> Fraction | None:
    if s is None:
        return None
    s = s.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def extract_gsm8k_answer(text: str) -> str | None:
    """The answer of a GSM8K solution: the number after ``####`` if present, else after "answer is", else
    the last number in the text."""
    if "####" in text:
        m = _NUM.search(text.split("####")[-1])
        if m:
            return m.group(0).replace(",", "")
    m = re.search(r"answer is\s*[:\s]*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", text, flags=re.IGNORECASE)
    if m:
        return m.group(1).replace(",", "")
    nums = _NUM.findall(text)
    return nums[-1].replace(",", "") if nums else None


_MMLU_RE = re.compile(r"The answer is\s*[:\s]*\**([A-D])\**", re.IGNORECASE)
_MMLU_FALLBACK = re.compile(r"\b([A-D])\b")


def extract_mmlu_letter(text: str) -> str | None:
    """Spec §5.2: ``The answer is\\s*[:\\s]*\\**([A-D])\\**`` (case-insensitive), else the last standalone
    ``\\b[A-D]\\b``, else ``None``."""
    m = _MMLU_RE.search(text)
    if m:
        return m.group(1).upper()
    ms = _MMLU_FALLBACK.findall(text)
    return ms[-1] if ms else None


def _normalize_math(s: str) -> str:
    s = s.strip().strip("$").replace(" ", "").replace("\\!", "").replace("\\left", "").replace("\\right", "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac").replace("^\\circ", "").replace("^{\\circ}", "")
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    s = s.rstrip(".")
    if s.startswith("\\frac") is False:
        s = s.replace(",", "") if re.fullmatch(r"-?[\d,]+(\.\d+)?", s) else s
    return s


class _Verifier:
    kind = "verifier"
    name = "verifier"

    def predict(self, text: str) -> str | None:
        raise NotImplementedError

    def is_correct(self, predicted: str | None, gt: str) -> bool:
        raise NotImplementedError

    def score(self, texts: Sequence[str], *, contexts: Sequence[dict] | None = None) -> np.ndarray:
        texts = _texts(texts)
        ctx = _contexts(contexts, len(texts), need="gt_answer")
        return np.array(
            [float(self.is_correct(self.predict(t), str(c["gt_answer"]))) for t, c in zip(texts, ctx)]
        )

    def describe(self) -> dict[str, Any]:
        return {"scorer": self.name}


class GSM8KVerifier(_Verifier):
    """1 if the completion's final number equals the reference (``gt_answer``: a number, or a full GSM8K
    answer with ``#### n``), compared exactly as rationals, else 0."""

    name = "gsm8k-verifier"

    def predict(self, text: str) -> str | None:
        return extract_gsm8k_answer(text)

    def is_correct(self, predicted: str | None, gt: str) -> bool:
        ref = _to_number(extract_gsm8k_answer(gt) if "####" in gt else gt)
        got = _to_number(predicted)
        return ref is not None and got is not None and ref == got


class MATHVerifier(_Verifier):
    """1 if the last ``\\boxed{}`` of the completion matches the reference answer (``gt_answer``: the
    boxed answer or a full solution) after light normalisation (spaces, ``\\dfrac``, ``\\text{}``,
    ``\\left``); numbers are compared as rationals."""

    name = "math-verifier"

    def predict(self, text: str) -> str | None:
        return extract_boxed(text)

    def is_correct(self, predicted: str | None, gt: str) -> bool:
        ref = extract_boxed(gt) if "\\boxed" in gt else gt
        if predicted is None or ref is None:
            return False
        a, b = _normalize_math(predicted), _normalize_math(ref)
        if a == b:
            return True
        na, nb = _to_number(a), _to_number(b)
        return na is not None and nb is not None and na == nb


class MMLUVerifier(_Verifier):
    """1 if the predicted letter (spec §5.2 regex, :func:`extract_mmlu_letter`) equals ``gt_answer``."""

    name = "mmlu-verifier"

    def predict(self, text: str) -> str | None:
        return extract_mmlu_letter(text)

    def is_correct(self, predicted: str | None, gt: str) -> bool:
        return predicted is not None and predicted == gt.strip().upper()
