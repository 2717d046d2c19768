"""Save and load fitted reward models, losslessly, with their privacy event and feature-map config.

Format: one JSON file (UTF-8), the one reward-model format of privalign (``fit-reward``,
``fit-imdb-reward``, ``build-pool``/``rescore-pool`` ``linear:PATH`` and ``privalign serve --reward-model``
all read and write it)::

    {"format": "privalign.reward_model", "version": 2,
     "name": "SampleDPIHT",                                   # identifier recorded in pool manifests
     "estimator": "SampleDPIHT" | null,                       # null: a linear reward fit outside
     "params": {...},                                         #   privalign's estimators (e.g. a
                                                              #   logistic-regression gold model)
     "coef": {"dtype": "<f8", "shape": [d], "b64": "..."},
     "intercept": 0.0, "link": "identity" | "sigmoid",        # reward = link(φ(x)·coef + intercept)
     "fitted": {"support_": [...], "n_iter_": 10, ...},      # other fitted scalars / int lists
     "privacy_event": {... event.to_dict() ...} | null,      # null: no privacy guarantee is claimed
     "feature_config": {... HashedNgramFeatures.get_config() ...} | null,
     "metadata": {...}}

Version 1 (the same without ``name``, ``intercept`` and ``link``) still loads: intercept 0, identity link.

``coef_`` is stored as the base64 of its little-endian float64 bytes, so the round trip is bit-exact.
The file is written to a temporary name in the same directory and renamed, so a failed save never
leaves a partial model behind.
"""

from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from privalign._json import write_text_atomic
from privalign.accounting.events import event_from_dict
from privalign.errors import DataFormatError, PrivacyParameterError

__all__ = ["save_model", "load_model", "FORMAT", "VERSION", "write_reward_model"]

FORMAT = "privalign.reward_model"
VERSION = 2
READABLE_VERSIONS = (1, 2)


def _estimators() -> dict[str, Any]:
    """The classes a model file may name: every registered estimator (privalign.estimation.registry), by its
    one name. ``DPTransformerRM`` is a transformer reward model saved as a linear head over its feature map
    (kind ``"transformer"``, whose ``feature_config`` holds the DP-trained upper layers): see
    :mod:`privalign.estimation.transformer`."""
    from privalign.estimation.registry import classes

    return {c.name: c for c in classes()}


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return _jsonable(float(v))
    if isinstance(v, np.ndarray):
        return [_jsonable(x) for x in v.tolist()]
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def _unjson(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    return v


def save_model(
    estimator: Any,
    path: str | os.PathLike,
    *,
    feature_config: dict | None = None,
    metadata: dict | None = None,
    name: str | None = None,
) -> Path:
    """Write a fitted estimator to ``path`` (JSON) atomically; returns the path.

    Args:
      estimator: a fitted privalign reward estimator (has ``coef_`` and ``privacy_event_``).
      path: destination file.
      feature_config: the public feature map's ``get_config()``, so the model can featurise text again.
      metadata: public information about the fit (keys of
        :data:`privalign.release.REWARD_MODEL_METADATA`: method, data source, n, the tuning's choice).
        Exact statistics of the private data (held-out accuracy, validation accuracies) and seeds belong in
        an audit record (:func:`privalign.release.write_audit_record`), not here.
      name: identifier recorded in pool manifests (default: the estimator's class name).

    ``params["random_state"]`` is written as ``null`` whatever the estimator holds: a release never carries
    the seed of its noise.

    Raises:
      PrivacyParameterError: the estimator is not a fitted privalign estimator, or the params are not
        JSON-serialisable.
      ReleaseBoundaryError: ``metadata`` or a fitted attribute outside the release allow-lists.
    """
    model_name, name = name, type(estimator).__name__
    known = _estimators()
    if (
        known.get(name) is not type(estimator)
        or not hasattr(estimator, "coef_")
        or not hasattr(estimator, "privacy_event_")
    ):
        raise PrivacyParameterError(
            "The 'estimator' parameter must be a fitted privalign reward estimator "
            f"({', '.join(known)}). Got {estimator!r} instead."
        )
    from privalign.release import RELEASE_RULE, SECRET_PARAMS

    # The seed of the privacy noise is never written: whoever holds it replays the fit
    # (docs/privacy/release.md).
    params = {k: None if k in SECRET_PARAMS else _jsonable(v) for k, v in estimator.get_params().items()}
    coef = np.ascontiguousarray(estimator.coef_, dtype="<f8")
    fitted: dict[str, Any] = {}
    for k, v in vars(estimator).items():
        if k.endswith("_") and k not in ("coef_", "privacy_event_"):
            fitted[k] = _jsonable(v)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "name": name if model_name is None else str(model_name),
        "estimator": name,
        "params": params,
        "coef": {
            "dtype": "<f8",
            "shape": list(coef.shape),
            "b64": base64.b64encode(coef.tobytes()).decode("ascii"),
        },
        "intercept": 0.0,
        "link": "identity",
        "fitted": fitted,
        "privacy_event": estimator.privacy_event_.to_dict(),
        "feature_config": feature_config,
        "metadata": _jsonable({**(metadata or {}), "release": RELEASE_RULE}),
    }
    return write_reward_model(doc, path)


def write_reward_model(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write a reward-model document (see the module docstring) to ``path`` atomically; returns the path.

    The document is checked against the release allow-lists first
    (:func:`privalign.release.check_reward_model`): a privalign estimator's file, or any file that claims
    privacy, holds no noise seed, no data hash and no exact statistic of the private data.

    Raises:
      ReleaseBoundaryError: a field outside the allow-lists (nothing is written).
    """
    from privalign.release import check_reward_model

    check_reward_model(doc)
    try:
        text = json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PrivacyParameterError(
            f"The estimator's parameters must be JSON-serialisable to save it: {exc}"
        ) from exc
    path = Path(path)
    if path.is_dir():  # else os.replace fails with "[Errno 21] Is a directory: '.tmp.*' -> 'DIR'"
        raise IsADirectoryError(f"{path} is a directory: give the path of the reward-model file to write")
    # a model file is as readable as any other output (the temporary file is owner-only)
    write_text_atomic(path, text, mode=0o644)
    return path


def load_model(path: str | os.PathLike) -> tuple[Any, dict | None, dict]:
    """Read a model written by :func:`save_model`.

    Returns:
      ``(estimator, feature_config, metadata)``; the estimator has ``coef_``, its other fitted
      attributes and ``privacy_event_`` restored exactly.

    Raises:
      DataFormatError: not a privalign model file, wrong version, or corrupt fields (named).
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: not a JSON privalign model file ({exc}).") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DataFormatError(
            f"{path}: field 'format' must be {FORMAT!r}. Got "
            f"{doc.get('format') if isinstance(doc, dict) else doc!r}."
        )
    from privalign.release import warn_if_not_releasable

    warn_if_not_releasable(doc, path)
    if doc.get("version") not in READABLE_VERSIONS:
        raise DataFormatError(
            f"{path}: field 'version' must be one of {list(READABLE_VERSIONS)} (this privalign writes "
            f"{VERSION}). Got {doc.get('version')!r}; a newer privalign wrote it: upgrade privalign."
        )
    if doc.get("estimator") is None:
        raise DataFormatError(
            f"{path}: field 'estimator' is null: a linear reward fit outside privalign's estimators, with no "
            "estimator to restore. Load it with privalign.models.LinearRewardScorer.load(path) instead."
        )
    if doc.get("intercept", 0.0) != 0.0 or doc.get("link", "identity") != "identity":
        raise DataFormatError(
            f"{path}: fields 'intercept'/'link' are {doc.get('intercept')!r}/{doc.get('link')!r}; an "
            "estimator's reward has intercept 0 and the identity link. Load it with "
            "privalign.models.LinearRewardScorer.load(path)."
        )
    classes = _estimators()
    cls = classes.get(str(doc.get("estimator")))
    if cls is None:
        raise DataFormatError(
            f"{path}: field 'estimator' must be one of {sorted(classes)}. Got {doc.get('estimator')!r}."
        )
    est = cls(**{k: _unjson(v) for k, v in doc["params"].items()})
    c = doc["coef"]
    try:
        raw = base64.b64decode(c["b64"], validate=True)
        coef = np.frombuffer(raw, dtype=c["dtype"]).astype(np.float64).reshape(c["shape"])
    except (KeyError, ValueError, TypeError) as exc:
        raise DataFormatError(f"{path}: field 'coef' is corrupt ({exc}).") from exc
    est.coef_ = coef
    for k, v in doc.get("fitted", {}).items():
        if k == "support_":
            setattr(est, k, np.asarray(v, dtype=np.int64))
        else:
            setattr(est, k, _unjson(v))
    est.privacy_event_ = event_from_dict(doc["privacy_event"])
    return est, doc.get("feature_config"), doc.get("metadata", {})
