"""Reward functions for policy optimisation: a privalign reward model (or a reference scorer) as a TRL
reward function ``(prompts, completions, **kw) -> list[float]``.

* :class:`PrivateReward`: a reward model written by ``privalign fit-reward --out`` /
  :func:`privalign.estimation.save_model` (``RRIHT``, ``SampleDPIHT``, ``DenseRR``, ``DPSGDLinear``,
  non-private ``MLE``/``IHT``). Its reward is ``r(k, a) = ⟨φ(k, a), θ⟩`` with the public feature map stored in
  the file.
* :class:`ScorerReward`: VADER or a ``LinearRewardScorer`` file (e.g. the MiniLM gold model
  ``pools/imdb-gold-minilm-logreg.json``), for reference runs only: these are not private reward models and
  carry no privacy event.

**Privacy.** Scoring texts with a fitted reward model is post-processing of the model's output, so a policy
trained against :class:`PrivateReward` only (with public prompts and a public base model) inherits the reward
model's guarantee: the same (ε, δ) and the same privacy unit (``sample``: one whole comparison; ``label``: one
preference label, features public) under the same neighbouring relation, and nothing more. See
``docs/privacy/rlhf_policy.md``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privalign.errors import DataFormatError, PrivacyParameterError
from privalign.estimation.transformer import describe_feature_config
from privalign.release import public_metadata

__all__ = ["PrivateReward", "ScorerReward", "load_reward", "file_sha256"]

REWARD_MODEL_FORMAT = "privalign.reward_model"
LINEAR_SCORER_FORMAT = "privalign-linear-reward/1"


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class PrivateReward:
    """A fitted privalign reward model as a reward function.

    Args:
      path: the model JSON (``privalign fit-reward --out``).

    Raises:
      FileNotFoundError: ``path`` does not exist (the message names ``reward_model``).
      DataFormatError: not a privalign reward-model file, or no feature-map config in it.
      PrivacyParameterError: the stored feature map does not produce as many features as the model has
        coefficients (a feature-map mismatch).
    """

    __name__ = "private_reward"  # TRL names reward functions by ``__name__``

    def __init__(self, path: str | os.PathLike) -> None:
        from privalign.estimation.features import feature_map_from_config
        from privalign.estimation.persistence import load_model
        from privalign.models.features import MODEL_FEATURE_MAPS

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"The 'reward_model' parameter must be an existing file. Got {str(path)!r} (no such file)."
            )
        self.est, fcfg, self.metadata = load_model(self.path)
        if fcfg is None:
            raise DataFormatError(
                f"{self.path}: the reward model has no 'feature_config', so its feature map cannot be "
                "rebuilt to score text (save it with save_model(..., feature_config=fmap.get_config())); "
                "'reward_model' is unusable."
            )
        try:
            self.feature_map = feature_map_from_config(fcfg, kinds=MODEL_FEATURE_MAPS)
        except (PrivacyParameterError, TypeError) as exc:
            raise DataFormatError(
                f"{self.path}: field 'feature_config' does not describe a feature map ({exc})."
            ) from exc
        self.feature_config = fcfg
        d = int(np.asarray(self.est.coef_).shape[0])
        probe = self.feature_map.transform_pairs(["probe"], ["a probe text"])
        if probe.shape[1] != d:
            raise PrivacyParameterError(
                f"The 'reward_model' feature map does not match its coefficients: {fcfg.get('kind')} "
                f"features give {probe.shape[1]} columns but the model has {d} coefficients ({self.path})."
            )
        self.sha256 = file_sha256(self.path)
        self.event = self.est.privacy_event_

    @property
    def privacy_unit(self) -> str:
        return (
            "none"
            if self.event.to_dict().get("kind") == "non_private"
            else str(getattr(self.event, "unit", "?"))
        )

    @property
    def is_private(self) -> bool:
        return self.privacy_unit != "none"

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> np.ndarray:
        """``r(k, a)`` for aligned prompts and completions (float64 array)."""
        X = self.feature_map.transform_pairs(list(prompts), list(completions))
        return np.asarray(self.est.predict_reward(X), dtype=np.float64).ravel()

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
        return [float(v) for v in self.score(prompts, completions)]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "privalign.reward_model",
            "path": str(self.path.resolve()),
            "sha256": self.sha256,
            "estimator": type(self.est).__name__,
            "privacy_event": self.event.to_dict(),
            "privacy_unit": self.privacy_unit,
            # the δ the fit targeted (public configuration; a tuned fit's whole search): the δ at which a
            # Gaussian event is accounted
            "target_delta": ((self.metadata.get("tuning") or {}).get("privacy_budget") or {}).get("delta")
            or self.est.get_params().get("delta"),
            # the finite ε the file states (public configuration, as target_delta): the statement of a
            # policy trained on it says how its accounted ε stands to this one
            "target_epsilon": _finite(
                ((self.metadata.get("tuning") or {}).get("privacy_budget") or {}).get("epsilon")
                or (self.metadata.get("user_level") or {}).get("epsilon")  # per user, not the ε/K per label
                or self.est.get_params().get("epsilon")
            ),
            "max_pairs_per_user": self.metadata.get("max_pairs_per_user"),
            # a transformer map's weights (megabytes) summarised by count and hash, not copied
            "feature_config": describe_feature_config(self.feature_config),
            "training_data": self.metadata.get("data"),
            # only the release-safe part: a file written before the release boundary may hold its noise
            # seed or exact accuracies, which a manifest must not copy (docs/privacy/release.md)
            "metadata": public_metadata(self.metadata),
        }


def _finite(v: Any) -> float | None:
    """``v`` as a float when it is a finite number (an ε of ∞, or "inf" as JSON stores it, is ``None``)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


class ScorerReward:
    """A non-private reference reward: ``"vader"`` (VADER compound mapped to [0, 1]) or ``linear:PATH`` (a
    ``LinearRewardScorer`` JSON, e.g. the MiniLM gold). Scores the completion alone."""

    __name__ = "reference_reward"

    def __init__(self, spec: str) -> None:
        from privalign.models.scorers import LinearRewardScorer, VaderScorer

        self.spec = spec
        self.path: Path | None = None
        self.sha256: str | None = None
        self.scorer: VaderScorer | LinearRewardScorer
        if spec == "vader":
            self.scorer = VaderScorer("unit")
        elif spec.startswith("linear:"):
            self.path = Path(spec[len("linear:") :])
            if not self.path.is_file():
                raise FileNotFoundError(
                    f"The 'reward_model' parameter must name an existing file. Got {spec!r} (no such file)."
                )
            self.scorer = LinearRewardScorer.load(self.path)
            self.sha256 = file_sha256(self.path)
        else:  # pragma: no cover - load_reward routes only these two
            raise PrivacyParameterError(
                f"The 'reward_model' parameter must be 'vader' or 'linear:PATH'. Got {spec!r}."
            )
        self.metadata: dict[str, Any] = {}
        self.event = None

    privacy_unit = "none"
    is_private = False

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> np.ndarray:
        return np.asarray(self.scorer.score(list(completions)), dtype=np.float64).ravel()

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
        return [float(v) for v in self.score(prompts, completions)]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "reference scorer (not a private reward model; no privacy guarantee)",
            "spec": self.spec,
            "path": str(self.path.resolve()) if self.path else None,
            "sha256": self.sha256,
            "privacy_event": None,
            "privacy_unit": "none",
            "scorer": self.scorer.describe(),
        }


def load_reward(spec: str | os.PathLike) -> PrivateReward | ScorerReward:
    """``"vader"``, ``"linear:PATH"`` or the path of a privalign reward-model JSON (a ``LinearRewardScorer``
    JSON is recognised by its ``format`` field too).

    Raises:
      FileNotFoundError, DataFormatError, PrivacyParameterError: see :class:`PrivateReward`.
    """
    s = str(spec)
    if s == "vader" or s.startswith("linear:"):
        return ScorerReward(s)
    p = Path(s)
    if not p.is_file():
        raise FileNotFoundError(
            f"The 'reward_model' parameter must be an existing file. Got {s!r} (no such file)."
        )
    try:
        fmt = json.loads(p.read_text(encoding="utf-8")).get("format")
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{p}: the 'reward_model' file is not a JSON reward model ({exc}).") from exc
    if fmt == LINEAR_SCORER_FORMAT:
        return ScorerReward(f"linear:{p}")
    if fmt != REWARD_MODEL_FORMAT:
        raise DataFormatError(
            f"{p}: the 'reward_model' file's field 'format' must be {REWARD_MODEL_FORMAT!r} "
            f"(or {LINEAR_SCORER_FORMAT!r}). Got {fmt!r}."
        )
    return PrivateReward(p)
