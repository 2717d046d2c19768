"""The release boundary: what a file that privalign hands out as a private result may contain.

A *release* is anything a user would publish or give away as the private result: a reward-model file
(``fit-reward --out``, ``upgrade-reward-model --out``), a policy directory and its ``manifest.json``
(``align``), an answer of the service. A release holds only

* public configuration (the method, ε, δ, the feature map, the grid searched, the split rule, n),
* the outputs of the DP mechanisms (coefficients, support, the tuned hyper-parameters chosen by the
  exponential mechanism, the privacy event), and
* values computed only from those outputs and public data (the number of non-zeros, the file's own hash).

Never a seed of the privacy noise (whoever holds it replays the fit and reads the private labels off the
coefficients), never a hash of the private data (hash both neighbouring files: the true one matches) and
never an exact statistic of the private data (an exact held-out or validation accuracy reveals a missing
label once the features and coefficients are public). What an operator legitimately wants besides
(the replay seed, the data hash, the exact accuracies) goes into a separate *audit record*, written
owner-only (mode 0600) under a name that says so, or nowhere: :func:`write_audit_record`.

The writers enforce the allow-lists below (:func:`check_reward_model`), so a new field cannot slip into a
release unnoticed: adding one means adding it here, where the rule is written down. The rule, the choice of
data-independent splits and the advisory for files written before it are in ``docs/privacy/release.md``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privalign._json import write_text_atomic
from privalign.errors import PrivacyParameterError

__all__ = [
    "ReleaseBoundaryError",
    "RELEASE_RULE",
    "REWARD_MODEL_FIELDS",
    "REWARD_MODEL_FITTED",
    "REWARD_MODEL_METADATA",
    "REWARD_MODEL_TUNING",
    "REWARD_MODEL_TRANSFORMER_CONFIG",
    "SECRET_PARAMS",
    "check_reward_model",
    "claims_privacy",
    "public_metadata",
    "sanitize_reward_model",
    "KNOWN_REPLAYABLE_COEF",
    "public_seed_evidence",
    "refit_command",
    "refuse_public_seed",
    "write_audit_record",
    "audit_record_path",
    "public_overlap_check",
    "warn_if_not_releasable",
    "DPO_MANIFEST_FIELDS",
    "check_dpo_manifest",
]


class ReleaseBoundaryError(PrivacyParameterError):
    """A writer was handed a field that a release may not hold (a seed, a data hash, an exact statistic of
    private data, or a field nobody has classified yet). Nothing was written.

    Attributes:
      field: the offending field's path in the document (e.g. ``"metadata.seed_entropy"``).
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


#: Top-level fields of a reward-model file (``privalign.reward_model``; see
#: :mod:`privalign.estimation.persistence`).
REWARD_MODEL_FIELDS = frozenset(
    {
        "format",
        "version",
        "name",
        "estimator",
        "params",
        "coef",
        "intercept",
        "link",
        "fitted",
        "privacy_event",
        "feature_config",
        "metadata",
    }
)

#: Estimator parameters that must be ``None`` in a release: ``random_state`` seeds the privacy noise.
SECRET_PARAMS = ("random_state",)

#: Fitted attributes a release may hold: DP outputs (``support_``) and functions of public configuration
#: and n (``n_iter_`` of IHT, DP-SGD's ``steps_``, ``sampling_probability_`` and ``noise_multiplier_``,
#: randomized response's ``flip_probability_``; DP-SGD's ``clip_norm_``, ``batch_size_`` and
#: ``learning_rate_``, its defaults' values: functions of d, the public feature bound, n, ε and δ only).
REWARD_MODEL_FITTED = frozenset(
    {
        "support_",
        "n_iter_",
        "n_features_in_",
        "flip_probability_",
        "noise_multiplier_",
        "sampling_probability_",
        "steps_",
        "clip_norm_",
        "batch_size_",
        "learning_rate_",
    }
)

#: ``metadata`` keys a release may hold. ``n_train``/``n_test`` are public because the split is
#: data-independent (``privalign.estimation.preferences.train_test_split``); ``nonzeros`` is computed from
#: the DP coefficients; ``data`` names the public source or the path given on the command line.
REWARD_MODEL_METADATA = frozenset(
    {
        "method",
        "estimator",
        "privacy_unit",
        "max_pairs_per_user",
        "user_level",
        "n_train",
        "n_test",
        "n_features",
        "nonzeros",
        "data",
        "split",
        "tuning",
        "release",
    }
)

#: ``metadata["tuning"]`` keys a release may hold: the grid (public), the choice of the exponential
#: mechanism (DP output), the part sizes (public) and the accounted budget. The candidates' validation
#: accuracies are exact statistics of the validation pairs: audit record only.
REWARD_MODEL_TUNING = frozenset(
    {
        "best_params",
        "grid",
        "n_candidates",
        "n_fit",
        "n_validation",
        "selection",
        "privacy_budget",
        "shared_label_noise",
    }
)

#: ``feature_config`` keys of a transformer reward model (kind ``"transformer"``,
#: :mod:`privalign.estimation.transformer`): the public architecture (backbone, how many upper layers were
#: trained, truncation, prompt use, batch size of scoring) and ``weights``, the trained upper layers: a DP
#: output (sample-DP: the DP-SGD iterate; label-DP: a function of the public texts and the RR labels).
REWARD_MODEL_TRANSFORMER_CONFIG = frozenset(
    {"kind", "backbone", "top_layers", "max_length", "use_prompt", "batch_size", "weights"}
)

#: The line every release-boundary-checked reward-model file carries in ``metadata["release"]``.
RELEASE_RULE = (
    "public configuration, DP outputs and values computed from them only: no noise seed, no hash and no "
    "exact statistic of the private data (docs/privacy/release.md)"
)


def claims_privacy(doc: Mapping[str, Any]) -> bool:
    """Whether a reward-model document claims a privacy guarantee (a privacy event other than non-private)."""
    ev = doc.get("privacy_event")
    return isinstance(ev, Mapping) and ev.get("kind") not in (None, "non_private")


def _checked(doc: Mapping[str, Any]) -> bool:
    """Documents under the boundary: every privalign estimator's file (private or not, so that a
    non-private fit is written by the same rule) and every file that claims privacy. A linear reward fit
    outside the estimators that claims nothing (a gold or proxy reference on public data) is not a private
    result, and its metadata is its own."""
    return doc.get("estimator") is not None or claims_privacy(doc)


def check_reward_model(doc: Mapping[str, Any]) -> None:
    """Refuse a reward-model document that holds anything outside the release allow-lists.

    Raises:
      ReleaseBoundaryError: naming the first offending field (its path in the document).
    """
    if not _checked(doc):
        return
    for k in doc:
        if k not in REWARD_MODEL_FIELDS:
            raise _refuse(k)
    params = doc.get("params") or {}
    for k in SECRET_PARAMS:
        if params.get(k) is not None:
            raise ReleaseBoundaryError(
                f"The release field 'params.{k}' must be null: it seeds the privacy noise, and whoever holds "
                f"it replays the fit. Got {params[k]!r}; keep the seed in an audit record "
                "(privalign.release.write_audit_record) or nowhere.",
                field=f"params.{k}",
            )
    for k in doc.get("fitted") or {}:
        if k not in REWARD_MODEL_FITTED:
            raise _refuse(f"fitted.{k}")
    meta = doc.get("metadata") or {}
    for k in meta:
        if k not in REWARD_MODEL_METADATA:
            raise _refuse(f"metadata.{k}")
    tuning = meta.get("tuning")
    if isinstance(tuning, Mapping):
        for k in tuning:
            if k not in REWARD_MODEL_TUNING:
                raise _refuse(f"metadata.tuning.{k}")
    _check_transformer_config(doc.get("feature_config"))


def _check_transformer_config(fc: Any) -> None:
    if isinstance(fc, Mapping) and fc.get("kind") == "transformer":
        for k in fc:
            if k not in REWARD_MODEL_TRANSFORMER_CONFIG:
                raise _refuse(f"feature_config.{k}")
        for name, t in (fc.get("weights") or {}).items():
            for k in t if isinstance(t, Mapping) else ():
                if k not in ("dtype", "shape", "b64"):
                    raise _refuse(f"feature_config.weights.{name}.{k}")


def _refuse(path: str) -> ReleaseBoundaryError:
    return ReleaseBoundaryError(
        f"The release field {path!r} is not on the release allow-list (privalign.release): a release holds "
        "public configuration, DP outputs and values computed from them only, never a noise seed, a hash or "
        "an exact statistic of the private data. Put it in an audit record "
        "(privalign.release.write_audit_record) or add it to the allow-list with the argument why it is "
        "public.",
        field=path,
    )


def warn_if_not_releasable(doc: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Warn (:class:`~privalign.errors.PrivacyWarning`) when a reward-model file read from disk holds what a
    release may not: a file written before the release boundary (privalign 0.1.0 up to commit 870caca) can
    carry the seed of its own noise and exact accuracies. It loads and scores as before; it must not be
    published. One whose noise seed has been written down (:func:`public_seed_evidence`) must be refitted;
    ``privalign upgrade-reward-model`` rewrites the others without those fields."""
    import warnings

    from privalign.errors import PrivacyWarning

    found = public_seed_evidence(doc)
    if found:
        warnings.warn(
            f"{path}: the noise seed of this reward model is public ({'; '.join(found)}): whoever holds it "
            "replays the fit, so its privacy event does not hold. Do not publish it or anything trained on "
            f"it; refit from fresh noise: {refit_command(doc)} (docs/privacy/release.md).",
            PrivacyWarning,
            stacklevel=3,
        )
        return
    try:
        check_reward_model(doc)
    except ReleaseBoundaryError as exc:
        warnings.warn(
            f"{path}: this reward-model file holds a field a release may not hold ({exc.field!r}): "
            "written before privalign's release boundary, it may carry exact statistics of its training "
            "data, which undo its privacy. Do not publish it; "
            f"`privalign upgrade-reward-model {path} --out NEW.json` rewrites it without them "
            "(docs/privacy/release.md).",
            PrivacyWarning,
            stacklevel=3,
        )


def public_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The release-safe part of a reward model's ``metadata`` (for copying into another release, such as
    an align manifest or a service's model description); everything else is dropped."""
    out: dict[str, Any] = {}
    for k, v in (metadata or {}).items():
        if k not in REWARD_MODEL_METADATA:
            continue
        if k == "tuning" and isinstance(v, Mapping):
            v = {tk: tv for tk, tv in v.items() if tk in REWARD_MODEL_TUNING}
        out[k] = v
    return out


def public_overlap_check(
    record: Mapping[str, Any] | None, *, allow_overlap: bool = False
) -> dict[str, Any] | None:
    """The release-safe part of an align run's prompt/private-data overlap check: whether it ran, against
    what, and the (public) number of pairs. How many RL prompts occur in the private data, and which, are
    exact statistics of it (membership of private records): they go to the operator's terminal only. The
    result line depends on ``allow_overlap`` alone, never on the count (without it an overlap is refused,
    so a run that exists is disjoint; with it, nothing is said)."""
    if record is None:
        return None
    out = {k: record[k] for k in ("checked", "why", "against", "n_pairs") if k in record}
    if record.get("checked"):
        out["result"] = (
            "overlap not excluded: --allow-overlap given (the count is not released)"
            if allow_overlap
            else "disjoint: no RL prompt occurs in the private data (the run is refused otherwise)"
        )
    return out


def sanitize_reward_model(doc: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of a reward-model document with every field outside the allow-lists removed (secret
    parameters set to null), and the list of the field paths removed. Used to rewrite files written before
    the release boundary (``upgrade-reward-model``)."""
    out = dict(doc)
    if not _checked(doc):
        return out, []
    dropped: list[str] = [k for k in doc if k not in REWARD_MODEL_FIELDS]
    for k in dropped:
        out.pop(k)
    params = dict(doc.get("params") or {})
    for k in SECRET_PARAMS:
        if params.get(k) is not None:
            params[k] = None
            dropped.append(f"params.{k}")
    out["params"] = params
    fitted = dict(doc.get("fitted") or {})
    for k in list(fitted):
        if k not in REWARD_MODEL_FITTED:
            fitted.pop(k)
            dropped.append(f"fitted.{k}")
    out["fitted"] = fitted
    meta = dict(doc.get("metadata") or {})
    clean = public_metadata(meta)
    dropped += [f"metadata.{k}" for k in meta if k not in clean]
    if isinstance(meta.get("tuning"), Mapping):
        dropped += [f"metadata.tuning.{k}" for k in meta["tuning"] if k not in REWARD_MODEL_TUNING]
    clean["release"] = RELEASE_RULE
    out["metadata"] = clean
    return out, dropped


#: Keys that hold a seed (of the noise, or its entropy) or a hash of the data, wherever they sit in a
#: reward-model document (``seed``, ``random_state``, ``seed_entropy``, ``noise_seed_entropy``,
#: ``data_sha256``, ``md5``, ``hash``...). ``metadata.split.seed`` is the public seed of the
#: data-independent train/test split (``fit-reward --split-seed``), not a seed of the noise.
_SEED_OR_HASH_KEY = re.compile(r"(^|_)(seeds?|random_state|entropy|sha\d*|md5|hash|digest|blake2\w*)(_|$)")
_PUBLIC_SEED_PATHS = frozenset({"metadata.split.seed"})

#: Reward models whose noise seed is public although the file in hand may no longer say so: the SHA-256 of
#: their little-endian float64 coefficient bytes (a digest of a published DP output, not of any data) →
#: what they are. A copy rewritten by ``upgrade-reward-model`` before it refused such files keeps the
#: coefficients byte for byte.
KNOWN_REPLAYABLE_COEF = {
    "7440a4fa6c4177e499bc3a22b8793a991c8a0cbc93217e60806d59398ca428e7": (
        "the HH-RLHF harmlessness RR-IHT model shipped at commit a836a1f (privalign 0.1.0), fitted with "
        "noise seed 3241444873 (README's old '--seed 0'), which its file and the git history hold"
    ),
}


def _coef_digest(doc: Mapping[str, Any]) -> str | None:
    import base64
    import hashlib

    coef = doc.get("coef")
    if not isinstance(coef, Mapping) or not isinstance(coef.get("b64"), str):
        return None
    try:
        return hashlib.sha256(base64.b64decode(coef["b64"], validate=True)).hexdigest()
    except ValueError:
        return None


def public_seed_evidence(doc: Mapping[str, Any]) -> list[str]:
    """What in a reward-model document shows that the seed of its noise, or a hash of its data, has been
    written down: ``"path = value"`` for every non-null seed, seed-entropy or hash field (anywhere but the
    coefficients and the public feature map; ``metadata.split.seed`` is public), ``"coefficients = ..."``
    for a model of :data:`KNOWN_REPLAYABLE_COEF`, and the marker of a ``fit-reward`` file written before the
    release boundary (``metadata.method`` without ``metadata.release``: that ``fit-reward`` always recorded
    ``params.random_state`` and ``metadata.seed_entropy``, so a copy without them was stripped). Empty for
    a document that claims no privacy and comes from no privalign estimator (a reference model on public
    data keeps its metadata: :func:`check_reward_model`).

    Whoever holds such a seed replays the fit and reads the private labels off the coefficients; removing
    the field from one copy cannot take it back from the others (or from version control), so such a file
    is refitted, never upgraded (:func:`privalign.models.scorers.upgrade_reward_model`)."""
    if not _checked(doc):
        return []
    found: list[str] = []

    def walk(v: Any, path: str) -> None:
        if isinstance(v, Mapping):
            for k, x in v.items():
                p = f"{path}.{k}" if path else str(k)
                if p in ("coef", "feature_config"):
                    continue
                if _SEED_OR_HASH_KEY.search(str(k).lower()) and x is not None and p not in _PUBLIC_SEED_PATHS:
                    found.append(f"{p} = {json.dumps(x, default=str)[:80]}")
                else:
                    walk(x, p)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")

    walk(doc, "")
    known = KNOWN_REPLAYABLE_COEF.get(_coef_digest(doc) or "")
    if known is not None:
        found.append(f"coefficients = those of {known}")
    meta = doc.get("metadata")
    if isinstance(meta, Mapping) and "method" in meta and "release" not in meta and not found:
        found.append(
            "metadata.method without metadata.release = a fit-reward file written before the release "
            "boundary, which always recorded its noise seed (params.random_state, metadata.seed_entropy)"
        )
    return found


def refit_command(doc: Mapping[str, Any]) -> str:
    """The ``privalign fit-reward`` command line that refits a reward-model document's method from fresh
    noise (placeholders where the document does not say)."""
    meta = doc.get("metadata")
    params = doc.get("params")
    meta = meta if isinstance(meta, Mapping) else {}
    params = params if isinstance(params, Mapping) else {}
    data, method, eps = meta.get("data"), meta.get("method"), params.get("epsilon")
    cmd = f"privalign fit-reward --data {data if isinstance(data, str) and data else 'PAIRS'}"
    cmd += f" --method {method if isinstance(method, str) and method else 'METHOD'}"
    if isinstance(eps, int | float) and not isinstance(eps, bool) and 0 < eps < float("inf"):
        cmd += f" --epsilon {eps:g}"
    return cmd + " --out NEW.json"


def refuse_public_seed(doc: Mapping[str, Any], source: str | os.PathLike) -> None:
    """Refuse to rewrite a reward-model document whose noise seed (or data hash) has been written down
    (:func:`public_seed_evidence`): its privacy event no longer holds, and no rewrite restores it.

    Raises:
      ReleaseBoundaryError: one line naming what was found and the refit command; ``field`` is the first
        path found.
    """
    found = public_seed_evidence(doc)
    if not found:
        return
    raise ReleaseBoundaryError(
        f"refit: this file's noise seed is public ({source}: {'; '.join(found)}): whoever holds this file, a "
        "copy of it or the history it was committed to replays the fit and reads the private labels off the "
        "coefficients, so no rewrite can make its privacy event true again (nothing was written). Refit from "
        f"fresh noise: {refit_command(doc)} (docs/privacy/release.md).",
        field=found[0].split(" = ")[0],
    )


def audit_record_path(release_path: str | os.PathLike) -> Path:
    """The conventional audit-record name beside a release: ``rm.json`` → ``rm.PRIVATE-audit.json``."""
    p = Path(release_path)
    return p.with_name(f"{p.stem}.PRIVATE-audit.json")


def write_audit_record(
    path: str | os.PathLike, record: Mapping[str, Any], *, release: str | os.PathLike | None = None
) -> Path:
    """Write an operator-private audit record: owner-only (mode 0600), atomically, with a header saying
    that it must not be published. It holds what a release may not (the noise seed, the data hash, exact
    statistics of the private data).

    Raises:
      ReleaseBoundaryError: ``path`` is the release itself.
    """
    path = Path(path)
    if release is not None and path.resolve() == Path(release).resolve():
        raise ReleaseBoundaryError(
            f"The 'audit_record' path must differ from the release it describes. Got {str(path)!r} for both.",
            field="audit_record",
        )
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory: give the path of the audit record to write")
    doc = {
        "format": "privalign.audit_record/1",
        "WARNING": "OPERATOR-PRIVATE: this file holds the noise seed, the data hash and exact statistics of "
        "the private data. Whoever holds it can undo the privacy of the release it describes: never publish "
        "or share it. The release is the file named in 'release'.",
        "release": str(release) if release is not None else None,
        **record,
    }
    text = json.dumps(doc, indent=2, sort_keys=False, default=str)
    write_text_atomic(path, text + "\n", mode=0o600)
    return path


#: Top-level fields of a ``privalign dpo`` manifest (``privalign.dpo/1``): public configuration (the route,
#: ε, δ, β, batch size, LoRA rank, clipping norm, the data path given on the command line and n, which the
#: replace-one relation keeps public), the privacy record (statement, event, calibrated σ, q, steps, the
#: accountants' ε) and versions. Never the seed (it drives randomized response, the Poisson samples and the
#: gradient noise), a hash of the pairs, or the training loss (an exact statistic of the private pairs).
DPO_MANIFEST_FIELDS = frozenset(
    {
        "format",
        "status",
        "created_at",
        "privacy",
        "data",
        "base_model",
        "algorithm",
        "config",
        "steps",
        "versions",
        "policy_dir",
        "release",
    }
)
_DPO_NESTED = {
    "data": frozenset({"path", "n_pairs", "n_users"}),  # n_pairs: not at user-level sample-DP (dpo.py)
    "config": frozenset(
        {
            "privacy",
            "epsilon",
            "delta",
            "beta",
            "learning_rate",
            "batch_size",
            "epochs",
            "max_length",
            "lora_rank",
            "clip_norm",
            "privacy_unit",
            "max_pairs_per_user",
            "optimizer",
            "weight_decay",
        }
    ),
    "privacy": frozenset(
        {
            "route",
            "statement",
            "privacy_event",
            "guarantee",
            "privacy_unit",
            "relation",
            "flip_rate",
            "accounting",
            "max_pairs_per_user",
            "per_label_epsilon",
        }
    ),
}


def check_dpo_manifest(doc: Mapping[str, Any]) -> None:
    """Refuse a ``privalign dpo`` manifest holding a field outside :data:`DPO_MANIFEST_FIELDS` (and the
    allow-lists of its ``data``, ``config`` and ``privacy`` parts).

    Raises:
      ReleaseBoundaryError: naming the first offending field.
    """
    for k in doc:
        if k not in DPO_MANIFEST_FIELDS:
            raise _refuse(k)
    for part, allowed in _DPO_NESTED.items():
        sub = doc.get(part)
        if isinstance(sub, Mapping):
            for k in sub:
                if k not in allowed:
                    raise _refuse(f"{part}.{k}")
