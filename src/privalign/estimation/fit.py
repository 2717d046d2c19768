"""Fit a reward model on preference pairs, as ``privalign fit-reward`` does, from Python.

:func:`fit_reward_model` (a linear BTL reward over a public feature map) and
:func:`fit_transformer_reward_model` (:class:`~privalign.estimation.transformer.DPTransformerRM`) load the
pairs, split them 80/20 without looking at what the privacy unit protects (by row position for the sample-DP
methods, whose unit includes the prompt; by prompt otherwise; the split seed is public), fit on the training
side, optionally tune on a validation split of the training prompts, and score the held-out pairs. They return
a :class:`RewardFit`:

* :meth:`RewardFit.save` writes the release: coefficients, privacy event, feature-map config and the public
  facts about the fit (:attr:`RewardFit.release`); never the noise seed, a hash of the data or an exact
  accuracy on private pairs (``docs/privacy/release.md``);
* :attr:`RewardFit.heldout_accuracy` is an exact statistic of the private test pairs: for the operator only;
* :meth:`RewardFit.write_audit_record` writes the operator-private audit record (mode 0600: the noise seed,
  the data file's SHA-256, the exact accuracies). Never publish it: it undoes the model's privacy.

The privacy noise comes from OS entropy unless ``seed`` is given; a seeded private fit is exactly as private
as the secrecy of its seed. A map built on a model (``privalign.models.features.EmbeddingFeatures``, MiniLM)
is passed in by the caller as ``features``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RewardFit",
    "data_sha256",
    "fit_reward_model",
    "fit_transformer_reward_model",
    "reward_estimator",
    "transformer_privacy",
]


def transformer_privacy(method: str) -> str | None:
    """The transformer reward model's privacy mode for ``method`` (what the dense estimators' events protect:
    ``dp-sgd`` → ``"sample"``, ``rr`` → ``"label"``, ``mle`` → ``"none"``, in any spelling); ``None`` for a
    method a transformer does not train with (the sparse IHT estimators, or an unknown name)."""
    import privalign.estimation.registry as registry

    if method not in registry.spellings() or registry.estimator_class(method).sparse:
        return None
    return registry.privacy_kind(method)


Progress = Callable[[str], None] | None


@dataclass
class RewardFit:
    """A fitted reward model with what may and may not be released about it.

    Attributes:
      estimator: the fitted estimator (a tuned fit's ``privacy_event_`` is the whole search's).
      feature_map: the public feature map the model scores with.
      release: the public metadata saved into the model (release-safe).
      summary: ``fit-reward``'s result: the public metadata, ``privacy_event``, ``feature_config`` and
        ``operator_only`` (the exact held-out accuracy: print it, never release it).
      heldout_accuracy: exact preference accuracy on the private held-out pairs (operator only).
      data: the ``data`` argument (``"hh-rlhf"``, ``"imdb"`` or a path).
    """

    estimator: Any
    feature_map: Any
    release: dict[str, Any]
    summary: dict[str, Any]
    heldout_accuracy: float
    data: str
    noise_seed: str = field(repr=False)  # operator-only: never released
    audit_extra: dict[str, Any] = field(default_factory=dict, repr=False)  # e.g. exact validation accuracies

    def save(self, path: str | os.PathLike) -> Path:
        """Write the release (the model file) atomically; returns its path."""
        from privalign.estimation.persistence import save_model

        return save_model(
            self.estimator, path, feature_config=self.feature_map.get_config(), metadata=self.release
        )

    def write_audit_record(
        self,
        path: str | os.PathLike,
        *,
        release: str | os.PathLike | None = None,
        command: str = "privalign fit-reward",
        arguments: dict[str, Any] | None = None,
    ) -> Path:
        """Write the operator-private audit record (mode 0600): the noise seed, the data file's SHA-256 and
        the exact held-out (and validation) accuracies; ``release`` is the model's path (refused as
        ``path``). Never publish it."""
        from privalign.release import write_audit_record

        record = {
            "noise_seed_entropy": self.noise_seed,
            "data_sha256": data_sha256(self.data),
            "heldout_accuracy": self.heldout_accuracy,
            **self.audit_extra,
            "command": command,
            "arguments": dict(arguments or {}),
        }
        return write_audit_record(path, record, release=release)


def data_sha256(data: str) -> str | None:
    """SHA-256 of the preference file, ``None`` for a shipped data set (audit record only: a hash of private
    data is never released)."""
    if data in ("hh-rlhf", "imdb") or not Path(data).is_file():
        return None
    h = hashlib.sha256()
    with open(data, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _say(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


def reward_estimator(
    method: str,
    *,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    sparsity: int = 32,
    step_size: float | None = None,
    n_iter: int | None = None,
    random_state: Any = None,
) -> Any:
    """The unfitted estimator of ``method`` with ``fit-reward``'s defaults (``step_size`` is DP-SGD's
    ``learning_rate``); building it checks the parameters before any data is loaded."""
    from privalign.estimation.rates import make_estimator
    from privalign.estimation.registry import estimator_class

    overrides: dict[str, Any] = {}
    if step_size is not None:
        overrides[estimator_class(method).step_param] = step_size
    if n_iter is not None:
        overrides["n_iter"] = n_iter
    return make_estimator(
        method, epsilon=epsilon, delta=delta, sparsity=sparsity, random_state=random_state, **overrides
    )


def _split_facts(unit: str, test_size: float, split_seed: int) -> dict[str, Any]:
    return {
        "rule": {"sample": "by row position", "user": "by user"}.get(unit, "by prompt"),
        "test_size": test_size,
        "seed": split_seed,
    }


def fit_reward_model(
    data: str,
    *,
    method: str,
    features: Any = "ngram",
    n_features: int = 2**12,
    n_pairs: int | None = None,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    sparsity: int = 32,
    step_size: float | None = None,
    n_iter: int | None = None,
    test_size: float = 0.2,
    tune: bool = False,
    validation_fraction: float | None = None,
    seed: int | None = None,
    split_seed: int = 0,
    progress: Progress = None,
    privacy_unit: str = "record",
    max_pairs_per_user: int | None = None,
    user_field: str = "user",
) -> RewardFit:
    """Fit a (private) sparse linear BTL reward model on preference pairs, as ``privalign fit-reward``.

    Args:
      data: ``"hh-rlhf"``, ``"imdb"`` or a path to a ``.jsonl`` of ``{"prompt", "chosen", "rejected"}``.
      method: ``mle``, ``iht`` (not private), ``dp-iht``, ``dp-sgd`` (sample-DP ε, δ), ``rr-iht``, ``rr``
        (label-DP ε; features public).
      features: ``"ngram"`` (hashed n-grams, ``n_features`` columns) or a feature-map object (e.g.
        ``privalign.models.features.EmbeddingFeatures()``).
      n_pairs: use at most this many pairs.
      epsilon, delta, sparsity, step_size, n_iter: the estimator's (see :func:`reward_estimator`).
      test_size: fraction held out.
      tune: choose the hyper-parameters on ``validation_fraction`` (default 0.2) of the training prompts (the
        exponential mechanism on validation accuracy; the whole search, selection included, costs
        ``epsilon``/``delta``).
      seed: seed of the privacy noise (default: OS entropy); never written into the release.
      split_seed: public seed of the data order and the split (recorded in the release).
      progress: called with one line before the fit (e.g. ``print`` to stderr); ``None`` is silent.
      privacy_unit: ``"record"`` (the method's own unit: one pair or one label) or ``"user"``: every pair
        names its user in ``user_field`` (a JSONL file), each user keeps at most ``max_pairs_per_user`` = K
        pairs (the first K in file order, :func:`privalign.estimation.users.bound_contributions`), the split
        is by user, and all of a user's data together is private: for ``rr``, ``rr-iht`` all of their
        labels (randomized response at ε/K per label, ε-DP); for ``dp-sgd`` all of their pairs (users
        Poisson-sampled, each user's summed gradient clipped once, (ε, δ)-DP); for ``dp-iht`` all of their
        pairs (each user's pairs in one batch, Peeling at the per-user sensitivity, (ε, δ)-DP). With
        ``tune`` the search splits by user and scores each candidate by its accuracy averaged per user.
      max_pairs_per_user: K, required with ``privacy_unit="user"``.
      user_field: the JSONL field naming each pair's user.
    """
    from privalign.estimation.preferences import train_test_split
    from privalign.estimation.realdata import load_preference_data
    from privalign.estimation.registry import privacy_kind

    user_k = max_pairs_per_user if check_user_level(privacy_unit, method, max_pairs_per_user, tune) else None
    kind = privacy_kind(method)
    unit = "user" if user_k else kind
    # how a user is protected: "label" (randomized response at ε/K per label) or "sample" (all of the user's
    # pairs: DP-SGD over users, Sample-DP IHT with per-user sensitivity)
    route = kind if user_k else None
    k_user = int(user_k or 0)
    # The data loading and the split use split_seed, which is public; the noise seed is not.
    noise = np.random.SeedSequence(seed)
    est_seed, search_seed = noise.spawn(2)
    data_seed, split_ss = np.random.SeedSequence(split_seed).spawn(2)
    # Build the estimator first so that bad parameters fail before any data is loaded; at user level a
    # label-DP one runs at ε/K per label (user_level_label_fit restates its event for the user), a sample-DP
    # one at ε with max_pairs_per_user = K (it samples, clips or batches users).
    est = reward_estimator(
        method,
        epsilon=_per_label_epsilon(epsilon, k_user) if route == "label" else epsilon,
        delta=delta,
        sparsity=sparsity,
        step_size=step_size,
        n_iter=n_iter,
        random_state=np.random.default_rng(est_seed),
    )
    if route == "sample":
        est.set_params(max_pairs_per_user=user_k)
    pairs, fmap = load_preference_data(
        data,
        features=features,
        n_features=n_features,
        n_pairs=n_pairs,
        random_state=np.random.default_rng(data_seed),
        user_field=user_field if user_k else None,
    )
    if user_k:
        pairs = _bounded_by_user(pairs, user_k, data, user_field)
    train, test = train_test_split(
        pairs, unit=unit, test_size=test_size, random_state=np.random.default_rng(split_ss)
    )
    est.set_params(feature_bound=fmap.feature_bound)
    if "feature_norm_bound" in est.get_params():  # DP-SGD: the map's public ℓ2 bound caps the default C
        est.set_params(feature_norm_bound=getattr(fmap, "norm_bound", None))
    tuning = audit_tuning = None
    if tune:
        est, tuning, audit_tuning = _tune(
            est,
            train,
            method,
            unit,
            (epsilon, delta, sparsity, validation_fraction),
            search_seed,
            progress,
            user_k,
        )
    else:
        n_users = len(set(train.user_ids.tolist())) if user_k and train.user_ids is not None else 0
        if hasattr(est, "check_calibration"):  # DP-SGD: an ε it cannot reach, before "fitting"
            est.check_calibration(n_users if route == "sample" else train.n_samples)
        at = ""
        if user_k:
            per = f"ε/{user_k} per label" if route == "label" else f"{n_users} users, each one unit"
            at = f" at user level (≤ {user_k} pairs per user, {per})"
        _say(progress, f"fitting {type(est).__name__}{at} on {train.n_samples} pairs (d={train.n_features})")
        if route == "label":
            from privalign.estimation.users import user_level_label_fit

            user_level_label_fit(est, train.X, train.y, epsilon=epsilon, max_per_user=k_user)
        elif route == "sample":
            est.fit(train.X, train.y, users=train.user_ids)
        else:
            est.fit(train.X, train.y)
    release_extra: dict[str, Any] = {"tuning": tuning} if tuning is not None else {}
    if user_k:  # the per-user budget the file states (a label-DP estimator's own epsilon is ε/K per label)
        release_extra["max_pairs_per_user"] = user_k
        release_extra["user_level"] = (
            {"route": "label", "epsilon": float(epsilon), "per_label_epsilon": est.epsilon}
            if route == "label"
            else {"route": "sample", "epsilon": float(epsilon), "delta": float(delta), "counts": "users"}
        )
    sizes = (train.n_samples, test.n_samples, train.n_features)
    audit_extra: dict[str, Any] = {"tuning": audit_tuning}
    if route == "sample":
        # How many pairs a user gave is private here (the relation replaces all of a user's pairs, 1 to K of
        # them): the release counts users (public with the roster), the exact pair counts go to the audit
        # record only.
        assert train.user_ids is not None and test.user_ids is not None
        sizes = (len(set(train.user_ids.tolist())), len(set(test.user_ids.tolist())), train.n_features)
        audit_extra.update(n_train_pairs=train.n_samples, n_test_pairs=test.n_samples)
    return _reward_fit(
        est,
        fmap,
        fmap.get_config(),
        data=data,
        method=method,
        unit=unit,
        sizes=sizes,
        heldout_accuracy=float(est.score(test.X, test.y)),
        split=_split_facts(unit, test_size, split_seed),
        noise_seed=str(noise.entropy) if seed is None else str(seed),
        release_extra=release_extra,
        audit_extra=audit_extra,
    )


def check_user_level(privacy_unit: str, method: str, max_pairs_per_user: int | None, tune: bool) -> bool:
    """Whether the fit is user-level; refuses (naming the flag) what user-level fitting does not offer."""
    from privalign._validation import check_int
    from privalign.estimation.registry import short_name
    from privalign.estimation.users import user_level_methods

    if privacy_unit not in ("record", "user"):
        raise _refuse("--privacy-unit", "must be 'record' or 'user'", privacy_unit)
    if privacy_unit == "record":
        if max_pairs_per_user is not None:
            raise _refuse("--max-pairs-per-user", "is used only with --privacy-unit user", max_pairs_per_user)
        return False
    offered = user_level_methods()
    if short_name(method) not in offered:
        raise _refuse(
            "--privacy-unit",
            f"'user' is implemented for --method {', '.join(offered)}; --method {method} does not offer it",
            privacy_unit,
        )
    if max_pairs_per_user is None:
        raise _refuse("--max-pairs-per-user", "is required with --privacy-unit user (K ≥ 1)", None)
    try:
        check_int(max_pairs_per_user, "max_pairs_per_user", low=1)
    except Exception:
        raise _refuse("--max-pairs-per-user", "must be an integer ≥ 1", max_pairs_per_user) from None
    del tune  # --tune runs at user level too (the search splits, fits and scores by user)
    return True


def _per_label_epsilon(epsilon: float, k: int) -> float:
    """ε/K, refused (naming the flags) when it is not itself a valid ε; before anything is loaded."""
    from privalign.mechanisms.user_level import UserRandomizedResponse

    try:
        return UserRandomizedResponse(epsilon, max_contributions=k).per_label_epsilon
    except Exception as exc:
        raise _refuse(
            "--epsilon", f"divided by --max-pairs-per-user {k} gives an invalid per-label ε ({exc})", epsilon
        ) from None


def _bounded_by_user(pairs: Any, k: int, data: str, user_field: str) -> Any:
    """The pairs each user keeps (the first ``k`` of each:
    :func:`~privalign.estimation.users.bound_contributions`); refuses pairs without a user and data with fewer
    than two users."""
    from privalign.estimation.users import bound_contributions, check_users

    users = check_users(None if pairs.user_ids is None else list(pairs.user_ids), data, user_field)
    kept = pairs.subset(bound_contributions(users, k))
    if len(set(kept.user_ids.tolist())) < 2:
        raise _refuse("--data", "user-level fitting needs pairs from at least two users", data)
    return kept


def _reward_fit(
    est: Any,
    feature_map: Any,
    feature_config: dict[str, Any],
    *,
    data: str,
    method: str,
    unit: str,
    sizes: tuple[int, int, int],
    heldout_accuracy: float,
    split: dict[str, Any],
    noise_seed: str,
    release_extra: dict[str, Any] | None = None,
    summary_extra: dict[str, Any] | None = None,
    audit_extra: dict[str, Any] | None = None,
) -> RewardFit:
    """The :class:`RewardFit` of a fitted estimator: the release (public facts: method, estimator, privacy
    unit, ``sizes`` = (training pairs, test pairs, features), nonzeros, data, split, then
    ``release_extra``), and the command's summary (the release's public metadata, ``summary_extra``, the
    privacy event, the feature config and the operator-only exact held-out accuracy)."""
    from privalign.release import public_metadata

    n_train, n_test, n_features = sizes
    release: dict[str, Any] = {
        "method": method,
        "estimator": type(est).__name__,
        "privacy_unit": unit,
        "n_train": int(n_train),
        "n_test": int(n_test),
        "n_features": int(n_features),
        "nonzeros": int(np.count_nonzero(est.coef_)),
        "data": data,
        "split": split,
        **(release_extra or {}),
    }
    summary: dict[str, Any] = {
        **public_metadata(release),
        **(summary_extra or {}),
        "privacy_event": est.privacy_event_.to_dict(),
        "feature_config": feature_config,
        # exact statistics of the private test pairs: for the operator's terminal, never in the release
        "operator_only": {"heldout_accuracy": heldout_accuracy},
    }
    return RewardFit(
        estimator=est,
        feature_map=feature_map,
        release=release,
        summary=summary,
        heldout_accuracy=heldout_accuracy,
        data=data,
        noise_seed=noise_seed,
        audit_extra=dict(audit_extra or {}),
    )


def _tune(
    est: Any,
    train: Any,
    method: str,
    unit: str,
    budget: tuple[float, float, int, float | None],
    search_seed: np.random.SeedSequence,
    progress: Progress,
    user_k: int | None = None,
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The private grid search (``budget`` = ε, δ, s, validation fraction; at user level, ``user_k`` = K:
    split by user, candidates fitted at user level, validation accuracy averaged per user); returns the best
    estimator (carrying the whole search's privacy event), the public tuning facts and the exact validation
    accuracies (audit record only)."""
    from privalign.estimation.tuning import (
        PrivateGridSearch,
        default_param_grid,
        expand_grid,
        validation_groups,
    )

    epsilon, delta, sparsity, validation_fraction = budget
    private = unit != "none"
    grid = default_param_grid(method, sparsity=sparsity)
    search = PrivateGridSearch(
        est,
        grid,
        validation_fraction=0.2 if validation_fraction is None else validation_fraction,
        epsilon=epsilon if private else None,
        delta=delta,
        selection_epsilon=float("inf") if not private else 1.0,
        max_pairs_per_user=user_k,
        random_state=np.random.default_rng(search_seed),
    )
    at = f" at user level (≤ {user_k} pairs per user, split and scored by user)" if user_k else ""
    _say(
        progress,
        f"tuning {type(est).__name__}{at} over {len(expand_grid(search.param_grid))} candidates on "
        f"{train.n_samples} training pairs",
    )
    if user_k:
        search.fit(train.X, train.y, users=train.user_ids)
    else:
        search.fit(train.X, train.y, groups=validation_groups(est, train.prompt_ids))
    tuning = {
        "best_params": search.best_params_,
        "grid": grid,
        "n_candidates": len(search.candidates_),
        "n_fit": search.n_fit_,
        "n_validation": search.n_validation_,
        "selection": "exponential mechanism on validation accuracy" if private else "argmax (not private)",
        "privacy_budget": search.privacy_budget_,
    }
    best = search.best_estimator_
    # The released model's guarantee is the whole search's (candidates + selection), not the fit's alone.
    best.privacy_event_ = search.privacy_event_
    return best, tuning, {"candidates": search.candidates_}


def _refuse(flag: str, why: str, value: Any) -> Exception:
    from privalign.errors import PrivacyParameterError

    return PrivacyParameterError(f"argument {flag}: {why} (got {value!r})")


def _load_text_pairs(
    data: str, n_pairs: int | None, rng: np.random.Generator, user_field: str | None = None
) -> Any:
    from privalign.data.preferences_io import load_hh_rlhf_pairs, load_imdb_pairs, load_jsonl_pairs

    if data == "hh-rlhf":
        pairs = load_hh_rlhf_pairs(limit=n_pairs)
    elif data == "imdb":
        pairs = load_imdb_pairs(n_pairs, random_state=rng)
    else:
        pairs = load_jsonl_pairs(data, user_field=user_field)
        if n_pairs is not None:
            pairs = pairs.head(n_pairs)
    for i, (c, r) in enumerate(zip(pairs.chosen, pairs.rejected)):
        if c == r:
            raise _refuse(
                "--data",
                f"pair {i + 1} has identical chosen and rejected texts: a comparison must compare two "
                "different responses",
                data,
            )
    return pairs


def fit_transformer_reward_model(
    data: str,
    *,
    backbone: str,
    method: str,
    n_pairs: int | None = None,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    batch_size: int | None = None,
    epochs: float | None = None,
    top_layers: int | None = None,
    step_size: float | None = None,
    test_size: float = 0.2,
    seed: int | None = None,
    split_seed: int = 0,
    progress: Progress = None,
    privacy_unit: str = "record",
    max_pairs_per_user: int | None = None,
    user_field: str = "user",
) -> RewardFit:
    """Fit a transformer reward model (:class:`~privalign.estimation.transformer.DPTransformerRM`) on
    preference pairs, as ``privalign fit-reward --model BACKBONE``, with the same data, split rule, release
    and audit record as :func:`fit_reward_model`.

    Args:
      backbone: ``"minilm"`` or ``"tiny-random"``.
      method: ``dp-sgd`` (Opacus DP-SGD, sample-DP ε, δ), ``rr`` (RR labels and the debiased BT loss,
        label-DP ε) or ``mle`` (not private).
      batch_size: expected batch size (default 64, at most the number of training pairs).
      epochs, top_layers, step_size: passes over the data, upper layers trained, Adam's learning rate
        (``DPTransformerRM``'s defaults when ``None``).
      privacy_unit, max_pairs_per_user, user_field: ``"user"`` protects all of one user's data (each user
        keeps the first K = ``max_pairs_per_user`` pairs, the split is by user): ``rr`` randomizes each label
        at ε/K (ε-DP for the user's labels), ``dp-sgd`` is user-level DP-SGD (users Poisson-sampled,
        ``batch_size`` counting users, each user's summed gradient clipped once; (ε, δ)-DP for the user).
        ``mle`` refuses it.
      The others as :func:`fit_reward_model`.
    """
    from privalign.estimation.preferences import PreferenceData, train_test_split
    from privalign.estimation.transformer import DPTransformerRM

    privacy = transformer_privacy(method)
    if privacy is None:
        import privalign.estimation.registry as registry

        dense = [registry.short_name(n) for n in registry.names() if transformer_privacy(n) is not None]
        raise _refuse("--method", f"a transformer model trains with {', '.join(dense)}", method)
    user_k = max_pairs_per_user if check_user_level(privacy_unit, method, max_pairs_per_user, False) else None
    k_user = int(user_k or 0)
    per_label = _per_label_epsilon(epsilon, k_user) if user_k and privacy == "label" else None
    noise = np.random.SeedSequence(seed)  # never written into the release
    (est_seed,) = noise.spawn(1)
    data_seed, split_ss = np.random.SeedSequence(split_seed).spawn(2)
    data_rng = np.random.default_rng(data_seed)
    pairs = _load_text_pairs(data, n_pairs, data_rng, user_field if user_k else None)
    users: list[str] | None = None
    if user_k:  # the first K pairs of each user, before anything else (a rule reading no other user's data)
        from privalign.estimation.users import bound_contributions, check_users

        all_users = check_users(pairs.users, data, user_field)
        keep = bound_contributions(all_users, k_user).tolist()
        users = [all_users[i] for i in keep]
        pairs.prompts, pairs.chosen, pairs.rejected, pairs.prompt_ids = (
            [pairs.prompts[i] for i in keep],
            [pairs.chosen[i] for i in keep],
            [pairs.rejected[i] for i in keep],
            [pairs.prompt_ids[i] for i in keep],
        )
        if len(set(users)) < 2:
            raise _refuse("--data", "user-level fitting needs pairs from at least two users", data)
    unit = "user" if user_k else privacy
    n = len(pairs.chosen)
    # orientation by a fair, data-independent coin, as PreferenceData.from_text_pairs
    y = (data_rng.random(n) < 0.5).astype(np.float64)
    triples = [
        (k, r, c) if yi else (k, c, r) for k, c, r, yi in zip(pairs.prompts, pairs.chosen, pairs.rejected, y)
    ]
    rows = PreferenceData(
        X=np.arange(n, dtype=np.float64)[:, None],
        y=y,
        prompt_ids=np.asarray(pairs.prompt_ids, dtype=object),
        user_ids=None if users is None else np.asarray(users, dtype=object),
    )
    train, test = train_test_split(
        rows, unit=unit, test_size=test_size, random_state=np.random.default_rng(split_ss)
    )
    tr_idx = train.X[:, 0].astype(np.int64)
    te_idx = test.X[:, 0].astype(np.int64)
    user_sample = bool(user_k) and privacy == "sample"  # the schedule counts users
    tr_users = None if users is None else [users[i] for i in tr_idx]
    n_units = len(set(tr_users or ())) if user_sample else tr_idx.size
    what = "training users" if user_sample else "training pairs"
    batch_size = min(64, n_units) if batch_size is None and user_sample else batch_size
    batch_size = 64 if batch_size is None else batch_size
    if batch_size > n_units:
        raise _refuse(
            "--batch-size",
            f"must be at most the {n_units} {what} (a larger batch leaves no full step)",
            batch_size,
        )
    kw: dict[str, Any] = {
        "privacy": privacy,
        "backbone": backbone,
        "batch_size": batch_size,
        "random_state": np.random.default_rng(est_seed),
    }
    if privacy != "none":
        kw["epsilon"] = epsilon if per_label is None else per_label  # user-level label: ε/K per label
    if privacy == "sample":
        kw["delta"] = delta
    if user_sample:
        kw["max_pairs_per_user"] = user_k
    for param, value in (("epochs", epochs), ("top_layers", top_layers), ("learning_rate", step_size)):
        if value is not None:
            kw[param] = value
    est = DPTransformerRM(**kw)
    est.check_calibration(n_units)  # before "fitting" and before the backbone loads
    at = ""
    if user_k:
        per = f"ε/{user_k} per label" if privacy == "label" else f"{n_units} users, each one unit"
        at = f" at user level (≤ {user_k} pairs per user, {per})"
    _say(progress, f"fitting DPTransformerRM ({backbone}, privacy {privacy}){at} on {tr_idx.size} pairs")
    est.fit([triples[i] for i in tr_idx], train.y, **({"users": tr_users} if user_sample else {}))
    release_extra: dict[str, object] = {}
    sizes = (tr_idx.size, te_idx.size, est.n_features_in_)
    audit_extra: dict[str, object] = {}
    if user_k:
        from privalign.mechanisms.user_level import user_level_event

        release_extra["max_pairs_per_user"] = user_k
        if privacy == "label":  # each label at ε/K: a user's ≤ K labels together cost ε
            est.privacy_event_ = user_level_event(est.privacy_event_, k_user)
            release_extra["user_level"] = {
                "route": "label",
                "epsilon": float(epsilon),
                "per_label_epsilon": float(est.epsilon),
            }
        else:  # a user's number of pairs is private: the release counts users, the audit record pairs
            release_extra["user_level"] = {
                "route": "sample",
                "epsilon": float(epsilon),
                "delta": float(delta),
                "counts": "users",
            }
            assert users is not None
            sizes = (n_units, len({users[i] for i in te_idx}), est.n_features_in_)
            audit_extra.update(n_train_pairs=int(tr_idx.size), n_test_pairs=int(te_idx.size))
    fm = est.feature_map()
    return _reward_fit(
        est,
        fm,
        fm.describe_config(),
        data=data,
        method=method,
        unit=unit,
        sizes=sizes,
        heldout_accuracy=est.score_texts([triples[i] for i in te_idx], test.y, feature_map=fm),
        split=_split_facts(unit, test_size, split_seed),
        noise_seed=str(noise.entropy) if seed is None else str(seed),
        release_extra=release_extra,
        summary_extra={"model_kind": f"transformer ({backbone}, {est.top_layers} upper layer(s) trained)"},
        audit_extra=audit_extra,
    )
